"""Observability on the real Slurm testbed: a slowed rank is reported as a straggler by node and
rank; a hung rank is detected, its stacks are captured, the gang is killed and the run recovers.
"""

from __future__ import annotations

import json

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.testbed import Testbed
from tests.integration.helpers import (
    RunFactory,
    baseline_run,
    first_after,
    slurm_spec,
)

pytestmark = pytest.mark.slurm


def test_slowed_rank_is_reported_as_straggler_by_node_and_rank(testbed: Testbed) -> None:
    run = baseline_run(testbed)  # rank 3 sleeps 0.2 s in each step from step 5
    rec = run.wait({"SUCCEEDED"}, timeout=120)
    status = run.cli("status", run.name, "--json")
    assert status.returncode == 0, status.stderr
    incidents = json.loads(status.stdout)["incidents"]
    stragglers = [i for i in incidents if i.startswith("straggler:")]
    slow_node = rec.membership[1]  # ranks 2 and 3 run on the second node
    assert len(stragglers) == 1, incidents
    assert stragglers[0].startswith(f"straggler: node {slow_node} rank 3 score ")
    assert float(stragglers[0].rsplit(" ", 1)[1]) > 2.0


@pytest.mark.slow
def test_hung_rank_is_detected_dumped_killed_and_recovered(testbed: Testbed,
                                                           runs: RunFactory) -> None:
    run = runs.submit(slurm_spec(testbed, steps=40, every_steps=5), inject="hang@step=10,rank=1",
                      env={"HPCRUN_HANG_S": "10"})
    rec = run.wait({"SUCCEEDED"}, timeout=180)
    assert rec.step == 40 and rec.job_ids == (run.job_id,)
    hangs = [f for f in rec.faults if f.fault == "hang"]
    # every rank of the gang stops at step 10 (the others wait for rank 1 in a collective);
    # the collective sequence numbers name rank 1 and its node (the first), the only node a
    # quarantine would count
    assert hangs and {f.node for f in hangs} <= set(rec.membership), hangs
    assert all("no progress for" in f.detail for f in hangs)
    named = [f for f in hangs if f.signature.startswith("hang:culprit:")]
    assert named and all((f.rank, f.node) == (1, rec.membership[0]) for f in named), hangs
    assert rec.restarts + rec.requeues == 1  # one recovery, inside the allocation or by requeue
    stacks = run.run_dir / "diagnostics" / "g0001" / "stacks-rank-00001.txt"
    dumped = stacks.read_text()
    assert "hpcrun/runtime/faults.py" in dumped and "fire" in dumped, dumped[:2000]
    states = run.states()
    recovering = [e for s, e in states if s in ("RECOVERING", "REQUEUED")]
    resumed = first_after(states, "RUNNING", recovering[0].slot)
    commits = [e for e in run.valid(EntryKind.COMMIT) if e.slot < recovering[0].slot]
    assert resumed.payload["restored_step"] == max(int(e.payload["step"]) for e in commits)
    print(f"\nhang: {len(hangs)} hang fault(s); recovered by "
          f"{'restart' if rec.restarts else 'requeue'}; stacks {stacks.stat().st_size} bytes")
