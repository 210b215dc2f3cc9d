"""Silent data corruption on the local backend, through the real CLI: a bit flipped in one
rank's parameters is found by the replica agreement check within ``sdc.every_steps``, the replay
names that rank's node, which is quarantined, the run rolls back to the newest known-good
checkpoint and ends bitwise-identical to the same run without the fault."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcrun.checkpoint.retention import known_good
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from hpcrun.drill.ledger import check_ledger, effective, read_ledger
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.observe.events import read_events
from tests.integration.local_helpers import local_spec, submit, valid_entries

STEPS = 40
CHECK_EVERY = 15
FLIP_AT = 17  # after step 17: the checkpoint at 20 carries it, the check at 30 finds it


@pytest.mark.slow
def test_bit_flip_is_found_its_node_quarantined_and_the_run_ends_bitwise_identical(
        tmp_path: Path) -> None:
    spec = local_spec(steps=STEPS, every_steps=10, data={"contract": "bitwise"},
                      config={"ledger": True}, sdc={"every_steps": CHECK_EVERY})
    with ThreadPoolExecutor(2) as pool:
        ref_f = pool.submit(submit, tmp_path / "reference", spec)
        cut_f = pool.submit(submit, tmp_path / "flipped", spec, inject=f"sdc@step={FLIP_AT},rank=1")
        ref, cut = ref_f.result(), cut_f.result()

    ref_rec, cut_rec = read_record(ref), read_record(cut)
    assert (str(ref_rec.state), ref_rec.step) == ("SUCCEEDED", STEPS), ref_rec.state_info
    assert (str(cut_rec.state), cut_rec.step) == ("SUCCEEDED", STEPS), cut_rec.state_info
    # The reference run never suspected anything: no false positive.
    assert not [e for e in valid_entries(ref, "fault")]
    assert not [e for e in read_events(ref) if e.kind == "sdc_verdict"]

    # Found at the first check after the flip, on rank 1's node, which is quarantined.
    rank1_node = next(e.node for e in read_events(cut) if e.rank == 1)
    [sdc] = [e.payload for e in valid_entries(cut, "fault") if e.payload.get("fault") == "sdc"]
    assert sdc["node"] == rank1_node and sdc["rank"] == 1, sdc
    assert FLIP_AT < int(sdc["step"]) <= FLIP_AT + CHECK_EVERY, sdc
    found = [int(e.step) for e in read_events(cut) if e.kind == "sdc_verdict"]
    assert found and FLIP_AT < min(found) <= FLIP_AT + CHECK_EVERY, found
    assert rank1_node in cut_rec.quarantined

    # Rolled back to the newest known-good checkpoint: the one at step 10 (the check at 15
    # passed after its commit); nothing committed after the flip was trusted.
    entries = RunLog(cut).read()
    assert known_good(entries)
    restored = [e for e in read_events(cut) if e.kind == "restored"]
    assert [int(e.step) for e in restored] == [10, 10], restored  # one event per rank
    # each rank's restore reports where its time went, and every byte it read is in the split
    for e in restored:
        assert e.data["read_s"] > 0 and e.data["copy_s"] >= 0 and e.data["fault_s"] >= 0, e
        assert e.data["direct_bytes"] + e.data["buffered_bytes"] == e.data["bytes_read"] > 0, e

    # Final parameters, optimizer state, RNG streams and data cursor: byte for byte.
    a, b = load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut))
    assert a.step == b.step == STEPS and diff_states(a, b) == []
    ref_lines, cut_lines = read_ledger(ref), read_ledger(cut)
    assert ref_lines is not None and cut_lines is not None
    report = check_ledger(cut_lines[0], total_steps=STEPS, malformed=cut_lines[1],
                          reference=effective(ref_lines[0]))
    assert report.ok, report
