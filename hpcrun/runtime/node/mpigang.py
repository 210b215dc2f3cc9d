"""This node's ranks when an MPI launcher starts them (``rank_launcher: pmix``).

The supervising agent starts one gang-wide ``srun --mpi=pmix`` step per incarnation
(:class:`MpiStep`); every agent, the supervisor's included, plans its node's ranks as it would
fork them (the same environment, written 0600 where each task looks for it:
:func:`write_rank_env`) and watches them through an :class:`AdoptedGang`, which has the interface
of :class:`~hpcrun.runtime.node.gang.Gang`: ranks it did not fork, found by the pid each task leaves
(:func:`hpcrun.runtime.rank.mpitask.pid_path`), held by a pidfd (a recycled pid is never
signalled), and ended as their exit report says. Only those pids are ever signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hpcrun.launch.ranklaunch import MPITASK_MODULE
from hpcrun.runtime.incarnation import (
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STALE,
    EXIT_USER_ERROR,
    RankExit,
)
from hpcrun.runtime.node.gang import read_exit_report
from hpcrun.runtime.rank.startup import HANDED_AT_ENV

RANK_ENV_SCHEMA_VERSION = 1
STEP_END_WAIT_S = 10.0
"""How long the supervisor waits for its step to end by itself (its tasks gone) before it
signals ``srun``."""


def write_rank_env(path: Path, rank: int, env: Mapping[str, str]) -> None:
    """Leave ``rank``'s planned environment for its task: 0600 (it may hold tokens), whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    body = json.dumps({"schema_version": RANK_ENV_SCHEMA_VERSION, "rank": rank, "env": dict(env)},
                      sort_keys=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    os.replace(tmp, path)


def read_pid_file(path: Path, rank: int) -> int | None:
    """The pid a task left for ``rank`` (untrusted: a JSON object naming the rank); None when
    absent or not one."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("rank") != rank:
        return None
    pid = raw.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None


def exit_of(rank: int, report: Mapping[str, Any]) -> RankExit:
    """How a task that is gone ended, from its exit report (the worker always leaves one): no
    report means it was killed before it could."""
    status = report.get("status")
    if status == "succeeded":
        code = EXIT_OK
    elif status == "preempted":
        code = EXIT_PREEMPTED
    elif status == "failed":
        code = EXIT_STALE if report.get("fault") == "stale" else EXIT_USER_ERROR
    else:
        code = -signal.SIGKILL
    return RankExit(rank=rank, returncode=code, report=report if code >= 0 else {})


def is_task(pid: int, marker: str = MPITASK_MODULE) -> bool:
    """Whether ``pid`` runs a rank task (its command line names ``marker``)."""
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class MpiStep:
    """The supervisor's ``srun --mpi=pmix`` step of one incarnation."""

    def __init__(self, *, argv: Sequence[str], env: Mapping[str, str], log: Path,
                 cwd: str | None = None) -> None:
        self._argv, self._env, self._log, self._cwd = list(argv), dict(env), log, cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> None:
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self._log, "ab")  # noqa: SIM115 - closed by end()
        self._proc = subprocess.Popen(self._argv, env=self._env, stdout=self._out,
                                      stderr=subprocess.STDOUT, cwd=self._cwd,
                                      start_new_session=True)

    @property
    def ended(self) -> bool:
        return self._proc is not None and self._proc.poll() is not None

    def end(self, *, wait_s: float = STEP_END_WAIT_S) -> None:
        """Let the step end with its tasks; signal ``srun`` (which ends its tasks) when it
        does not within ``wait_s``."""
        proc = self._proc
        if proc is not None:
            for signum, wait in ((None, wait_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if signum is not None and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait)
                    break
        if self._out is not None:
            self._out.close()
            self._out = None


class AdoptedGang:
    """The K rank tasks of this node for one incarnation, started by the MPI step."""

    def __init__(self, *, ranks: list[int], env_for: Callable[[int], Mapping[str, str]],
                 env_path_for: Callable[[int], Path], exit_report_for: Callable[[int], Path],
                 pid_path_for: Callable[[int], Path], start_wait_s: float,
                 step: MpiStep | None = None) -> None:
        """``step``: the gang-wide step this agent starts and ends (the supervisor's only);
        ``start_wait_s``: how long a task may take to leave its pid before it counts as lost."""
        self.ranks = ranks
        self._env_for, self._env_path_for = env_for, env_path_for
        self._exit_report_for, self._pid_path_for = exit_report_for, pid_path_for
        self._start_wait_s = start_wait_s
        self._step = step
        self._started = 0.0
        self._fds: dict[int, int] = {}  # rank -> pidfd of its task
        self._pids: dict[int, int] = {}
        self.exits: dict[int, RankExit] = {}

    def start(self) -> None:
        for rank in self.ranks:
            self._exit_report_for(rank).unlink(missing_ok=True)
            self._pid_path_for(rank).unlink(missing_ok=True)
            env = {**self._env_for(rank), HANDED_AT_ENV: f"{time.time():.6f}"}
            write_rank_env(self._env_path_for(rank), rank, env)
        self._started = time.monotonic()
        if self._step is not None:
            self._step.start()

    def _adopt(self, rank: int) -> None:
        if rank in self._pids:
            return
        pid = read_pid_file(self._pid_path_for(rank), rank)
        if pid is None:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = -1  # already gone: its exit report says how it ended
        if fd >= 0 and not is_task(pid):
            os.close(fd)
            return  # not a rank task (a stale file, a recycled pid): never signalled
        self._pids[rank], self._fds[rank] = pid, fd

    def _alive(self, rank: int) -> bool:
        fd = self._fds.get(rank, -1)
        if fd < 0:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return not poller.poll(0)  # a pidfd turns readable when its process exits

    def _lost(self, rank: int) -> str | None:
        """Why a task that never left its pid will not come, or None while it still may."""
        if self._step is not None and self._step.ended:
            return "the pmix step ended before this rank's task started"
        if time.monotonic() - self._started > self._start_wait_s:
            return f"no task for this rank started within {self._start_wait_s:g} s"
        return None

    def poll(self) -> list[RankExit]:
        """Ranks that ended since the last poll."""
        new = []
        for rank in self.pending:
            self._adopt(rank)
            if rank in self._pids:
                if self._alive(rank):
                    continue
                ex = exit_of(rank, read_exit_report(self._exit_report_for(rank)))
            elif (why := self._lost(rank)) is not None:
                ex = RankExit(rank=rank, returncode=-signal.SIGKILL,
                              report={"fault": "process_crash", "detail": why})
            else:
                continue
            self.exits[rank] = ex
            new.append(ex)
        return new

    @property
    def pending(self) -> list[int]:
        """Ranks whose end :meth:`poll` has not reported yet."""
        return [r for r in self.ranks if r not in self.exits]

    @property
    def live_ranks(self) -> list[int]:
        """Ranks whose task is running or still starting."""
        return [r for r in self.ranks if r not in self.exits and
                (r not in self._pids or self._alive(r))]

    @property
    def pids(self) -> list[int]:
        return [self._pids[r] for r in self._pids if self._alive(r)]

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every running task (its process only)."""
        for rank, fd in self._fds.items():
            if self._alive(rank):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signum)

    def kill(self, *, grace_s: float = 5.0) -> None:
        """SIGTERM each task's process group, then SIGKILL what is left after ``grace_s``; a
        rank whose task never started ends as killed; the supervisor ends its step."""
        self._signal_groups(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(self._alive(r) for r in self._fds) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_groups(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(self._alive(r) for r in self._fds) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.poll()
        for rank in self.pending:
            self.exits[rank] = RankExit(rank=rank, returncode=-signal.SIGKILL)
        self.close()

    def _signal_groups(self, signum: int) -> None:
        for rank, fd in self._fds.items():
            if not self._alive(rank):
                continue
            pid = self._pids[rank]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:  # the task leads its own session: its helpers too
                    os.killpg(pid, signum)
                else:
                    signal.pidfd_send_signal(fd, signum)

    def close(self) -> None:
        if self._step is not None:
            self._step.end()
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds = {r: -1 for r in self._fds}
