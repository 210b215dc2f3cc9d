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
from tests.integration.helpers import RunFactory, slurm_spec

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
    rec = run.wait({"SUCCEEDED"}, timeout=540)
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
