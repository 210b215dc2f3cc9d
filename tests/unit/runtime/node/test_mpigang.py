"""An agent's watch of rank tasks it did not fork (``rank_launcher: pmix``): real processes
started here stand in for the pmix step's tasks, found by the pid file each leaves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrun.runtime.incarnation import EXIT_OK, EXIT_PREEMPTED, EXIT_STALE, EXIT_USER_ERROR
from hpcrun.runtime.node.mpigang import (
    AdoptedGang,
    exit_of,
    read_pid_file,
    write_rank_env,
)
from hpcrun.runtime.rank.mpitask import read_rank_env
from hpcrun.runtime.rank.startup import HANDED_AT_ENV

# A stand-in task: its command line names the task module, as the pmix step's tasks do; it
# leaves its pid, then its exit report (when told to), and exits with the given status.
TASK = """
import json, os, sys, time
pid_path, report_path, status, linger = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
open(pid_path + ".tmp", "w").write(json.dumps({"rank": int(sys.argv[5]), "pid": os.getpid()}))
os.replace(pid_path + ".tmp", pid_path)
time.sleep(linger)
if status != "none":
    open(report_path, "w").write(json.dumps({"rank": int(sys.argv[5]), "status": status}))
sys.exit({"succeeded": 0, "preempted": 75}.get(status, 1))
"""


class Tasks:
    """Starts stand-in tasks; kills any left at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def pid(self, rank: int) -> Path:
        return self.root / f"rank-{rank:05d}.pid"

    def report(self, rank: int) -> Path:
        return self.root / f"rank-{rank:05d}.json"

    def env(self, rank: int) -> Path:
        return self.root / "env" / f"rank-{rank:05d}.env.json"

    def start(self, rank: int, status: str, linger: float) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", TASK, str(self.pid(rank)),
                                 str(self.report(rank)), status, str(linger), str(rank),
                                 "hpcrun.runtime.rank.mpitask"], start_new_session=True)
        self.procs.append(proc)
        return proc

    def gang(self, ranks: list[int], *, start_wait_s: float = 30.0) -> AdoptedGang:
        return AdoptedGang(ranks=ranks, env_for=lambda r: {"HPCRUN_RANK": str(r)},
                           env_path_for=self.env, exit_report_for=self.report,
                           pid_path_for=self.pid, start_wait_s=start_wait_s)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def tasks(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = Tasks(tmp_path)
    yield t
    t.close()


def _wait_pids(tasks: Tasks, ranks: list[int]) -> None:
    deadline = time.monotonic() + 30
    while not all(tasks.pid(r).exists() for r in ranks):
        assert time.monotonic() < deadline, "the stand-in tasks never left their pids"
        time.sleep(0.02)


def _poll_until_done(gang: AdoptedGang, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while gang.pending:
        assert time.monotonic() < deadline, f"ranks {gang.pending} never ended"
        gang.poll()
        time.sleep(0.02)


def test_start_leaves_each_rank_its_planned_environment_private_and_readable(
        tasks: Tasks) -> None:
    gang = tasks.gang([2, 3])
    gang.start()
    for rank in (2, 3):
        path = tasks.env(rank)
        assert path.stat().st_mode & 0o777 == 0o600
        env = read_rank_env(path, rank=rank)
        assert env["HPCRUN_RANK"] == str(rank) and HANDED_AT_ENV in env
    gang.close()


def test_adopted_tasks_end_as_their_exit_reports_say(tasks: Tasks) -> None:
    gang = tasks.gang([0, 1])
    gang.start()
    assert gang.live_ranks == [0, 1] and gang.pids == []  # not started yet: still live
    tasks.start(0, "succeeded", 0.3)
    tasks.start(1, "preempted", 0.3)
    _wait_pids(tasks, [0, 1])
    gang.poll()
    assert sorted(gang.pids) == sorted(p.pid for p in tasks.procs)
    _poll_until_done(gang)
    assert {r: e.returncode for r, e in gang.exits.items()} == {0: EXIT_OK, 1: EXIT_PREEMPTED}
    assert gang.live_ranks == [] and gang.pids == []
    gang.close()


def test_a_task_killed_before_its_report_is_a_process_crash(tasks: Tasks) -> None:
    gang = tasks.gang([0])
    gang.start()
    proc = tasks.start(0, "succeeded", 60.0)
    _wait_pids(tasks, [0])
    gang.poll()
    gang.signal(signal.SIGKILL)  # by pidfd, to the adopted pid only
    proc.wait(timeout=10)
    _poll_until_done(gang)
    ex = gang.exits[0]
    assert ex.returncode < 0 and ex.fault == "process_crash" and not ex.report


def test_kill_ends_running_tasks_and_counts_never_started_ranks_as_killed(
        tasks: Tasks) -> None:
    gang = tasks.gang([0, 1])
    gang.start()
    proc = tasks.start(0, "succeeded", 60.0)
    _wait_pids(tasks, [0])
    gang.poll()
    gang.kill(grace_s=2.0)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert sorted(gang.exits) == [0, 1] and all(e.returncode < 0 for e in gang.exits.values())


def test_a_rank_whose_task_never_starts_is_lost_after_the_start_wait(tasks: Tasks) -> None:
    gang = tasks.gang([0], start_wait_s=0.2)
    gang.start()
    assert gang.poll() == []
    time.sleep(0.3)
    (ex,) = gang.poll()
    assert ex.fault == "process_crash" and "no task for this rank started" in ex.report["detail"]


def test_a_pid_file_naming_another_process_is_never_adopted(tasks: Tasks) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tasks.pid(0).write_text(json.dumps({"rank": 0, "pid": bystander.pid}))
        gang = tasks.gang([0])
        gang.poll()
        gang.signal(signal.SIGKILL)
        assert gang.pids == [] and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"rank": 1, "pid": 5}',
                                  '{"rank": 0, "pid": 1}', '{"rank": 0, "pid": true}',
                                  '{"rank": 0, "pid": "5"}'])
def test_a_malformed_pid_file_is_no_pid(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p"
    path.write_text(text)
    assert read_pid_file(path, 0) is None


@pytest.mark.parametrize(("report", "code"), [
    ({"status": "succeeded"}, EXIT_OK), ({"status": "preempted"}, EXIT_PREEMPTED),
    ({"status": "failed", "fault": "stale"}, EXIT_STALE),
    ({"status": "failed", "fault": "data_error"}, EXIT_USER_ERROR),
    ({}, -signal.SIGKILL), ({"status": "odd"}, -signal.SIGKILL)])
def test_exit_of_reads_the_report(report: dict[str, str], code: int) -> None:
    assert exit_of(3, report).returncode == code


def test_write_rank_env_replaces_a_previous_plan_whole(tmp_path: Path) -> None:
    path = tmp_path / "a" / "rank-00001.env.json"
    write_rank_env(path, 1, {"HPCRUN_RANK": "1", "X": "old"})
    write_rank_env(path, 1, {"HPCRUN_RANK": "1", "X": "new"})
    assert read_rank_env(path, rank=1)["X"] == "new"
    assert [p.name for p in path.parent.iterdir()] == [path.name]
