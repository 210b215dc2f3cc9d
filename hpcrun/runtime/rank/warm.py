"""Warm rank processes: started and pre-imported before they are needed, handed an incarnation.

A restarted rank's critical path used to begin with an interpreter start and ``import torch``
(seconds on a loaded node). Each agent keeps one *warm* process per local rank
(:class:`WarmPool`): ``python -m hpcrun.runtime.rank.warm`` imports torch and the worker, then
blocks on its stdin. When the gang starts, the agent writes one JSON line to it (the rank's
environment and its log file: values only, nothing pickled) and closes the pipe; the process
points its stdout/stderr at the rank's log, replaces its environment and runs
:func:`hpcrun.runtime.rank.worker.run` as a freshly spawned rank would. EOF without a line (the
agent discarded it) exits 0. The pool refills itself after each hand-off, so the next incarnation
finds its processes already warm; a hot spare's agent keeps its own. A refill imports torch beside
ranks that are training, so an agent keeps a pool only where each rank and each warm process has
a core of its own (:func:`warm_fits`; ``HPCRUN_WARM=1`` keeps one anyway, ``0`` never). When
the ranks run in an image (Charliecloud, Apptainer), the agent's ``argv`` starts each warm
process through the runtime, so the image's interpreter is the one that pre-imports.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrun.runtime.incarnation import Incarnation

WARM_ENV = "HPCRUN_WARM"
"""``0`` turns warm processes off (every rank is spawned cold), ``1`` on whatever the cores;
unset: on where :func:`warm_fits`."""
ENTRYPOINT_ENV = "HPCRUN_WARM_ENTRYPOINT"
"""The run's ``module:function`` (set by the agent): its module is imported while warm."""
CODE_PATH_ENV = "HPCRUN_CODE_PATH"
LET_GO_S = 1.0
"""How long :meth:`WarmPool.close` waits on EOF before it sends SIGTERM to a warm process."""


def warm_fits(*, ranks: int, cores: int) -> bool:
    """Whether ``cores`` (this agent's CPU affinity) leave one core for each of the ``ranks``
    that share them and one more for each rank's warm process (pure)."""
    return cores >= 2 * ranks


class WarmPool:
    """One pre-started, pre-imported process per local rank slot, refilled after each take."""

    def __init__(self, *, slots: int, env: Mapping[str, str], argv: Sequence[str],
                 log_dir: Path, cwd: str | None, preexec: Callable[[], object]) -> None:
        """``argv``: a warm process's command line (``python -m hpcrun.runtime.rank.warm``,
        started through the container's runtime when the ranks run in an image)."""
        self._slots, self._env, self._argv = slots, dict(env), list(argv)
        self._log_dir, self._cwd, self._preexec = log_dir, cwd, preexec
        self._ready: dict[int, subprocess.Popen[bytes]] = {}

    def fill(self) -> None:
        """Start a warm process for every empty slot (returns at once: they import alone)."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for slot in range(self._slots):
            proc = self._ready.get(slot)
            if proc is None or proc.poll() is not None:
                self._ready[slot] = self._spawn(slot)

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        out = open(self._log_dir / f"warm-{slot}.out", "ab")  # noqa: SIM115 - the child's
        try:
            return subprocess.Popen(
                self._argv, env=self._env,
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, cwd=self._cwd,
                start_new_session=True, preexec_fn=self._preexec)
        finally:
            out.close()

    def take(self, slot: int, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes] | None:
        """Hand the warm process of ``slot`` a rank's environment; None when it is not alive."""
        proc = self._ready.pop(slot, None)
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return None
        try:
            proc.stdin.write(handoff_line(env, log))
            proc.stdin.close()
        except OSError:
            return None
        return proc

    def close(self) -> None:
        """Let every unused warm process go: EOF on its stdin (read once its imports are done),
        then SIGTERM for one still importing (before a hand-off it exits 0 on either)."""
        procs = list(self._ready.values())
        self._ready.clear()
        for proc in procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=LET_GO_S)
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def handoff_line(env: Mapping[str, str], log: Path) -> bytes:
    """The one line an agent writes to a warm process: the rank's environment and log path."""
    return (json.dumps({"env": dict(env), "log": str(log)}, sort_keys=True) + "\n").encode()


def read_handoff(stream: IO[bytes]) -> tuple[dict[str, str], Path] | None:
    """The hand-off a warm process reads (None on EOF: the agent discarded it)."""
    line = stream.readline()
    if not line.strip():
        return None
    body: Any = json.loads(line)
    env = {str(k): str(v) for k, v in dict(body["env"]).items()}
    return env, Path(str(body["log"]))


def _preimport(environ: Mapping[str, str]) -> None:
    """What a rank would otherwise import on the critical path: torch, the worker, the
    checkpoint plane, and the user's entrypoint module (its import-time code runs here, before
    the rank's environment is known; ``HPCRUN_WARM=0`` opts out)."""
    import torch
    import torch.distributed

    import hpcrun.checkpoint.checkpointer
    import hpcrun.runtime.rank.context
    import hpcrun.runtime.rank.worker  # noqa: F401
    from hpcrun.launch.container import HOST_DIGEST_ENV, package_digest

    # The first optimizer built in a process imports torch's compiler stack (about 1 s of CPU,
    # measured): build a throwaway one here, off the critical path.
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    if HOST_DIGEST_ENV in environ:  # in an image: the rank compares its hpcrun with the agent's
        package_digest()
    preimport_entrypoint(environ.get(ENTRYPOINT_ENV, ""), environ.get(CODE_PATH_ENV) or None)


def preimport_entrypoint(entrypoint: str, code_path: str | None) -> bool:
    """Import the module of ``entrypoint`` now; whether it imported.

    A failure is left for the rank: it imports the entrypoint again and reports the error.
    """
    module = entrypoint.partition(":")[0]
    if not module:
        return False
    if code_path and code_path not in sys.path:
        sys.path.insert(0, code_path)
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def _redirect(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _let_go(signum: int, frame: object) -> None:
    os._exit(0)


def main() -> None:
    # Until a hand-off, SIGTERM is the agent letting an unused process go (it may still be
    # importing torch): exit 0, as on EOF.
    signal.signal(signal.SIGTERM, _let_go)
    _preimport(os.environ)
    handoff = read_handoff(sys.stdin.buffer)
    if handoff is None:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    env, log = handoff
    _redirect(log)
    os.environ.clear()
    os.environ.update(env)
    from hpcrun.runtime.rank.worker import main as worker_main

    worker_main()


def all_stepped(inc: Incarnation, ranks: list[int], since: float) -> bool:
    """Whether every rank of the gang beat a step since ``since`` (restore and first step
    done: warm processes may start importing without slowing them). Reads the ranks' own
    beat files (K small reads a poll, until it holds), not the node file published every 5 s:
    a crash soon after the start must find the pool refilled."""
    from hpcrun.observe.heartbeat import read_rank_beats

    beats = read_rank_beats(inc.heartbeat_dir())
    return all(r in beats and beats[r].ts >= since - 1 for r in ranks)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()

