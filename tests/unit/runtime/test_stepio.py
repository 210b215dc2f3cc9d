"""An agent of a run that survives node loss outlives the hangup of its step's terminal (the
step's ``srun`` died with the job's first node): real pty, real SIGHUP."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

CHILD = """
import pathlib, sys, time
from hpcrun.runtime.stepio import outlive_step_terminal
tmp = pathlib.Path(sys.argv[1])
if sys.argv[2] == "detached":
    outlive_step_terminal(tmp / "logs", "node2")
(tmp / "ready").touch()
while not (tmp / "go").exists():
    time.sleep(0.02)
print("still here", flush=True)
print("on stderr", file=sys.stderr, flush=True)
"""


def _on_a_terminal(tmp_path: Path, mode: str) -> subprocess.Popen[bytes]:
    """A child whose stdio is a pty that is its controlling terminal (as under ``srun -u``)."""
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), mode], stdin=slave, stdout=slave,
        stderr=slave, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert child.poll() is None and time.monotonic() < deadline, "child did not start"
        time.sleep(0.02)
    os.close(master)  # the terminal hangs up: SIGHUP to its session leader
    time.sleep(0.3)
    (tmp_path / "go").touch()
    return child


@pytest.mark.parametrize("mode", ["plain", "detached"])
def test_an_agent_outlives_the_hangup_of_the_steps_terminal(tmp_path: Path, mode: str) -> None:
    rc = _on_a_terminal(tmp_path, mode).wait(timeout=30)
    if mode == "plain":  # what ended the surviving agents on the testbed
        assert rc == -signal.SIGHUP
        return
    assert rc == 0
    logs = tmp_path / "logs"
    assert (logs / "agent.out").read_text() == "still here\n"
    err = (logs / "agent.err").read_text().splitlines()
    assert err[-1] == "on stderr"
    assert err[0].startswith("hpcrun agent node2: the job step's terminal hung up")
