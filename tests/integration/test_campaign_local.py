"""Campaigns on the embedded local backend: segments past the requeue budget, a bounded sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.drill.ledger import check_ledger, read_ledger
from hpcrun.testing.runs import wait_for_state
from tests.integration.local_helpers import local_spec, submit

pytestmark = pytest.mark.slow


def test_stops_that_commit_progress_are_segments_not_requeue_faults(tmp_path: Path) -> None:
    """Four preemption stops, each after progress, on a run allowed one fault requeue."""
    steps = 50
    inject = ";".join(f"preempt@step={10 * (k + 1)},restart={k}" for k in range(4))
    run = submit(tmp_path, local_spec(steps=steps, every_steps=100, budgets={"max_requeues": 1},
                                      config={"ledger": True}), inject=inject, wait=False)
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=300)
    assert (str(record.state), record.step) == ("SUCCEEDED", steps), record.state_info
    assert record.segments == 4 and record.requeues == 4 and record.faults == ()
    lines = read_ledger(run)
    assert lines is not None
    report = check_ledger(lines[0], total_steps=steps, malformed=lines[1])
    assert report.ok and len(lines[0]) == steps, report  # each segment resumed exactly


def test_a_local_sweep_runs_each_point_as_a_full_run_with_bounded_parallelism(
        tmp_path: Path) -> None:
    """Three points, at most two at once; point 1 is preempted and resumes exactly."""
    from hpcrun.control.sweep import read_sweep_index
    from hpcrun.testing.runs import hpcrun, write_spec
    from tests.integration.local_helpers import REPO_ROOT

    steps = 20
    spec = write_spec(tmp_path / "run.yaml", local_spec(steps=steps, every_steps=100,
                                                        config={"ledger": True}))
    env = {"HPCRUN_RUNS": str(tmp_path)}
    out = hpcrun("sweep", str(spec), "--backend", "local", "--grid", "config.seed=0,1,2",
                 "--max-parallel", "2", "--inject-point", "1:preempt@step=8",
                 env=env, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    sweep_dir = tmp_path / out.stdout.split()[0]
    runs = read_sweep_index(sweep_dir).run_dirs(sweep_dir)
    records = [wait_for_state(r, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=400)
               for r in runs]
    assert [(str(r.state), r.step) for r in records] == [("SUCCEEDED", steps)] * 3
    assert [r.segments for r in records] == [0, 1, 0]
    assert [json_seed(r) for r in runs] == [0, 1, 2]
    for run in runs:
        lines = read_ledger(run)
        assert lines is not None and len(lines[0]) == steps  # nothing consumed twice
    status = hpcrun("status", sweep_dir.name, "--no-reconcile", env=env, cwd=REPO_ROOT)
    assert "total       3 points: 3 SUCCEEDED" in status.stdout, status.stdout
    assert "config.seed=1" in status.stdout


def json_seed(run_dir: Path) -> int:
    from hpcrun.control.record import load_run_spec

    return int(load_run_spec(run_dir).config["seed"])


def test_the_python_api_submits_waits_and_reads_the_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcrun
    from tests.integration.local_helpers import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)  # the code a run executes is the current checkout
    monkeypatch.setenv("HPCRUN_RUNS", str(tmp_path))
    run = hpcrun.submit(local_spec(steps=10, every_steps=5), backend="local",
                        runs_root=str(tmp_path))
    assert run.wait(300, poll_s=0.5) == hpcrun.RunState.SUCCEEDED
    assert run.state() == hpcrun.RunState.SUCCEEDED and run.job_id is None
    result = run.result()  # the post-run manifest once runs publish one, else None
    assert result is None or result["terminal_state"] == "SUCCEEDED"


def test_a_spent_wall_hour_budget_stops_with_a_commit_and_fails_with_the_reason(
        tmp_path: Path) -> None:
    """A 40-second wall budget on a run paced to need minutes: it stops at a step boundary,
    commits that step and ends FAILED saying which budget was spent."""
    run = submit(tmp_path, local_spec(steps=2000, every_steps=1000,
                                      budgets={"max_wall_hours": 40 / 3600}),
                 inject="slow@step=1,rank=0,seconds=0.1,every=1", wait=False)
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=300)
    reason = str((record.state_info or {}).get("reason"))
    assert str(record.state) == "FAILED" and reason.startswith("wall-hour budget spent"), reason
    assert "budgets.max_wall_hours" in reason and 0 < record.step < 2000
    assert max(c.step for c in record.checkpoints) == record.step  # the stop committed
