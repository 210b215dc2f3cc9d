"""The headline: a run interrupted 3 times by preemption and once by a node crash ends with
parameters bitwise-identical to the same run uninterrupted, and an identical sample ledger.

Both runs use the same layout (2 emulated nodes x 1 rank, DDP over gloo on CPU) and the
``bitwise`` contract. They run at the same time to keep the test inside the CI budget.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from hpcrun.drill.ledger import check_ledger, effective, read_ledger
from hpcrun.drill.rto import rto_splits
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.observe.events import read_events
from tests.integration.local_helpers import local_spec, submit, valid_entries

STEPS = 60
# Each preemption fires in the first incarnation of the requeue before it; the stop lands a few
# steps later (the signal is relayed), so the faults are spaced to keep their order.
FAULTS = ("preempt@step=8;preempt@step=20,restart=1;preempt@step=32,restart=2;"
          "nodecrash@step=52,rank=1,restart=3")


def test_interrupted_run_is_bitwise_identical_to_the_uninterrupted_one(tmp_path: Path) -> None:
    spec = local_spec(steps=STEPS, every_steps=10, data={"contract": "bitwise"},
                      config={"ledger": True})
    with ThreadPoolExecutor(2) as pool:
        ref_f = pool.submit(submit, tmp_path / "reference", spec)
        cut_f = pool.submit(submit, tmp_path / "interrupted", spec, inject=FAULTS)
        ref, cut = ref_f.result(), cut_f.result()

    ref_rec, cut_rec = read_record(ref), read_record(cut)
    assert (str(ref_rec.state), ref_rec.step) == ("SUCCEEDED", STEPS)
    assert (str(cut_rec.state), cut_rec.step) == ("SUCCEEDED", STEPS), cut_rec.state_info
    # The interruptions happened as scheduled: 3 preemptions (each committed progress, so each
    # is a segment, not a fault), then a node lost and requeued.
    faults = [str(e.payload.get("fault")) for e in valid_entries(cut, "fault")]
    assert [f for f in faults if f in ("preemption", "node_failure")] == ["node_failure"], faults
    assert cut_rec.segments == 3
    assert cut_rec.generation == 5 and cut_rec.requeues == 4
    splits = rto_splits(RunLog(cut).read(), list(read_events(cut)))
    assert [s.cause for s in splits] == ["preemption"] * 3 + ["node_failure"]
    assert all(s.steps_lost == 0 for s in splits[:3]) and splits[3].steps_lost > 0

    # Final parameters, optimizer state, RNG streams and data cursor: byte for byte.
    a, b = load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut))
    assert a.step == b.step == STEPS and len(a.ranks[0].tensors) > 0
    assert diff_states(a, b) == []

    # The ledger: every step consumed, each step the same samples as the uninterrupted run,
    # and the steps replayed after the node crash consumed what they consumed the first time.
    ref_lines, cut_lines = read_ledger(ref), read_ledger(cut)
    assert ref_lines is not None and cut_lines is not None
    reference = effective(ref_lines[0])
    report = check_ledger(cut_lines[0], total_steps=STEPS, malformed=cut_lines[1],
                          reference=reference)
    assert report.ok, report
    assert report.replayed_steps, "the node crash should have replayed steps"
    assert sorted(reference) == list(range(STEPS))


def test_a_preempted_2x2_run_is_bitwise_identical_to_the_uninterrupted_one(tmp_path: Path
                                                                           ) -> None:
    """4 ranks (2 nodes x 2): the layout where a fresh DDP's first step used to reduce with
    other buckets than the run that kept going (docs/recovery.md, "Bitwise resume and DDP
    buckets"); the tiny example wraps its model with ``hpcrun.integrations.ddp``."""
    spec = local_spec(steps=12, every_steps=1, tasks_per_node=2, data={"contract": "bitwise"})
    with ThreadPoolExecutor(2) as pool:
        ref_f = pool.submit(submit, tmp_path / "reference", spec)
        cut_f = pool.submit(submit, tmp_path / "interrupted", spec, inject="preempt@step=4")
        ref, cut = ref_f.result(), cut_f.result()
    cut_rec = read_record(cut)
    assert (str(cut_rec.state), cut_rec.step, cut_rec.segments) == ("SUCCEEDED", 12, 1)
    a, b = load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut))
    assert a.step == b.step == 12 and len(a.ranks) == 4 and len(a.ranks[0].tensors) > 0
    assert diff_states(a, b) == []
