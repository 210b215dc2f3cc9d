"""A writer SIGKILLed at every stage of the protocol never leaves a restorable mixture."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrun.checkpoint import FAULT_STAGES

from .conftest import same_state, trained

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("stage", FAULT_STAGES)
def test_sigkill_at_each_stage_restores_one_whole_checkpoint(run_dir, tmp_path, incarnation,
                                                             stage: str) -> None:
    local = tmp_path / "nvme"
    proc = subprocess.run([sys.executable, "-m", "tests.unit.checkpoint.crash_worker",
                           str(run_dir), str(local), stage], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    model, opt = trained(99)
    result = incarnation(node_local_root=local).restore({"model": model, "optim": opt})
    expect_step = 2 if stage == "after_commit" else 1
    assert result is not None and result.step == expect_step
    want_model, want_opt = trained(expect_step)
    assert same_state(model.state_dict(), want_model.state_dict())
    assert same_state(opt.state_dict(), want_opt.state_dict())
