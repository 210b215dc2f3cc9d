"""Fault injections the drills rely on: later incarnations, checkpoint stages, node crash."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from hpcrun.errors import SpecError
from hpcrun.proctree import crash_process_tree, descendants
from hpcrun.runtime.faults import CKPT_STAGES, FaultKind, checkpoint_hook, due, parse_injections


def test_restart_n_fires_only_in_the_first_incarnation_of_that_restart() -> None:
    inj = parse_injections("preempt@step=12;preempt@step=25,restart=1;nodecrash@step=30,rank=3,"
                           "restart=2")
    fired = {(r, a, s): [i.kind for i in due(inj, rank=rank, step=s, restart=r, attempt=a)]
             for r in range(3) for a in range(2) for s in (12, 25, 30) for rank in (0, 3)
             if due(inj, rank=rank, step=s, restart=r, attempt=a)}
    assert fired == {(0, 0, 12): [FaultKind.PREEMPT], (1, 0, 25): [FaultKind.PREEMPT],
                     (2, 0, 30): [FaultKind.NODECRASH]}


def test_stage_is_required_exactly_for_ckptcrash() -> None:
    assert parse_injections("ckptcrash@step=3,rank=1,stage=shard_write")[0].stage == "shard_write"
    for bad in ("ckptcrash@step=3", "ckptcrash@step=3,stage=nowhere", "crash@step=3,stage=staging"):
        with pytest.raises(SpecError, match="KIND@step=N"):
            parse_injections(bad)


def test_checkpoint_stages_are_the_checkpoint_planes() -> None:
    from hpcrun.checkpoint.commit import FAULT_STAGES

    assert CKPT_STAGES == FAULT_STAGES


def test_checkpoint_hook_kills_only_at_its_stage_from_its_step() -> None:
    code = (
        "import sys\n"
        "from hpcrun.runtime.faults import checkpoint_hook, parse_injections\n"
        "inj = parse_injections('ckptcrash@step=5,rank=1,stage=shard_write')\n"
        "hook = checkpoint_hook(inj, rank=1, restart=0, attempt=0)\n"
        "step = int(sys.argv[1])\n"
        "hook('staging', step); print('alive', flush=True)\n"
        "hook('shard_write', step); print('survived')\n")
    early = subprocess.run([sys.executable, "-c", code, "4"], capture_output=True, text=True)
    late = subprocess.run([sys.executable, "-c", code, "5"], capture_output=True, text=True)
    assert early.returncode == 0 and "survived" in early.stdout
    assert late.returncode == -signal.SIGKILL and late.stdout == "alive\n"
    quiet = checkpoint_hook(parse_injections("ckptcrash@step=1,rank=1,stage=staging"), rank=0,
                            restart=0, attempt=0)
    quiet("staging", 9)  # another rank's injection: nothing happens here


def test_node_crash_kills_the_agent_and_every_process_it_started() -> None:
    """An 'agent' with two 'ranks' in their own sessions, each with a helper child."""
    rank = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "time.sleep(60)\n")
    agent = ("import subprocess, sys, time\n"
             f"for _ in range(2): subprocess.Popen([sys.executable, '-c', {rank!r}], "
             "start_new_session=True)\n"
             "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", agent])
    try:
        deadline = time.monotonic() + 20
        while len(descendants(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(proc.pid)
        assert len(tree) == 4
        crash_process_tree(proc.pid)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in tree)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
