"""Bitwise resume on the real Slurm testbed at 2 nodes x 2 ranks, where a gradient is a sum over
four ranks and the order of that sum could show: the tiny example with ``data.contract:
bitwise``, uninterrupted, against one run that goes through every resume path in turn (three
requeues after preemptions, a rank crash restarted inside the allocation, a node crash a hot
spare replaces). Every tensor of the final checkpoint is the same bits, and every step's samples
were the same.
"""

from __future__ import annotations

import pytest

from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.testbed import Testbed
from tests.integration.helpers import RunFactory, TestbedRun, crash_noted, paced, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 200
EVERY = 10
FAULTS = ("preempt@step=20;preempt@step=35,restart=1;preempt@step=50,restart=2;"
          "crash@step=65,rank=3,restart=3")
"""Requeued at 20, 35 and 50 (each in the job's next restart), then rank 3 killed at 65 and
restarted in the allocation; the node crash comes from outside, after step 85 (at 0.1 s a
step, ~11 s before the end)."""


def _spec(testbed: Testbed) -> dict[str, object]:
    return slurm_spec(testbed, steps=STEPS, every_steps=EVERY, tasks_per_node=2,
                      data={"contract": "bitwise"}, resources={"spare_nodes": 1},
                      config={"ledger": True})


def _ledger(run: TestbedRun) -> dict[int, object]:
    """Rank 0's samples per step; a step taken again after a restore took the same ones."""
    import json

    by_step: dict[int, list[object]] = {}
    for line in (run.run_dir / "ledger.jsonl").read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            by_step.setdefault(int(entry["step"]), []).append(entry["samples"])
    assert all(all(s == seen[0] for s in seen) for seen in by_step.values()), run.name
    return {step: seen[0] for step, seen in by_step.items()}


def test_every_resume_path_at_2x2_ranks_ends_with_the_uninterrupted_runs_bits(
        testbed: Testbed, runs: RunFactory) -> None:
    ref = runs.submit(_spec(testbed), inject=paced(0.02, 4), name="ref.yaml")
    ref_rec = ref.wait({"SUCCEEDED"}, timeout=300)
    cut = runs.submit(_spec(testbed), inject=f"{paced(0.1, 4)};{FAULTS}", name="cut.yaml")
    cut.wait_for("the rank crash restarted and training past step 85", lambda: (
        (rec := cut.record()).requeues == 3 and rec.restarts >= 1 and rec.step >= 85),
        timeout=600)
    victim = cut.record().membership[-1]  # never the batch host
    try:
        crash_noted(testbed, cut, victim, "node-loss-spare")
        rec = cut.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(victim)
    assert (ref_rec.requeues, ref_rec.restarts) == (0, 0)
    # three requeues (a stop with a commit is a segment, not a fault), the rank crash and the
    # swap restarted inside the last allocation
    assert (rec.requeues, rec.restarts, rec.step) == (3, 2, STEPS)
    assert rec.quarantined == (victim,)
    assert {f.fault for f in rec.faults} >= {"process_crash", "node_failure"}
    a = load_state(ref.run_dir, find_committed(ref.run_dir))
    b = load_state(cut.run_dir, find_committed(cut.run_dir))
    assert a.step == b.step == STEPS
    assert diff_states(a, b) == [], "the interrupted run's final checkpoint differs"
    expected = _ledger(ref)
    assert sorted(expected) == list(range(STEPS)) and _ledger(cut) == expected
