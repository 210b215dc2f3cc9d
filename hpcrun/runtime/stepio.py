"""An agent that must outlive a lost node stops depending on the job step's ``srun``.

The agents' step is launched by one ``srun`` on the job's first node. submitit runs it with
``--unbuffered``, so each agent's stdin, stdout and stderr are a terminal that ``slurmstepd``
relays to that ``srun``. Measured on the testbed: when the first node is lost, ``srun`` dies
with it, each surviving node's ``slurmstepd`` closes the terminal about 2 s later, and the
kernel's hangup (SIGHUP, default action: terminate) ended every surviving agent, and with it
its ranks, before any could take over supervision. In a run that survives node loss each agent
therefore, from its start:

- ignores SIGHUP (and says so once, in its own log);
- writes its stdout and stderr to ``<run_dir>/logs/<node>/agent.{out,err}`` instead of the
  terminal, so no write fails once the terminal is gone;
- reads nothing from stdin (``/dev/null``).

Ranks, warm workers and the drainer start in sessions of their own (no controlling terminal)
and write to their own files already.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

AGENT_OUT = "agent.out"
AGENT_ERR = "agent.err"


def outlive_step_terminal(logs_dir: Path, node: str) -> None:
    """Detach this agent's stdio from the step's terminal and ignore its hangup (see module).

    Irreversible by design: the terminal may be gone by the time the agent exits.
    """
    logs_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _redirect(0, os.devnull, os.O_RDONLY)
    for fd, name in ((1, AGENT_OUT), (2, AGENT_ERR)):
        _redirect(fd, str(logs_dir / name), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    said: list[bool] = []

    def hung_up(signum: int, frame: FrameType | None) -> None:
        if not said:
            said.append(True)
            print(f"hpcrun agent {node}: the job step's terminal hung up (its srun is gone, "
                  "with the job's first node); carrying on", file=sys.stderr, flush=True)

    signal.signal(signal.SIGHUP, hung_up)


def _redirect(fd: int, path: str, flags: int) -> None:
    target = os.open(path, flags, 0o640)
    try:
        os.dup2(target, fd)
    finally:
        os.close(target)


__all__ = ["AGENT_ERR", "AGENT_OUT", "outlive_step_terminal"]
