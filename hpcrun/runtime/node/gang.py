"""This node's rank processes: spawn, watch, signal, stop.

Only processes this agent started are ever signalled, by PID. Each rank runs in its own process
group so a stop reaches the rank and its helpers (data loader workers) and nothing else. A rank
is a warm process from the agent's :class:`~hpcrun.runtime.rank.warm.WarmPool` when one is ready
(interpreter and ``import torch`` already paid), else a fresh ``python -m
hpcrun.runtime.rank.worker``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from hpcrun.launch.signals import ignored_from_exec
from hpcrun.runtime.incarnation import Ending, RankExit
from hpcrun.runtime.rank.startup import HANDED_AT_ENV

if TYPE_CHECKING:
    from hpcrun.runtime.rank.warm import WarmPool


def read_exit_report(path: Path) -> dict[str, Any]:
    """A rank's exit report, validated; {} when absent or malformed (untrusted input)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


class RankGang(Protocol):
    """What an agent does with its node's ranks: :class:`Gang` (ranks it forks) or
    :class:`~hpcrun.runtime.node.mpigang.AdoptedGang` (ranks an MPI launcher started)."""

    ranks: list[int]
    exits: dict[int, RankExit]

    def start(self) -> None: ...

    def poll(self) -> list[RankExit]: ...

    @property
    def pending(self) -> list[int]: ...

    @property
    def live_ranks(self) -> list[int]: ...

    @property
    def pids(self) -> list[int]: ...

    def signal(self, signum: int) -> None: ...

    def kill(self, *, grace_s: float = 5.0) -> None: ...

    def close(self) -> None: ...


class Gang:
    """The K rank processes of this node for one incarnation."""

    def __init__(self, *, ranks: list[int], env_for: Any, log_dir: Path,
                 exit_report_for: Any, python: str = sys.executable,
                 cwd: str | None = None, preempt_signal: int = signal.SIGUSR1,
                 warm: WarmPool | None = None, argv: Sequence[str] | None = None,
                 read_exit: Callable[[RankExit], RankExit] | None = None) -> None:
        """``argv``: a rank's command line (default ``python -m hpcrun.runtime.rank.worker``; a
        script run's own, :mod:`hpcrun.runtime.rank.script`); ``read_exit``: how an observed exit
        reads (a script's exit code means what :func:`~hpcrun.runtime.rank.script.script_exit`
        says)."""
        self.ranks = ranks
        self._env_for = env_for
        self._log_dir = log_dir
        self._exit_report_for = exit_report_for
        self._python = python
        self._cwd = cwd
        self._preempt_signal = preempt_signal
        self._warm = warm
        self._argv = (list(argv) if argv is not None
                      else [python, "-m", "hpcrun.runtime.rank.worker"])
        self._read_exit = read_exit
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []
        self.exits: dict[int, RankExit] = {}

    def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for slot, rank in enumerate(self.ranks):
            self._exit_report_for(rank).unlink(missing_ok=True)
            env, log = dict(self._env_for(rank)), self._log_dir / f"rank-{rank:05d}.out"
            env[HANDED_AT_ENV] = f"{time.time():.6f}"  # where the rank's start begins
            warm = self._warm.take(slot, env, log) if self._warm is not None else None
            self.procs[rank] = warm if warm is not None else self._spawn_cold(env, log)

    def _spawn_cold(self, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - closed by close()
        self._files.append(out)
        return subprocess.Popen(
            self._argv, env=env, stdout=out,
            stderr=subprocess.STDOUT, cwd=self._cwd, start_new_session=True,
            # a rank ignores the preemption signal until its handler is installed, so a relay
            # during interpreter start-up cannot kill it; the agent relays again until the
            # ranks have stopped
            preexec_fn=ignored_from_exec([self._preempt_signal]))

    def poll(self) -> list[RankExit]:
        """Ranks that ended since the last poll."""
        new = []
        for rank, proc in self.procs.items():
            if rank in self.exits or proc.poll() is None:
                continue
            ex = RankExit(rank=rank, returncode=proc.returncode,
                          report=read_exit_report(self._exit_report_for(rank)))
            if self._read_exit is not None:
                ex = self._read_exit(ex)
            self.exits[rank] = ex
            new.append(ex)
        return new

    @property
    def pending(self) -> list[int]:
        """Ranks whose end :meth:`poll` has not reported yet (running, or ended since the last
        poll): a gang is done only once every end was seen, and a failure's cause recorded."""
        return [r for r in self.procs if r not in self.exits]

    @property
    def live_ranks(self) -> list[int]:
        """Ranks whose process is still running."""
        return [r for r, p in self.procs.items() if p.poll() is None]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every running rank (its process only)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def kill(self, *, grace_s: float = 5.0) -> None:
        """SIGTERM each rank's process group, then SIGKILL what is left after ``grace_s``."""
        self._signal_groups(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.live_ranks and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_groups(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.poll()
        self.close()

    def _signal_groups(self, signum: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)  # the rank leads its own session

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files.clear()


def node_ending(exits: Iterable[RankExit]) -> Ending:
    """How a node's ranks ended, once they all exited: every one succeeded, every one succeeded
    or stopped for a preemption, or (anything else, none at all included) failed."""
    ended = list(exits)
    if ended and all(e.succeeded for e in ended):
        return Ending.SUCCEEDED
    if ended and all(e.succeeded or e.preempted for e in ended):
        return Ending.PREEMPTED
    return Ending.FAILED
