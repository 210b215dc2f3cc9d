"""Ranks started by Slurm's PMIx launcher (``srun --mpi=pmix``, one task per slot) on the real
testbed form hpcrun's process groups through mpi4py: rank, world size and rank 0's address from
``MPI.COMM_WORLD`` across two nodes; a run with ``dist.rank_launcher: pmix`` trains, is preempted,
requeued and succeeds with its ranks started that way."""

from __future__ import annotations

import json
import sys

import pytest

from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import REPO_ROOT, RunFactory, TestbedRun, first_after, slurm_spec

pytest.importorskip("mpi4py", reason="pip install 'hpcrun[mpi]' (mpi4py)")
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_srun_mpi_pmix_ranks_bootstrap_over_comm_world_on_two_nodes(slurm: JobClient) -> None:
    done = slurm.run("srun", "--mpi=pmix", "-N", "2", "--ntasks-per-node=1",
                     f"--chdir={REPO_ROOT}", "--export=ALL,OMP_NUM_THREADS=1",
                     sys.executable, "-m", "tests.integration.mpi_probe", timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in seen] == [0, 1]
    assert all((r["launcher"], r["world"], r["gathered"]) == ("mpi", 2, [0, 1]) for r in seen)
    assert seen[0]["host"] != seen[1]["host"]  # one rank per testbed node


def _pmix_run(runs: RunFactory, testbed: Testbed, steps: int) -> TestbedRun:
    """The tiny example on 2 nodes x 2 ranks whose ranks the pmix step starts, paced at 0.1 s a
    step so that a preemption reaches it mid-training."""
    return runs.submit(slurm_spec(testbed, steps=steps, every_steps=10,
                                  dist={"rank_launcher": "pmix"}, config={"ledger": True}),
                       inject="slow@step=1,rank=0,seconds=0.1,every=1")


def test_pmix_ranks_are_placed_by_mpi_and_a_preemption_requeues_the_run_to_success(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """``dist.rank_launcher: pmix``: every rank of every incarnation says it was placed by MPI;
    a preemption notice to the job's steps (the agents' and the ranks' own) stops the gang at a
    step boundary with a commit, the run is requeued once and ends SUCCEEDED at its last step."""
    run = _pmix_run(runs, testbed, 200)
    run.wait_for("training past step 20", lambda: run.record().step >= 20, timeout=150)
    sent = slurm.run("scancel", "--signal=USR1", run.job_id)
    assert sent.returncode == 0, sent.stderr
    rec = run.wait({"SUCCEEDED"}, timeout=300)
    assert rec.step == 200 and rec.requeues == 1 and rec.job_ids == (run.job_id,)
    assert [f.fault for f in rec.faults if f.fault != "preemption"] == [], rec.faults
    starts = run.rank_events("rank_start")
    by_generation: dict[int, list[int]] = {}
    for e in starts:
        by_generation.setdefault(int(e["generation"]), []).append(int(e["rank"]))
    assert len(by_generation) == 2 and all(sorted(r) == [0, 1, 2, 3]
                                           for r in by_generation.values()), by_generation
    assert {e["data"]["launcher"] for e in starts} == {"mpi"}, starts
    states = run.states()
    preempted = first_after(states, "PREEMPTED")  # the stop committed at a step boundary
    resumed = first_after(states, "RUNNING", preempted.slot)
    assert resumed.payload["restored_step"] >= 20


def test_a_crashed_pmix_rank_restarts_the_gang_as_a_new_step_inside_the_allocation(
        testbed: Testbed, runs: RunFactory) -> None:
    """Rank 1 crashes at step 25: its agent reads the crash from its exit report, the gang is
    restarted inside the allocation as a new pmix step, and the run succeeds on one job."""
    run = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10,
                                 dist={"rank_launcher": "pmix"}),
                      inject="crash@step=25,rank=1")
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    assert rec.step == 40 and (rec.restarts, rec.requeues) == (1, 0)
    assert rec.job_ids == (run.job_id,)
    crash = [f for f in rec.faults if f.fault == "process_crash"]
    assert len(crash) == 1 and crash[0].rank == 1 and crash[0].node == rec.membership[1]
    starts = run.rank_events("rank_start")
    assert len(starts) == 4 and {e["data"]["launcher"] for e in starts} == {"mpi"}, starts
    steps = sorted((run.run_dir / "logs").glob("*/mpi-step-*.out"))
    assert [p.name for p in steps] == ["mpi-step-g0001.a0.out", "mpi-step-g0002.a1.out"], steps
