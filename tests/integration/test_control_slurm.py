"""Control plane on the real Slurm testbed: reconcile after a job is cancelled behind hpcrun's
back or vanishes, requeue with a pushed begin time, quarantine of a failing node, and cancel
fencing a still-running worker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import EntryKind, RunLog, new_holder
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import (
    REPO_ROOT,
    RunFactory,
    TestbedRun,
    first_after,
    scontrol_job,
    slurm_spec,
    wait_until,
)

CRASH_AFTER_COMMIT = "crash@step=15,rank=1;slow@step=11,rank=0,seconds=0.4"
"""Rank 1 crashes at step 15; the steps after the step-10 save are paced (0.4 s) so its
asynchronous commit lands first, whatever the load, and the restore point is step 10."""

pytestmark = pytest.mark.slurm


def _reconcile(run: TestbedRun) -> dict[str, object]:
    """One ``hpcrun status --json`` (its reconcile pass); returns the reconcile summary."""
    status = run.cli("status", run.name, "--json")
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)["reconcile"]
    assert summary is not None and summary["ok"], summary
    return dict(summary)


def test_job_cancelled_behind_hpcruns_back_is_marked_cancelled(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    run = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=3000, every_steps=50))
    run.wait({"RUNNING"}, timeout=90)
    gone = slurm.run("scancel", run.job_id)
    assert gone.returncode == 0, gone.stderr
    wait_until("the job to end", lambda: slurm.state(int(run.job_id)) == "CANCELLED",
               timeout=60)
    before = run.record()
    assert str(before.state) in ("RUNNING", "PREEMPTED")  # the agents did not requeue it
    _reconcile(run)
    rec = run.record()
    assert str(rec.state) == "CANCELLED"
    assert f"job {run.job_id} was cancelled outside hpcrun" in str(rec.state_info)
    assert rec.job_ids == (run.job_id,)  # nothing resubmitted
    run.shown_manifest("CANCELLED")  # published by the pass that recorded the ending
    rec = run.record()
    _reconcile(run)  # a second pass finds nothing to do
    assert run.record().last_slot == rec.last_slot
    job = scontrol_job(slurm, run.job_id)
    assert job.get("JobState") == "CANCELLED" and job.get("Restarts") == "0"


@pytest.mark.slow
def test_vanished_job_is_resubmitted_from_the_job_script(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """A job neither squeue nor sacct knows (purged) while the record says RUNNING."""
    run = runs.sbatch(slurm_spec(testbed, tasks_per_node=1, steps=30, every_steps=10), slurm,
                      submit=False)
    log = RunLog(run.run_dir)
    lost = "9999990"
    log.append(EntryKind.JOB, generation=UNFENCED, holder="",
               payload={"job_id": lost, "backend": "slurm"})
    fence = log.claim(new_holder(f"job{lost}.r0.a0."))
    log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                payload={"state": "STARTING", "reason": "an incarnation of a job now purged"})
    log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                payload={"state": "RUNNING", "reason": "step 1 validated", "restored_step": 0})
    summary = _reconcile(run)
    rec = run.record()
    assert [f.fault for f in rec.faults] == ["unknown"]
    assert "job vanished from squeue and sacct" in rec.faults[0].detail, summary
    assert len(rec.job_ids) == 2 and rec.job_ids[0] == lost
    new_job = rec.job_ids[1]
    runs.runs.append(TestbedRun(run_dir=run.run_dir, job_id=new_job, env=run.env))
    assert scontrol_job(slurm, new_job).get("Comment", "").startswith("hpcrun:submit-")
    done = run.wait({"SUCCEEDED"}, timeout=150)
    assert done.step == 30 and done.job_ids[-1] == new_job and done.requeues == 1


def _slow_sbatch(job_dir: Path) -> str:
    """A directory holding an ``sbatch`` that takes 1.5 s before it runs the real one (a busy
    controller), to put ahead of the real one on PATH."""
    real = shutil.which("sbatch")
    assert real, "sbatch is not on PATH"
    shim = job_dir / "slow-bin"
    shim.mkdir()
    (shim / "sbatch").write_text(f"#!/bin/sh\nsleep 1.5\nexec {real} \"$@\"\n")
    (shim / "sbatch").chmod(0o755)
    return str(shim)


def _vanished_running_run(run: TestbedRun) -> None:
    """The run's record says RUNNING under a job that neither squeue nor sacct knows."""
    log = RunLog(run.run_dir)
    lost = "9999991"
    log.append(EntryKind.JOB, generation=UNFENCED, holder="",
               payload={"job_id": lost, "backend": "slurm"})
    fence = log.claim(new_holder(f"job{lost}.r0.a0."))
    for state in ("STARTING", "RUNNING"):
        log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                    payload={"state": state, "reason": "an incarnation of a job now purged"})


def _jobs_tagged_by(run: TestbedRun, slurm: JobClient) -> list[str]:
    """Slurm jobs whose comment names any submit operation in the run's log (void intents
    included): every job any pass submitted for the run."""
    ops = {f"hpcrun:{e.payload.get('op_id')}" for e in run.entries()
           if e.kind == EntryKind.OP and e.payload.get("action") == "submit"}
    out = slurm.run("squeue", "--noheader", "--states=all", "-o", "%i|%k").check().stdout
    return [line.split("|", 1)[0] for line in out.splitlines()
            if line.partition("|")[2].strip() in ops]


def test_overlapping_watch_passes_with_a_slow_sbatch_submit_one_job(
        testbed: Testbed, runs: RunFactory, slurm: JobClient, job_dir: Path) -> None:
    """Five `hpcrun watch` passes 0.4 s apart, each sbatch taking 1.5 s: one job, every time."""
    env = {**runs.env, "PATH": f"{_slow_sbatch(job_dir)}:{os.environ['PATH']}"}
    for round_no in range(4):
        run = runs.sbatch(slurm_spec(testbed, tasks_per_node=1, steps=3000, every_steps=50),
                          slurm, submit=False)
        _vanished_running_run(run)
        passes = []
        for _ in range(5):
            passes.append(subprocess.Popen(
                [sys.executable, "-m", "hpcrun.cli.main", "watch", run.name], env=env,
                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            time.sleep(0.4)
        said = [p.communicate(timeout=120)[0] for p in passes]
        jobs = _jobs_tagged_by(run, slurm)
        rec = run.record()
        new = [j for j in rec.job_ids if j != "9999991"]
        if jobs:
            slurm.run("scancel", *jobs)
        assert all(p.returncode == 0 for p in passes), said
        assert len(jobs) == 1 and new == jobs, (round_no, jobs, rec.job_ids, said)
        # REQUEUED, or already started again by the new job when the passes ended late
        assert len(rec.faults) == 1 and rec.state in ("REQUEUED", "STARTING", "RUNNING"), (
            rec.faults, rec.state)
        print(f"\nround {round_no}: one job {jobs[0]}; passes said: "
              + " | ".join(s.strip().split(", ", 1)[-1] for s in said))


@pytest.mark.slow
def test_requeue_backoff_pushes_the_begin_time(testbed: Testbed, runs: RunFactory,
                                               slurm: JobClient) -> None:
    spec = slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10,
                      retry={"backoff_base_s": 20, "backoff_cap_s": 60, "jitter": False,
                             "in_allocation_restarts": 0})
    run = runs.submit(spec, inject=CRASH_AFTER_COMMIT)
    requeued = run.wait_for("the requeue", lambda: _requeue_sent(run), timeout=120)
    job = wait_until("the job to be pending", lambda: _pending(slurm, run.job_id), timeout=30)
    begin = _epoch(job["StartTime"])
    assert job.get("Reason") == "BeginTime", job.get("Reason")
    assert begin >= int(requeued.ts) + 20 - 1, (job["StartTime"], requeued.ts)
    rec = run.wait({"SUCCEEDED"}, timeout=150)
    assert rec.step == 40 and rec.requeues == 1 and rec.job_ids == (run.job_id,)
    resumed = first_after(run.states(), "RUNNING", requeued.slot)
    assert resumed.ts >= requeued.ts + 20
    assert resumed.payload["restored_step"] == 10
    print(f"\nbackoff: requeued at {requeued.ts:.1f}, StartTime {job['StartTime']}, "
          f"resumed first step {resumed.ts - requeued.ts:.1f} s after the requeue")


@pytest.mark.slow
def test_quarantined_node_is_excluded_from_the_next_allocation(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    spec = slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10,
                      retry={"quarantine_after": 1, "in_allocation_restarts": 0,
                             "backoff_base_s": 1, "jitter": False})
    run = runs.submit(spec, inject="crash@step=15,rank=1")
    requeued = run.wait_for("the requeue", lambda: _requeue_sent(run), timeout=120)
    rec = run.record()
    bad = rec.faults[0].node
    assert bad is not None and rec.quarantined == (bad,)
    assert scontrol_job(slurm, run.job_id).get("ExcNodeList") == bad
    done = run.wait({"SUCCEEDED"}, timeout=150)
    allocations = [e.payload["nodes"] for e in run.valid(EntryKind.JOB) if "nodes" in e.payload]
    assert len(allocations) == 2 and bad in allocations[0] and bad not in allocations[1]
    assert done.step == 40 and done.requeues == 1
    assert bad in str(requeued.payload["detail"])


def test_cancel_fences_a_training_worker(testbed: Testbed, runs: RunFactory,
                                         slurm: JobClient) -> None:
    run = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=5000, every_steps=20))
    run.wait_for("training past step 20", lambda: run.record().step >= 20, timeout=90)
    cancelled = run.cli("cancel", run.name)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stderr
    at_cancel = run.record()
    fence = next(e for e in run.entries() if e.kind == EntryKind.FENCE
                 and e.holder.startswith("cancel-"))
    # the job ends CANCELLED, as the run did: the supervising agent, which sees the cancel's
    # fence before the scancel lands, keeps the job alive until it does
    wait_until("the job to end", lambda: slurm.state(int(run.job_id)) not in (
        "RUNNING", "PENDING", "COMPLETING"), timeout=60)
    assert slurm.state(int(run.job_id)) == "CANCELLED"
    time.sleep(2)  # let anything the old incarnation still had in flight land
    rec = run.record()
    assert str(rec.state) == "CANCELLED" and rec.generation == fence.generation
    assert rec.step == at_cancel.step  # no progress counted after the cancel
    assert all(c.slot < fence.slot for c in rec.checkpoints)
    old = fence.generation - 1
    late = [e for e in run.entries() if e.slot > fence.slot and e.generation == old]
    valid = {e.slot for e in run.valid()}
    assert not [e for e in late if e.slot in valid], "an entry of the fenced worker counted"
    assert scontrol_job(slurm, run.job_id).get("Restarts") == "0"
    assert run.shown_manifest("CANCELLED")["steps"] == at_cancel.step
    print(f"\ncancel at step {at_cancel.step}: {len(late)} void entries of generation {old} "
          f"after the cancel fence ({sorted({e.kind for e in late})})")


def _requeue_sent(run: TestbedRun) -> object:
    notes = [e for e in run.valid(EntryKind.NOTE) if e.payload.get("event") == "requeue_sent"]
    return notes[0] if notes else None


def _pending(slurm: JobClient, job_id: str) -> dict[str, str] | None:
    job = scontrol_job(slurm, job_id)
    return job if job.get("JobState") == "PENDING" else None


def _epoch(stamp: str) -> int:
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp())


@pytest.mark.slow
def test_the_scheduled_pass_resubmits_a_vanished_job_with_no_one_running_a_command(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """`hpcrun watch --install` schedules the pass (scrontab, or the self-renewing batch job
    where the Slurm client has no scrontab); the job vanishes behind hpcrun's back; Slurm runs
    the pass by itself within a minute or two and it resubmits the run."""
    run = runs.sbatch(slurm_spec(testbed, tasks_per_node=1, steps=20, every_steps=10), slurm,
                      submit=False)
    _vanished_running_run(run)
    installed = run.cli("watch", "--install", "--every", "1", "--scron-option=--partition=batch")
    try:
        assert installed.returncode == 0, installed.stderr
        if shutil.which("scrontab"):
            assert "installed in your scrontab" in installed.stdout, installed.stdout
        else:  # Debian's slurm-client has no scrontab: the self-renewing batch job
            assert "self-renewing batch job hpcrun-watch" in installed.stdout, installed.stdout
            queued = slurm.run("squeue", "--noheader", "--name=hpcrun-watch", "-o", "%i")
            assert queued.stdout.strip(), "the scheduled pass is not queued"
        rec = run.wait_for("the scheduled pass to resubmit the run", lambda: (
            r if len((r := run.record()).job_ids) == 2 else None), timeout=200)
        runs.runs.append(TestbedRun(run_dir=run.run_dir, job_id=rec.job_ids[1], env=run.env))
        assert scontrol_job(slurm, rec.job_ids[1]).get("Comment", "").startswith(
            "hpcrun:submit-")
        done = run.wait({"SUCCEEDED"}, timeout=150)
        assert done.step == 20 and done.job_ids[-1] == rec.job_ids[1]
    finally:
        removed = run.cli("watch", "--uninstall")
    assert "removed" in removed.stdout, removed.stdout + removed.stderr
    if shutil.which("scrontab"):
        assert "hpcrun.cli.main watch" not in slurm.run("scrontab", "-l").stdout
    else:
        pending = slurm.run("squeue", "--noheader", "--name=hpcrun-watch", "--states=PENDING",
                            "-o", "%i")
        assert not pending.stdout.strip(), "the scheduled pass is still queued"
