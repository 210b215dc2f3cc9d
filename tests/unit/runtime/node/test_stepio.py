"""An agent of a run that survives node loss keeps its output when the step's I/O handler is
gone (the step's ``srun`` died with the job's first node): real pipes, real EPIPE."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = """
import pathlib, sys, time
from hpcrun.runtime.node.stepio import detach_stdio
tmp = pathlib.Path(sys.argv[1])
if sys.argv[2] == "detached":
    detach_stdio(tmp / "logs")
print("started", flush=True)
while not (tmp / "go").exists():
    time.sleep(0.02)
print("still here", flush=True)
print("on stderr", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("mode", ["plain", "detached"])
def test_an_agent_keeps_its_output_once_the_steps_io_handler_is_gone(
        tmp_path: Path, mode: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert child.stdin and child.stdout and child.stderr
    if mode == "plain":
        assert child.stdout.readline() == b"started\n"
    else:
        out, deadline = tmp_path / "logs" / "agent.out", time.monotonic() + 30
        while not (out.exists() and out.read_bytes()):
            assert time.monotonic() < deadline, "child did not start"
            time.sleep(0.02)
    for pipe in (child.stdin, child.stdout, child.stderr):  # the I/O handler exits
        pipe.close()
    (tmp_path / "go").touch()
    rc = child.wait(timeout=30)
    if mode == "plain":  # its next write fails: the output is lost and the process ends
        assert rc != 0
        return
    assert rc == 0
    logs = tmp_path / "logs"
    assert (logs / "agent.out").read_text() == "started\nstill here\n"
    assert (logs / "agent.err").read_text() == "on stderr\n"
