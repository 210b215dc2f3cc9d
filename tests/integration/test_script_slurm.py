"""Script mode on the Slurm testbed: examples/torchrun_ddp's plain DDP script, copied into a
project outside git, run unchanged on site ``testbed``, preempted by ``hpcrun signal`` and
resumed through its own ``torch.save`` file (the local-backend variant:
``test_script_local.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from hpcrun.testbed import Testbed
from hpcrun.testing.runs import run_dir_of, wait_for_state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_ddp"
STEPS = 300


def _sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr[-3000:]}"
    return done.stdout


def _rank_log(run_dir: Path, rank: int) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted(run_dir.glob(f"logs/*/rank-{rank:05d}.out")))


def test_a_plain_torchrun_script_on_slurm_is_preempted_and_resumes_itself(
        testbed: Testbed, job_dir: Path) -> None:
    project, runs = job_dir / "ddp", job_dir / "runs"
    project.mkdir(parents=True)
    shutil.copy(EXAMPLE / "train.py", project / "train.py")
    ckpt = job_dir / "ddp.pt"
    spec = yaml.safe_load((EXAMPLE / "run.yaml").read_text())
    spec.update(site="testbed", script="train.py",
                args=["--steps", str(STEPS), "--ckpt", str(ckpt), "--step-time", "0.1",
                      "--save-every", "100000"])
    (project / "run.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, **testbed.env, "HPCRUN_RUNS": str(runs),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run_dir = run_dir_of(runs, _sh(["hpcrun", "submit", "run.yaml"], project, env))
    wait_for_state(run_dir, ["RUNNING"], timeout=300)
    deadline = time.monotonic() + 300
    while "step 20 loss" not in _rank_log(run_dir, 0):
        assert time.monotonic() < deadline, f"no step 20 yet: {_rank_log(run_dir, 0)[-2000:]}"
        time.sleep(1)
    _sh(["hpcrun", "signal", run_dir.name], project, env)
    record = wait_for_state(run_dir, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=900)
    assert (str(record.state), record.requeues) == ("SUCCEEDED", 1)
    saved = [int(s) for s in re.findall(r"saved step (\d+) to", _rank_log(run_dir, 0))]
    assert 20 <= saved[0] < STEPS
    assert f"rank 1/2 starts at step {saved[0]}" in _rank_log(run_dir, 1)
    assert torch.load(ckpt, weights_only=True)["step"] == STEPS
    status = _sh(["hpcrun", "status", run_dir.name], project, env)
    assert "steps not reported by the script" in status and "step 0" not in status
