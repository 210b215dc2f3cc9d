"""Campaigns on the real Slurm testbed: a long run as segments under a 1-minute time limit.

Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.drill.contracts import check_contracts
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import DrillFault, row_for
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import RunFactory, TestbedRun, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SITE = Path(__file__).resolve().parents[2] / "site_configs" / "testbed.yaml"


def _short_lead_site(tmp_path: Path, runs: RunFactory) -> str:
    """The testbed site with a 30 s preemption lead: on a 1-minute limit the warning lands
    about 30 s into each allocation, leaving 20+ s to commit, drain and requeue."""
    (tmp_path / "testbed-short.yaml").write_text(
        SITE.read_text().replace("name: testbed", "name: testbed-short")
        .replace("preempt_lead_s: 60", "preempt_lead_s: 30"))
    runs.env["HPCRUN_SITE_CONFIGS"] = str(tmp_path)
    return "testbed-short"


def _timeline(run: TestbedRun) -> str:
    """The run's valid log in one line per entry that tells the story (for a failure)."""
    t0 = run.submitted_at
    keys = ("state", "step", "tier", "event", "fault", "reason", "restored_step", "job_id",
            "restart_count", "step_from", "step_to", "status")
    return "\n".join(f"{e.slot:4} +{e.ts - t0:7.1f}s g{e.generation} {e.kind:<9} "
                     + str({k: v for k, v in e.payload.items() if k in keys})
                     for e in run.entries()
                     if e.kind in ("state", "commit", "fault", "note", "job", "fence"))


def test_a_long_run_finishes_in_segments_past_its_requeue_budget(
        testbed: Testbed, runs: RunFactory, slurm: JobClient, tmp_path: Path) -> None:
    site = _short_lead_site(tmp_path, runs)
    # At most ~22 s of training per allocation at <= 5 steps/s (0.2 s pace): <= 110 steps, so
    # 450 steps need at least 5 allocations, 4 segments; one fault requeue is all it may use.
    spec = slurm_spec(testbed, tasks_per_node=1, steps=450, every_steps=10, site=site,
                      resources={"time_limit_min": 1}, budgets={"max_requeues": 1},
                      config={"ledger": True})
    run = runs.submit(spec, inject=";".join(
        f"slow@step=1,rank={r},seconds=0.2,every=1" for r in (0, 1)))
    try:
        rec = run.wait({"SUCCEEDED"}, timeout=540)
    except AssertionError:
        print(_timeline(run))
        raise
    assert rec.step == 450 and rec.segments >= 4 and rec.segments == rec.requeues
    assert rec.faults == (), [f.detail for f in rec.faults]
    assert rec.job_ids == (run.job_id,)  # one job, requeued by itself each time
    results = check_contracts(collect(run.run_dir, victim_rank=None),
                              row_for(DrillFault.PREEMPT_TIMELIMIT))
    print(f"\n{rec.segments} segments, {rec.wall_s:.0f} s allocated; "
          + "; ".join(f"{r.name} {r.mark}" for r in results))
    failed = [f"{r.name}: {r.detail}" for r in results if r.ok is False]
    assert not failed, f"drill contracts failed: {failed}"
    status = run.cli("status", run.name, "--no-reconcile")
    assert f"segments    {rec.segments} (no limit)" in status.stdout, status.stdout


# -- dependencies -------------------------------------------------------------------------------

def _started_at(run: TestbedRun) -> float:
    return min(e.ts for s, e in run.states() if s == "STARTING")


def _ended_at(run: TestbedRun, state: str) -> float:
    return min(e.ts for s, e in run.states() if s == state)


def test_a_dependent_run_starts_only_after_its_upstream_succeeded(
        testbed: Testbed, runs: RunFactory) -> None:
    train = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=30, every_steps=10),
                        inject="slow@step=1,rank=0,seconds=0.2,every=1", name="train.yaml")
    evaluate = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=10, every_steps=10),
                           name="eval.yaml", extra=["--after", f"{train.name}:ok"])
    up = train.wait({"SUCCEEDED"}, timeout=240)
    down = evaluate.wait({"SUCCEEDED"}, timeout=240)
    assert down.after == (f"{train.name}:ok",) and up.step == 30
    assert _started_at(evaluate) >= _ended_at(train, "SUCCEEDED")
    status = evaluate.cli("status", evaluate.name, "--no-reconcile")
    assert f"after       {train.name}:ok" in status.stdout, status.stdout


def test_a_dependent_run_of_a_failed_upstream_ends_cancelled_with_the_reason(
        testbed: Testbed, runs: RunFactory) -> None:
    failing = slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10,
                         retry={"max_attempts": {"process_crash": 0},
                                "in_allocation_restarts": 0})
    train = runs.submit(failing, inject="crash@step=5,rank=1,every=1", name="train.yaml")
    evaluate = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=10, every_steps=10),
                           name="eval.yaml", extra=["--after", train.name])
    train.wait({"FAILED"}, timeout=180)

    def cancelled() -> bool:
        evaluate.cli("status", evaluate.name, "--timeout", "20")  # a reconcile pass
        return str(evaluate.record().state) == "CANCELLED"

    evaluate.wait_for("the dependent run CANCELLED", cancelled, timeout=120)
    rec = evaluate.record()
    reason = str((rec.state_info or {}).get("reason"))
    assert reason.startswith("DependencyNeverSatisfied"), reason
    assert rec.step == 0 and not rec.checkpoints  # it never trained
