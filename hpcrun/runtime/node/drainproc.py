"""The lifecycle of a node's drain process, as its agent drives it: start, terminate, reap.

One drain of a node runs at a time: a start first waits for a drain told to stop earlier. After a
fault the agent terminates the drain without waiting for its round in flight (no final round
follows) and reaps it before the next one starts; otherwise it stops it and waits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrun.runtime.node.drainer import DrainTarget


class DrainProcess:
    """This agent's drain processes (``python -m hpcrun.runtime.node.drainer``)."""

    def __init__(self) -> None:
        self._stopping: subprocess.Popen[bytes] | None = None

    def start(self, target: DrainTarget | None, *, python: str,
              log_path: Path) -> subprocess.Popen[bytes] | None:
        """Start ``target``'s drain (None: this node has no tier 0, so no drain)."""
        self.reap()  # never two drains of this node at once
        if target is None:
            return None
        argv = target.argv(python, interval_s=2.0)
        out = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        try:
            # niced from its start: its imports must not slow the ranks starting beside it
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_lowest_cpu_priority)
        finally:
            out.close()

    def terminate(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Ask the drain to stop after its round in flight; :meth:`reap` waits."""
        if proc is not None and proc.poll() is None:
            proc.terminate()
            self._stopping = proc

    def reap(self) -> None:
        """Wait for a drain told to stop by :meth:`terminate` (if any)."""
        proc, self._stopping = self._stopping, None
        self.stop(proc)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes] | None) -> None:
        """Stop a drain and wait for it (killed after 30 s)."""
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _lowest_cpu_priority() -> None:
    """In a child before exec: nice 19 (the drain lowers the rest of its priority itself)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 19)
