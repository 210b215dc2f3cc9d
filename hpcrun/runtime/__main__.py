"""``python -m hpcrun.runtime --run-dir DIR``: one node's agent process (srun and the local
launcher start it so).

Slurm sends the preemption notice to the job step's tasks from the step's start, and a loaded
node can take seconds to import torch before the agent sets up its stop flag: with the default
action the notice would kill the agent and the job would end FAILED, never requeued. So the
first instructions hold the preemption signal and SIGTERM; the agent's stop flag takes over what
came (:func:`hpcrun.runtime.preemption.agent_stop_signals`).
"""

from __future__ import annotations

import os
import signal


def main() -> None:
    from hpcrun.launch.signals import hold_signals

    hold_signals([os.environ.get("HPCRUN_PREEMPT_SIGNAL") or "USR1", signal.SIGTERM])
    from hpcrun.runtime.agent import main as agent_main

    agent_main()


if __name__ == "__main__":
    main()
