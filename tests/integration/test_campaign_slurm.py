"""Campaigns on the real Slurm testbed: a long run as segments under a 1-minute time limit.

Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import DrillFault, row_for
from hpcrun.testbed import JobClient, Testbed
from hpcrun.vocab import TERMINAL
from tests.integration.helpers import (
    RunFactory,
    TestbedRun,
    first_after,
    slurm_spec,
    slurm_story,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SITE = Path(__file__).resolve().parents[2] / "site_configs" / "testbed.yaml"


def _short_lead_site(tmp_path: Path, runs: RunFactory) -> str:
    """The testbed site with a 15 s preemption lead. Slurm sends the warning up to its 30 s
    check interval early, so on a 1-minute limit it lands 15-45 s into each allocation (the
    ranks are stepping from about 15 s on), and 15+ s remain to commit, drain and requeue."""
    (tmp_path / "testbed-short.yaml").write_text(
        SITE.read_text().replace("name: testbed", "name: testbed-short")
        .replace("preempt_lead_s: 60", "preempt_lead_s: 15"))
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


@pytest.mark.timeout(900)
def test_a_long_run_under_a_one_minute_limit_finishes_in_segments(
        testbed: Testbed, runs: RunFactory, slurm: JobClient, tmp_path: Path) -> None:
    site = _short_lead_site(tmp_path, runs)
    # At most ~30 s of stepping per allocation at ~4.5 steps/s (0.2 s pace): 200 steps take
    # two allocations with progress at the very least, so one segment (a stop with a commit)
    # before the allocation that finishes (on a loaded 2-core machine, more). A warning that
    # lands before the first step of an allocation (Slurm's 30 s check interval can send it
    # 15 s in; a loaded machine starts the ranks later than that) is a stop without progress:
    # a fault, against a budget with room.
    spec = slurm_spec(testbed, tasks_per_node=1, steps=200, every_steps=10, site=site,
                      resources={"time_limit_min": 1}, config={"ledger": True},
                      budgets={"max_requeues": 20})
    run = runs.submit(spec, inject=";".join(
        f"slow@step=1,rank={r},seconds=0.2,every=1" for r in (0, 1)))
    deadline = time.monotonic() + 800  # under the test's 900 s, so a failure shows the log
    while str(run.record().state) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(2)
    rec = run.record()
    assert str(rec.state) == "SUCCEEDED", f"{_timeline(run)}\n{slurm_story(slurm, run)}"
    assert rec.step == 200 and rec.segments >= 1, _timeline(run)
    assert rec.job_ids == (run.job_id,)  # one job, requeued by itself each time
    # only stops without progress were faults; segments never counted against max_requeues
    assert len(rec.faults) == rec.requeues - rec.segments
    assert all(f.fault == "preemption" for f in rec.faults)
    # it left before the limit every time: Slurm saw requeues, then one completion, no TIMEOUT
    history = slurm.wait_for_accounting(int(run.job_id), {"REQUEUED", "COMPLETED"}, timeout=30)
    assert "TIMEOUT" not in {r.state for r in history}
    assert history[-1].state == "COMPLETED" and len(history) == rec.requeues + 1
    # each allocation resumed from the newest commit made before its stop
    states = run.states()
    for preempted in [e for s, e in states if s == "PREEMPTED"]:
        commits = [e for e in run.valid(EntryKind.COMMIT) if e.slot < preempted.slot]
        resumed = first_after(states, "RUNNING", preempted.slot)
        assert resumed.payload["restored_step"] == max(int(e.payload["step"]) for e in commits)
    results = check_contracts(collect(run.run_dir, victim_rank=None),
                              row_for(DrillFault.PREEMPT_TIMELIMIT))
    print(f"\n{rec.segments} segments, {len(rec.faults)} stops without progress, "
          f"{rec.wall_s:.0f} s allocated; " + "; ".join(f"{r.name} {r.mark}" for r in results))
    failed = not_held(results, row_for(DrillFault.PREEMPT_TIMELIMIT))
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
    # The upstream fails about 25 s into training: the dependent run is submitted well before
    # (a submit that finds its upstream already FAILED is refused, as it should be).
    train = runs.submit(failing, inject="slow@step=1,rank=0,seconds=1,every=1;"
                        "crash@step=25,rank=1,every=1", name="train.yaml")
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


# -- sweeps -------------------------------------------------------------------------------------

def test_a_sweep_is_one_job_array_whose_tasks_are_full_runs(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """Six points, two at a time; point 1 is preempted, point 3 crashes a rank: all six
    SUCCEEDED, each resumed exactly (its own sample ledger)."""
    from hpcrun.control.sweep import read_sweep_index
    from hpcrun.drill.ledger import check_ledger, read_ledger
    from hpcrun.testing.runs import hpcrun
    from tests.integration.helpers import REPO_ROOT, wait_until

    steps = 30
    spec = runs.write(slurm_spec(testbed, tasks_per_node=1, steps=steps, every_steps=10,
                                 config={"ledger": True}))
    out = hpcrun("sweep", str(spec), "--grid", "config.seed=0,1,2,3,4,5", "--max-parallel",
                 "2", "--inject-point", "1:preempt@step=15",
                 "--inject-point", "3:crash@step=15,rank=1", env=runs.env, cwd=REPO_ROOT,
                 timeout=180)
    assert out.returncode == 0, out.stderr
    sweep_dir = runs.runs_root / out.stdout.split()[0]
    array_id = out.stdout.split("slurm array job ")[1].split(")")[0]
    points = [TestbedRun(run_dir=d, job_id=f"{array_id}_{k}", env=runs.env)
              for k, d in enumerate(read_sweep_index(sweep_dir).run_dirs(sweep_dir))]
    runs.runs.extend(points)
    peak = [0]

    def all_ended() -> bool:
        states = [str(p.record().state) for p in points]
        peak[0] = max(peak[0], sum(s in ("STARTING", "RUNNING") for s in states))
        assert "FAILED" not in states and "CANCELLED" not in states, states
        return all(s == "SUCCEEDED" for s in states)

    wait_until("all six points SUCCEEDED", all_ended, timeout=600, poll_s=1.0)
    records = [p.record() for p in points]
    assert [r.step for r in records] == [steps] * 6 and peak[0] <= 2
    assert records[1].segments == 1 and records[1].requeues == 1  # just that task requeued
    assert records[3].restarts + records[3].requeues >= 1
    assert [f.fault for f in records[3].faults] == ["process_crash"]
    assert all(r.requeues == 0 for k, r in enumerate(records) if k != 1)
    for p in points:
        lines = read_ledger(p.run_dir)
        assert lines is not None
        report = check_ledger(lines[0], total_steps=steps, malformed=lines[1])
        assert report.ok, f"{p.name}: {report}"
    status = hpcrun("status", sweep_dir.name, "--no-reconcile", env=runs.env, cwd=REPO_ROOT)
    assert "total       6 points: 6 SUCCEEDED" in status.stdout, status.stdout
