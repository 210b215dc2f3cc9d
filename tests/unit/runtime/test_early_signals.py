"""A preemption notice that reaches an agent's process before its stop flag exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

_NOTICE_DURING_IMPORT = """
import os, signal
from hpcrun.launch.signals import StopFlag, hold_signals
{hold}
os.kill(os.getpid(), signal.SIGUSR1)  # the notice, before the slow imports
import hpcrun.runtime.agent
from hpcrun.runtime.preemption import agent_stop_signals
flag = StopFlag()
with agent_stop_signals(signal.SIGUSR1, flag):
    print(flag.reason, flush=True)
os.kill(os.getpid(), signal.SIGUSR1)  # a late one, while the agent exits
os.kill(os.getpid(), signal.SIGTERM)
print("exited cleanly", flush=True)
"""


def _run(hold: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _NOTICE_DURING_IMPORT.format(hold=hold)],
                          capture_output=True, text=True, timeout=120)


def test_a_notice_held_from_the_first_instruction_stops_the_agent_when_its_flag_starts() -> None:
    done = _run("hold_signals(['USR1', signal.SIGTERM])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["SIGUSR1", "exited cleanly"]


def test_without_the_hold_the_same_notice_kills_the_process() -> None:
    """What the hold prevents: SIGUSR1's default action ends the agent (the job ends FAILED)."""
    done = _run("")
    assert done.returncode == -signal.SIGUSR1 and done.stdout == ""


def test_the_agent_entry_starts_with_both_signals_held() -> None:
    """``python -m hpcrun.runtime`` (what srun and the local launcher start) holds the site's
    signal and SIGTERM by the time it hands over to the agent."""
    code = ("import runpy, signal\n"
            "import hpcrun.runtime.agent as agent\n"
            "from hpcrun.launch.signals import holding\n"
            "agent.main = lambda: print(holding(signal.SIGUSR2), holding(signal.SIGTERM))\n"
            "runpy.run_module('hpcrun.runtime', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HPCRUN_PREEMPT_SIGNAL": "USR2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
