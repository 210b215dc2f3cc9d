"""cancel_run: authority, fence first, idempotent retries, stale workers voided."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hpcrun.control.cancel import cancel_run
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.control.states import RunState
from hpcrun.errors import PermissionDeniedError, SchedulerError, StaleGenerationError
from hpcrun.runner import CommandResult
from hpcrun.scheduler.slurm import SlurmClient
from hpcrun.testing import FakeClock
from tests.unit.control.fake_cluster import FakeCluster, Job


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, FakeCluster]:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f", "cancel_authority": ["bob"]})
    run_dir = create_run(tmp_path, spec, run_id="t-1", owner="alice")
    log = RunLog(run_dir)
    cluster = FakeCluster()
    for job_id in ("101", "102"):
        log.append(EntryKind.JOB, generation=-1, holder="", payload={"job_id": job_id})
        cluster.jobs[job_id] = Job(state="RUNNING")
    fence = log.claim("agent-1")
    log.publish(EntryKind.STATE, generation=1, holder=fence.holder, payload={"state": "STARTING"})
    return run_dir, cluster


def test_cancel_fences_records_and_scancels(run: tuple[Path, FakeCluster]) -> None:
    run_dir, cluster = run
    result = cancel_run(run_dir, slurm=SlurmClient(cluster), user="alice", clock=FakeClock())
    assert result.state == RunState.CANCELLED and result.fenced_generation == 2
    assert result.cancelled_jobs == ("101", "102")
    assert {j.state for j in cluster.jobs.values()} == {"CANCELLED"}
    entries = RunLog(run_dir).read()
    fence_slot = next(e.slot for e in entries if e.kind == "fence" and e.generation == 2)
    first_scancel_intent = next(e.slot for e in entries if e.kind == "op")
    assert fence_slot < first_scancel_intent  # fence and CANCELLED before any scancel


def test_worker_progress_after_cancel_is_void(run: tuple[Path, FakeCluster]) -> None:
    run_dir, cluster = run
    published: list[int] = []
    stopped = threading.Event()
    started = threading.Event()

    def worker() -> None:
        log = RunLog(run_dir)
        step = 0
        try:
            while True:
                step += 1
                log.publish(EntryKind.PROGRESS, generation=1, holder="agent-1",
                            payload={"step": step, "tokens": step})
                published.append(step)
                started.set()
        except StaleGenerationError:
            stopped.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(10)
    cancel_run(run_dir, slurm=SlurmClient(cluster), user="bob")
    thread.join(20)
    assert stopped.is_set(), "the worker learned it was fenced out"
    record = read_record(run_dir)
    assert record.state == RunState.CANCELLED
    assert record.step == published[-1]  # nothing written after the fence counts


def test_cancel_twice_is_fine(run: tuple[Path, FakeCluster]) -> None:
    run_dir, cluster = run
    slurm = SlurmClient(cluster)
    cancel_run(run_dir, slurm=slurm, user="alice")
    again = cancel_run(run_dir, slurm=slurm, user="alice")
    assert again.state == RunState.CANCELLED and again.fenced_generation is None
    assert again.cancelled_jobs == () and cluster.count("scancel") == 2


def test_failed_scancel_is_retried_by_the_next_cancel(run: tuple[Path, FakeCluster]) -> None:
    run_dir, cluster = run
    real = cluster.run
    broken = {"102"}

    def flaky(argv, **kw):  # type: ignore[no-untyped-def]
        if argv[0] == "scancel" and argv[-1] in broken:
            return CommandResult(argv=tuple(argv), returncode=1, stdout="",
                                 stderr="scancel: error: Unable to contact slurm controller")
        return real(argv, **kw)

    cluster.run = flaky  # type: ignore[method-assign]
    with pytest.raises(SchedulerError, match="cancel` again"):
        cancel_run(run_dir, slurm=SlurmClient(cluster), user="alice")
    assert read_record(run_dir).state == RunState.CANCELLED
    broken.clear()
    result = cancel_run(run_dir, slurm=SlurmClient(cluster), user="alice")
    assert result.cancelled_jobs == ("102",)


def test_only_owner_and_cancel_authority_may_cancel(run: tuple[Path, FakeCluster]) -> None:
    run_dir, cluster = run
    with pytest.raises(PermissionDeniedError, match="'mallory' may not cancel"):
        cancel_run(run_dir, slurm=SlurmClient(cluster), user="mallory")
    assert read_record(run_dir).state == RunState.STARTING and cluster.count("scancel") == 0


def test_local_backend_jobs_are_not_scancelled(tmp_path: Path) -> None:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    run_dir = create_run(tmp_path, spec, run_id="t-1", owner="alice")
    RunLog(run_dir).append(EntryKind.JOB, generation=-1, holder="",
                           payload={"job_id": "local-4242", "backend": "local"})
    cluster = FakeCluster()
    result = cancel_run(run_dir, slurm=SlurmClient(cluster), user="alice")
    assert result.state == RunState.CANCELLED and cluster.calls == []
