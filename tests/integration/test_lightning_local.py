"""A Lightning Trainer (DDP over gloo, 2 nodes x 1 rank) under hpcrun on the local backend:
preempted mid-epoch and resumed, it ends with the uninterrupted run's weights, optimizer and
loop state, and status shows its steps and loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcrun.control.record import read_record
from tests.integration.local_helpers import REPO_ROOT, cli, states, submit, valid_entries

pytest.importorskip("lightning", reason="Lightning is not installed: "
                    "pip install 'lightning>=2.4,<2.7' (or pip install -e '.[lightning]')")

STEPS = 40
PREEMPT_AT = 13
"""Mid-epoch (an epoch is 32 steps), between the every_steps commits."""


def _spec(**config: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples/lightning/run.yaml").read_text())
    spec["config"] = {**spec["config"], "steps": STEPS, **config}
    spec["checkpoint"] = {**spec["checkpoint"], "every_steps": 10}
    return spec


def test_preempted_trainer_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = submit(tmp_path / "a", _spec())
    record = read_record(whole)
    assert (str(record.state), record.step) == ("SUCCEEDED", STEPS), record.state_info

    cut = submit(tmp_path / "b", _spec(), inject=f"preempt@step={PREEMPT_AT}")
    record = read_record(cut)
    assert (str(record.state), record.step, record.requeues) == ("SUCCEEDED", STEPS, 1)
    assert states(cut).count("PREEMPTED") == 1
    running = [e.payload for e in valid_entries(cut, "state") if e.payload["state"] == "RUNNING"]
    # the stop commit is at the boundary after the signal, not at a periodic commit
    assert running[1]["restored_step"] % 10 != 0 and running[1]["restored_step"] >= PREEMPT_AT

    # weights, momentum buffers, loop progress and the loader's position, all equal
    diff = cli(tmp_path, "ckpt", "diff", str(whole), str(cut))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "identical" in diff.stdout

    status = cli(tmp_path / "b", "status", cut.name, "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "SUCCEEDED"
    text = cli(tmp_path / "b", "status", cut.name).stdout
    assert f"step {STEPS}" in text and "loss" in text
