"""The ``sdc`` row of the fault matrix on the real Slurm testbed: a bit flipped in one rank's
parameters is found within ``sdc.every_steps``, the rank's node is named and quarantined, the job
is requeued without it (the testbed has spare nodes), the run rolls back to the newest known-good
checkpoint and ends bitwise-identical to the same run without the fault."""

from __future__ import annotations

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import row_for
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.testbed import Testbed
from tests.integration.helpers import RunFactory, first_after, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS, EVERY, CHECK_EVERY, FLIP_AT = 40, 10, 15, 17
"""The checkpoint at 20 carries the flip, the check at 30 finds it; 10 is the known-good one."""
PACE = ";".join(f"slow@step=1,rank={r},seconds=0.2,every=1" for r in (0, 1))
"""Steps slow enough for the drain (every 2 s) to bring the known-good checkpoint to the shared
tier before the fault: its tier-0 copy on the quarantined node is out of reach afterwards."""


def test_sdc_is_found_its_node_quarantined_and_the_run_rolls_back_bitwise(
        testbed: Testbed, runs: RunFactory) -> None:
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=1, steps=STEPS, every_steps=EVERY,
                      data={"contract": "bitwise"}, config={"ledger": True},
                      sdc={"every_steps": CHECK_EVERY})
    ref = runs.submit(spec, inject=PACE)
    run = runs.submit(spec, inject=f"{PACE};sdc@step={FLIP_AT},rank=1")
    rec = run.wait({"SUCCEEDED"}, timeout=420)
    ref_rec = ref.wait({"SUCCEEDED"}, timeout=240)
    assert rec.step == ref_rec.step == STEPS

    story = "\n".join(f"{e.slot} g{e.generation} {e.kind} {dict(e.payload)}"[:240]
                      for e in run.valid() if e.kind in ("commit", "note", "fault", "state"))
    [fault] = [e.payload for e in run.valid(EntryKind.FAULT) if e.payload.get("fault") == "sdc"]
    assert fault["rank"] == 1 and FLIP_AT < int(fault["step"]) <= FLIP_AT + CHECK_EVERY, story
    found = [int(e["step"]) for e in run.rank_events("sdc_verdict")]
    assert found and FLIP_AT < min(found) <= FLIP_AT + CHECK_EVERY, (found, story)
    node = str(fault["node"])
    assert node in rec.quarantined
    [op] = [e.payload for e in run.valid(EntryKind.OP) if e.payload.get("action") == "requeue"]
    assert node in op["exclude"]
    # The requeued job ran on other nodes and restored the known-good checkpoint (step 10),
    # not the newer one committed after the flip (step 20).
    fences = [e for e in run.valid(EntryKind.FENCE)]
    resumed = first_after(run.states(), "RUNNING", fences[-1].slot)
    assert resumed.payload["restored_step"] == EVERY, story
    assert not [e for e in ref.valid(EntryKind.FAULT)]  # no false positive

    a, b = load_state(ref.run_dir, find_committed(ref.run_dir)), load_state(
        run.run_dir, find_committed(run.run_dir))
    assert diff_states(a, b) == []
    results = check_contracts(collect(run.run_dir, victim_rank=1), row_for("sdc"))
    failed = not_held(results, row_for("sdc"))
    assert not failed, f"drill contracts failed: {failed}"
