"""reconcile (pure) case by case, and execute/watch_once idempotence after a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrun.control.lease import lease_seconds
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.reconcile import (
    Cancel,
    MarkFailed,
    MarkState,
    ReconcilePolicy,
    ReconcileRequeue,
    RecordFault,
    Release,
    Submit,
    reconcile,
)
from hpcrun.control.record import RunRecord, create_run, read_record
from hpcrun.control.retry import FaultClass
from hpcrun.control.spec import RetryPolicy, RunSpec
from hpcrun.control.states import RunState
from hpcrun.control.watch import execute, script_submitter, watch_once
from hpcrun.errors import SchedulerError
from hpcrun.scheduler.slurm import Observation, SlurmClient, SlurmJobState
from hpcrun.testing import FakeClock
from tests.unit.control.fake_cluster import FakeCluster, Job

NOW = 1_700_000_000.0
POLICY = ReconcilePolicy(retry=RetryPolicy(jitter=False), max_requeues=5, hang_timeout_s=600)


def running(**kw: object) -> RunRecord:
    base: dict = {"run_id": "r", "spec_id": "s", "state": RunState.RUNNING, "generation": 1,
                  "holder": "a", "job_ids": ("101",), "step": 40}
    return RunRecord(**{**base, **kw})


def obs(state: SlurmJobState, **kw: object) -> Observation:
    base: dict = {"job_id": "101", "state": state, "source": "squeue"}
    return Observation(**{**base, **kw})


def kinds(actions: list) -> list[type]:
    return [type(a) for a in actions]


def test_vanished_job_while_running_is_resubmitted() -> None:
    actions = reconcile(running(), obs(SlurmJobState.VANISHED, source="none"), NOW, POLICY)
    assert kinds(actions) == [RecordFault, MarkState, Submit]
    assert actions[0].fault == FaultClass.UNKNOWN and actions[1].state == RunState.REQUEUED
    assert actions[2].delay_s == POLICY.retry.backoff_base_s  # first retry of its class


def test_stale_heartbeat_is_a_hang_requeued_on_the_same_job() -> None:
    actions = reconcile(running(), obs(SlurmJobState.RUNNING, heartbeat_age_s=900), NOW, POLICY)
    assert kinds(actions) == [RecordFault, MarkState, ReconcileRequeue]
    assert actions[0].fault == FaultClass.HANG and actions[2].job_id == "101"
    assert reconcile(running(), obs(SlurmJobState.RUNNING, heartbeat_age_s=5), NOW, POLICY) == []


def test_admin_hold_after_too_many_requeues_fails_the_run() -> None:
    held = obs(SlurmJobState.PENDING, reason="JobHeldAdmin")
    actions = reconcile(running(requeues=5), held, NOW, POLICY)
    assert kinds(actions) == [MarkFailed, Cancel] and "JobHeldAdmin" in actions[0].reason
    assert kinds(reconcile(running(requeues=1), held, NOW, POLICY)) == [Release]


def test_our_requeue_hold_is_released() -> None:
    held = obs(SlurmJobState.PENDING, reason="job requeued in held state")
    assert kinds(reconcile(running(), held, NOW, POLICY)) == [Release]


def test_preemption_with_slurm_requeue_is_never_requeued_twice() -> None:
    preempted = obs(SlurmJobState.PREEMPTED)
    assert reconcile(running(), preempted, NOW, POLICY) == []
    cancel_mode = ReconcilePolicy(retry=RetryPolicy(jitter=False), preempt_mode="cancel")
    actions = reconcile(running(), preempted, NOW, cancel_mode)
    assert kinds(actions) == [RecordFault, MarkState, Submit]
    assert actions[0].fault == FaultClass.PREEMPTION and actions[2].delay_s == 0


@pytest.mark.parametrize(("state", "exit_code", "signal", "fault", "delayed"), [
    (SlurmJobState.NODE_FAIL, 0, None, FaultClass.NODE_FAILURE, True),
    (SlurmJobState.TIMEOUT, 0, None, FaultClass.TIMEOUT, False),
    (SlurmJobState.OUT_OF_MEMORY, 0, 125, FaultClass.PROCESS_CRASH, True),
    (SlurmJobState.FAILED, 1, None, FaultClass.PROCESS_CRASH, True),
])
def test_ended_jobs_are_classified_and_resubmitted(state: SlurmJobState, exit_code: int,
                                                   signal: int | None, fault: FaultClass,
                                                   delayed: bool) -> None:
    actions = reconcile(running(), obs(state, exit_code=exit_code, signal=signal, source="sacct"),
                        NOW, POLICY)
    assert kinds(actions) == [RecordFault, MarkState, Submit]
    assert actions[0].fault == fault and (actions[2].delay_s > 0) == delayed
    assert actions[1].not_before == NOW + actions[2].delay_s


def test_user_error_fails_and_cancel_outside_is_recorded() -> None:
    actions = reconcile(running(), obs(SlurmJobState.FAILED, exit_code=2), NOW, POLICY)
    assert kinds(actions) == [RecordFault, MarkFailed]
    actions = reconcile(running(), obs(SlurmJobState.CANCELLED), NOW, POLICY)
    assert kinds(actions) == [MarkState] and actions[0].state == RunState.CANCELLED


def test_failed_job_with_a_lost_node_is_a_node_failure_once_slurm_notices() -> None:
    # a node that dies before slurmctld notices makes srun abort: the job ends FAILED, 137
    failed = {"exit_code": 137, "source": "squeue"}
    policy = ReconcilePolicy(retry=RetryPolicy(jitter=False), max_requeues=5, node_settle_s=18)
    assert reconcile(running(), obs(SlurmJobState.FAILED, ended_s_ago=5, **failed), NOW,
                     policy) == []  # too early to tell: wait for the next pass
    actions = reconcile(running(), obs(SlurmJobState.FAILED, ended_s_ago=5,
                                       down_nodes=("node4",), **failed), NOW, policy)
    assert kinds(actions) == [RecordFault, MarkState, Submit]
    assert actions[0].fault == FaultClass.NODE_FAILURE and "node4" in actions[0].detail
    late = reconcile(running(), obs(SlurmJobState.FAILED, ended_s_ago=30, **failed), NOW, policy)
    assert late[0].fault != FaultClass.NODE_FAILURE  # settled, every node up: the job's own


def test_terminal_run_with_a_live_job_cancels_it() -> None:
    done = running(state=RunState.FAILED)
    assert kinds(reconcile(done, obs(SlurmJobState.RUNNING), NOW, POLICY)) == [Cancel]
    assert reconcile(done, obs(SlurmJobState.COMPLETED), NOW, POLICY) == []


def test_requeued_run_whose_job_ended_is_resubmitted_after_not_before() -> None:
    rec = running(state=RunState.REQUEUED,
                  state_info={"not_before": NOW + 30, "exclude": ["n3"]})
    actions = reconcile(rec, obs(SlurmJobState.FAILED, source="sacct"), NOW, POLICY)
    assert kinds(actions) == [Submit]
    assert actions[0].delay_s == 30 and actions[0].exclude == ("n3",)
    assert reconcile(rec, obs(SlurmJobState.PENDING), NOW, POLICY) == []


def test_op_ids_are_deterministic() -> None:
    a = reconcile(running(), obs(SlurmJobState.VANISHED), NOW, POLICY)
    b = reconcile(running(), obs(SlurmJobState.VANISHED), NOW + 5, POLICY)
    assert [x.op_id for x in a] == [x.op_id for x in b]
    c = reconcile(running(generation=2), obs(SlurmJobState.VANISHED), NOW, POLICY)
    assert {x.op_id for x in a}.isdisjoint(x.op_id for x in c)


# ---------------------------------------------------------------- effectful passes


class Crash(BaseException):
    """A process dying mid-pass (not an error hpcrun handles)."""


def _heartbeat_at(run_dir: Path, ts: float) -> None:
    path = run_dir / "heartbeat" / "n1.json"
    path.write_text("{}")
    os.utime(path, (ts, ts))


@pytest.fixture
def live_run(tmp_path: Path) -> Path:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f",
                              "retry": {"jitter": False}})
    run_dir = create_run(tmp_path, spec, run_id="t-1")
    (run_dir / "job.sh").write_text("#!/bin/bash\nsrun hpcrun agent\n")
    log = RunLog(run_dir)
    log.append(EntryKind.JOB, generation=-1, holder="", payload={"job_id": "101"})
    fence = log.claim("agent-1")
    for state in ("STARTING", "RUNNING"):
        log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                    payload={"state": state})
    return run_dir


@pytest.mark.parametrize("crash_after_send", [True, False])
def test_rerun_after_crash_never_double_submits(live_run: Path, crash_after_send: bool) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    slurm = SlurmClient(cluster)

    def crashing(action: Submit, comment: str) -> str:
        if crash_after_send:
            script_submitter(live_run, slurm)(action, comment)
        raise Crash

    with pytest.raises(Crash):  # job 101 vanished: record fault, mark REQUEUED, submit... crash
        watch_once(live_run, slurm, clock, submitter=crashing)
    assert cluster.count("sbatch") == int(crash_after_send)
    waiting = watch_once(live_run, slurm, clock)  # the crashed pass's lease still holds
    assert waiting.actions == () and "of another pass holds the run" in waiting.summary()
    clock.advance(lease_seconds(slurm.timeout) + 1)
    result = watch_once(live_run, slurm, clock)
    assert cluster.count("sbatch") == 1, "exactly one job was ever submitted"
    record = read_record(live_run)
    assert record.state == RunState.REQUEUED and record.job_ids == ("101", "200")
    assert [o.status for o in result.outcomes] == ["done"]
    assert result.outcomes[0].detail["rebound"] is crash_after_send
    assert len(record.faults) == 1  # the fault was recorded once, not once per pass
    assert cluster.jobs["200"].fields["--begin"] == "now+10"
    # a third pass has nothing left to do
    assert watch_once(live_run, slurm, clock).actions == ()
    assert cluster.count("sbatch") == 1


def test_concurrent_pass_that_lost_the_intent_race_does_nothing(live_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    slurm = SlurmClient(cluster)
    first = watch_once(live_run, slurm, clock, dry_run=True)
    submit = first.actions[-1]
    RunLog(live_run).append(EntryKind.OP, generation=-1, holder="", payload={
        "op_id": submit.op_id, "action": "submit", "phase": "intent", "try": 0,
        "attempt": submit.attempt})  # another watcher got there first (and is still working)
    outcomes = execute(first.actions, log=RunLog(live_run), slurm=slurm, record=first.record,
                       submitter=lambda a, c: slurm.sbatch(live_run / "job.sh", []))
    assert outcomes[-1].status == "elsewhere" and cluster.count("sbatch") == 0


def test_hang_requeue_holds_updates_then_releases(live_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="RUNNING", nodes="n[1-2]")
    _heartbeat_at(live_run, NOW)
    clock.advance(3600)
    result = watch_once(live_run, SlurmClient(cluster), clock, hang_timeout_s=600)
    assert [type(a) for a in result.actions] == [RecordFault, MarkState, ReconcileRequeue]
    verbs = [c[1] for c in cluster.calls if c[0] == "scontrol"]
    assert verbs == ["requeuehold", "update", "release"]
    job = cluster.jobs["101"]
    assert job.fields["StartTime"] == "now+10" and job.comment.startswith("hpcrun:requeue-")
    record = read_record(live_run)
    assert record.state == RunState.REQUEUED and record.generation == 2  # the hung one is fenced
    assert record.holder.startswith("watch-")


def test_watch_asks_slurm_about_the_nodes_of_a_failed_job(live_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="FAILED", exit="137:0", nodes="n[1-2]")
    cluster.node_states = {"n1": "idle", "n2": "down*"}
    result = watch_once(live_run, SlurmClient(cluster), clock)
    assert result.observation is not None and result.observation.down_nodes == ("n2",)
    assert read_record(live_run).faults[-1].fault == FaultClass.NODE_FAILURE


def test_watch_waits_while_a_lost_node_may_not_be_flagged_yet(live_run: Path) -> None:
    import time

    cluster, clock = FakeCluster(), FakeClock(NOW)
    ended = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(NOW - 5))
    cluster.jobs["101"] = Job(state="FAILED", exit="137:0", nodes="n[1-2]",
                              fields={"EndTime": ended})
    result = watch_once(live_run, SlurmClient(cluster), clock)
    assert result.actions == () and read_record(live_run).faults == ()
    assert "ended FAILED 5 s ago" in result.summary() and "28 s" in result.summary()
    clock.advance(30)  # settled, every node still up: the job's own failure
    result = watch_once(live_run, SlurmClient(cluster), clock)
    assert read_record(live_run).faults[-1].fault != FaultClass.NODE_FAILURE


def test_refused_update_still_releases_and_says_why(live_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="RUNNING")
    cluster.refuse_update = True
    _heartbeat_at(live_run, NOW)
    clock.advance(3600)
    with pytest.raises(SchedulerError, match="restricts"):
        watch_once(live_run, SlurmClient(cluster), clock, hang_timeout_s=600)
    assert cluster.calls[-1][:2] == ("scontrol", "release")
    record = read_record(live_run)
    assert any(op.get("phase") == "failed" for op in record.ops.values())


def test_a_crash_the_controller_still_lists_is_recorded_with_saccts_exit(live_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="FAILED", exit="0:9", nodes="n[1-2]")
    watch_once(live_run, SlurmClient(cluster), clock)
    fault = read_record(live_run).faults[-1]
    assert "ended FAILED (exit 0, signal 9)" in fault.detail, fault.detail
    assert fault.signature == "slurm:FAILED:0:9" and fault.fault != FaultClass.UNKNOWN
