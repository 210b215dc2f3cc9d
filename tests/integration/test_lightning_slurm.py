"""A Lightning Trainer under hpcrun on the real Slurm testbed (2 nodes x 1 rank, DDP over gloo):
preempted by ``hpcrun signal`` mid-epoch, or one of its nodes powered off, requeued once, resumed,
and ended with the uninterrupted run's weights; Lightning never requeued the job itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import REPO_ROOT, RunFactory, paced, scontrol_job

pytest.importorskip("lightning", reason="pip install 'lightning>=2.4,<2.7'")
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 60


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples/lightning/run.yaml").read_text())
    spec.update(site="testbed", **overrides)
    spec["config"] = {**spec["config"], "steps": STEPS}
    return spec


def test_preempted_trainer_requeues_once_and_ends_with_the_uninterrupted_weights(
        testbed: Testbed, runs: RunFactory, slurm: JobClient, job_dir: Path) -> None:
    whole = runs.submit(_spec(name="lightning-whole"))
    assert whole.wait({"SUCCEEDED"}, timeout=300).step == STEPS
    cut = runs.submit(_spec(name="lightning-cut"), inject=paced(0.2, 2))
    cut.wait_for("training past step 10", lambda: cut.record().step >= 10, timeout=180)
    sent = cut.cli("signal", cut.name)
    assert sent.returncode == 0, sent.stderr
    record = cut.wait({"SUCCEEDED"}, timeout=400)
    assert (record.step, record.requeues) == (STEPS, 1)
    assert scontrol_job(slurm, cut.job_id).get("Restarts") == "1"  # hpcrun's requeue only
    diff = cut.cli("ckpt", "diff", str(whole.run_dir), str(cut.run_dir))
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_a_trainer_whose_node_crashes_resumes_from_the_shared_tier_with_the_same_weights(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """Power loss of the second node mid-epoch: Slurm requeues the job (NODE_FAIL), the Trainer
    resumes from the newest checkpoint on the shared tier and ends with the uninterrupted run's
    weights."""
    whole = runs.submit(_spec(name="lightning-whole"))
    assert whole.wait({"SUCCEEDED"}, timeout=300).step == STEPS
    cut = runs.submit(_spec(name="lightning-crash"), inject=paced(0.2, 2))
    cut.wait_for("a checkpoint on the shared tier and training past it", lambda: (
        (rec := cut.record()).step >= 25 and any(c.tier == "shared" for c in rec.checkpoints)),
        timeout=240)
    victim = cut.record().membership[1]  # never the batch host
    try:
        testbed.crash(victim)
        record = cut.wait({"SUCCEEDED"}, timeout=400)
    finally:
        testbed.boot(victim)
    assert (record.step, record.requeues) == (STEPS, 1)
    assert record.faults[0].fault == "node_failure" and victim in record.faults[0].detail
    diff = cut.cli("ckpt", "diff", str(whole.run_dir), str(cut.run_dir))
    assert diff.returncode == 0, diff.stdout + diff.stderr
