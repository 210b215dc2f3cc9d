"""An agent that must outlive a lost node stops depending on the job step's ``srun`` for its I/O.

The agents' step is launched by one ``srun`` on the job's first node, and each node's
``slurmstepd`` relays the agents' stdin, stdout and stderr through its I/O handler. Measured on
the testbed: when the job's first node is lost, ``srun`` dies with it and every surviving
node's I/O handler exits at once (``IO handler exited`` in slurmd's log). Nothing reads the
agents' stdout and stderr after that: a write fails (a closed pipe ends a Python process at its
next print) or blocks once the pipe's buffer is full, and a status line, a fault report or a
traceback is lost with it. In a run that survives node loss each agent therefore, from its
start:

- writes its stdout and stderr to ``<run_dir>/logs/<node>/agent.{out,err}`` (appended);
- reads nothing from stdin (``/dev/null``).

Ranks, warm workers and the drainer write to their own files already.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AGENT_OUT = "agent.out"
AGENT_ERR = "agent.err"


def detach_stdio(logs_dir: Path) -> None:
    """Point this process's stdin at ``/dev/null`` and its stdout and stderr at
    ``logs_dir/agent.{out,err}`` (see module).

    Irreversible by design: the step's pipes may be gone by the time the agent exits.
    """
    logs_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(0, os.devnull, os.O_RDONLY)
    for fd, name in ((1, AGENT_OUT), (2, AGENT_ERR)):
        _redirect(fd, str(logs_dir / name), os.O_WRONLY | os.O_CREAT | os.O_APPEND)


def _redirect(fd: int, path: str, flags: int) -> None:
    target = os.open(path, flags, 0o640)
    try:
        os.dup2(target, fd)
    finally:
        os.close(target)


__all__ = ["AGENT_ERR", "AGENT_OUT", "detach_stdio"]
