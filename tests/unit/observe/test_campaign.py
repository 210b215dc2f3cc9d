"""`hpcrun status` on a long run: segments, budgets used of the spec's, projected finish."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.control.entries import (
    CommitPayload,
    ProgressPayload,
    SegmentNote,
    StatePayload,
)
from hpcrun.control.log import RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.testing import FakeClock
from hpcrun.vocab import RunState, Tier

SPEC = {"name": "long", "entrypoint": "examples.tiny:main", "config": {"steps": 400},
        "resources": {"nodes": 2},
        "budgets": {"max_wall_hours": 1.0, "max_segments": 5}}


def long_run(root: Path) -> str:
    """Two segments of 20 min each, then a third allocation running for 15 min (step 300)."""
    clock = FakeClock(start=time.time() - 3 * 3600)
    run_dir = create_run(root, RunSpec.from_dict(SPEC), run_id="long-1", clock=clock)
    log = RunLog(run_dir, clock=clock)
    step = 0
    for n in range(3):
        fence = log.claim(f"job{n}")
        gen, holder = fence.generation, fence.holder
        log.publish_entry(StatePayload(state=RunState.STARTING), generation=gen, holder=holder)
        log.publish_entry(StatePayload(state=RunState.RUNNING), generation=gen, holder=holder)
        clock.advance(900.0)
        step += 100
        log.publish_entry(ProgressPayload(step=step), generation=gen, holder=holder)
        if n == 2:
            break
        clock.advance(300.0)
        log.publish_entry(CommitPayload(ckpt_id=f"c{step}", tier=Tier.SHARED, step=step,
                                        manifest=f"ckpt/c{step}/manifest.json"),
                          generation=gen, holder=holder)
        log.publish_entry(StatePayload(state=RunState.PREEMPTED), generation=gen, holder=holder)
        log.append_entry(SegmentNote(step_from=step - 100, step_to=step, reason="time limit"),
                         generation=gen, holder=holder)
        log.publish_entry(StatePayload(state=RunState.REQUEUED), generation=gen, holder=holder)
        clock.advance(1800.0)  # queue wait
    return str(run_dir)


def test_status_shows_segments_budgets_and_the_projected_finish(tmp_path: Path) -> None:
    run_dir = long_run(tmp_path)
    runner = CliRunner()
    out = runner.invoke(cli, ["status", run_dir, "--no-reconcile"])
    assert out.exit_code == 0, out.output
    assert "segments    2 of 5" in out.output
    # 20 + 20 min closed, the open allocation 15 min at its last entry and more by now
    wall = next(ln for ln in out.output.splitlines() if ln.startswith("wall "))
    used_h = float(wall.split()[1])
    # without a node-hour budget node-hours are shown once, with the run's figures
    assert used_h > 0.9 and "of 1" in wall and "node-hours" not in wall
    assert "projected for step 400 at the run's rate so far" in out.output
    assert "budget_burn" in out.output  # over 90% of the wall-hour budget is used
    body = json.loads(runner.invoke(cli, ["status", run_dir, "--json",
                                          "--no-reconcile"]).output)
    camp = body["campaign"]
    assert camp["segments"] == 2 and camp["max_segments"] == 5
    assert camp["node_hours"] == 2 * camp["wall_hours"]
    assert camp["budget_used_fraction"] > 0.9 and camp["projected_finish"] > time.time()


def test_status_shows_the_dependency_and_why_a_dependent_run_was_cancelled() -> None:
    from hpcrun.control.record import RunRecord
    from hpcrun.observe.campaign import campaign_figures, campaign_lines

    rec = RunRecord(run_id="eval-1", spec_id="s", state=RunState.CANCELLED,
                    after=("train-1:ok",),
                    state_info={"reason": "DependencyNeverSatisfied: job 5 waits for train-1"})
    fig = campaign_figures(rec, RunSpec.from_dict({"name": "e", "entrypoint": "m:f"}), now=0.0)
    lines = campaign_lines(fig, state="CANCELLED")
    assert "after       train-1:ok" in lines
    assert "ended       CANCELLED: DependencyNeverSatisfied: job 5 waits for train-1" in lines
    assert "segments    0 (no limit)" in lines and not any(ln.startswith("finish") for ln in lines)


def test_a_sweep_status_has_one_line_per_point_and_totals() -> None:
    from hpcrun.observe.campaign import PointRow, sweep_lines

    rows = [PointRow(index=0, run_id="lm-sweep-000", overrides="config.seed=0",
                     state="SUCCEEDED", step=30, loss=1.25, ettr=0.9),
            PointRow(index=1, run_id="lm-sweep-001", overrides="config.seed=1",
                     state="RUNNING", step=12, loss=None, ettr=0.7)]
    lines = sweep_lines("lm-sweep", rows)
    assert lines[0] == "sweep       lm-sweep" and len(lines) == 5
    assert lines[2].split() == ["0", "lm-sweep-000", "SUCCEEDED", "30", "1.25", "90%",
                                "config.seed=0"]
    assert lines[3].split()[3:6] == ["12", "-", "70%"]
    assert lines[4] == "total       2 points: 1 RUNNING, 1 SUCCEEDED; mean ETTR 80.0%"
