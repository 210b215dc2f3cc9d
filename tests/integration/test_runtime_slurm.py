"""Launch and worker runtime on the real Slurm testbed: submission paths, preemption by signal
and by a higher-priority job, in-allocation restarts and spent retry budgets (the time limit's
self-requeue is in ``test_campaign_slurm.py``).

Every run is the tiny example on 2 nodes x 2 ranks (site ``testbed``); what is asserted is what a
user reads: the run's state, its final step, how often it was requeued or restarted, and from
which step it resumed.
"""

from __future__ import annotations

import json
import time

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import (
    BASELINE_STEPS,
    TEARDOWN_S,
    RunFactory,
    TestbedRun,
    baseline_run,
    first_after,
    run_figures_of,
    sacct_allocations,
    scontrol_job,
    slurm_spec,
    wait_until,
)

pytestmark = pytest.mark.slurm


def _assert_clean_success(run: TestbedRun, slurm: JobClient, steps: int) -> None:
    """SUCCEEDED at ``steps`` on one job, every rank stepped through every step."""
    rec = run.wait({"SUCCEEDED"}, timeout=120)
    assert rec.step == steps and rec.result is not None and rec.result["state"] == "SUCCEEDED"
    assert rec.job_ids == (run.job_id,) and (rec.requeues, rec.restarts) == (0, 0)
    assert len(set(rec.membership)) == 2
    steps_by_rank: dict[int, list[int]] = {}
    for event in run.rank_events("step"):
        steps_by_rank.setdefault(event["rank"], []).append(event["step"])
    assert sorted(steps_by_rank) == [0, 1, 2, 3]
    assert all(s == list(range(1, steps + 1)) for s in steps_by_rank.values())
    assert slurm.wait_for_state(int(run.job_id), {"COMPLETED"}, timeout=60) == "COMPLETED"
    manifest = run.shown_manifest("SUCCEEDED")
    assert (manifest["steps"], manifest["job_ids"]) == (steps, [run.job_id])


def test_submit_through_submitit_succeeds(testbed: Testbed, slurm: JobClient) -> None:
    run = baseline_run(testbed)  # shared with the checkpoint and observability tests
    _assert_clean_success(run, slurm, BASELINE_STEPS)
    assert (run.run_dir / "submitit" / f"{run.job_id}_0_log.out").exists()


@pytest.mark.slow
def test_plain_sbatch_script_succeeds(testbed: Testbed, runs: RunFactory,
                                      slurm: JobClient) -> None:
    run = runs.sbatch(slurm_spec(testbed, steps=30, every_steps=10), slurm)
    _assert_clean_success(run, slurm, 30)
    assert (run.run_dir / "logs" / f"slurm-{run.job_id}.out").exists()
    assert not (run.run_dir / "submitit" / f"{run.job_id}_0_log.out").exists()


# -- preemption ---------------------------------------------------------------------------------


def _ledger(run: TestbedRun) -> list[dict[str, object]]:
    path = run.run_dir / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_resumed_exactly(run: TestbedRun, *, steps: int, stopped_after: int) -> int:
    """One preemption: committed at a step boundary, requeued once, resumed from that commit.

    Returns the committed step the run resumed from.
    """
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    assert rec.step == steps and rec.requeues == 1 and rec.job_ids == (run.job_id,)
    states = run.states()
    preempted = first_after(states, "PREEMPTED")
    assert [s for s, _ in states].count("REQUEUED") <= 1  # Slurm's own requeue logs no entry
    commits = [e for e in run.valid(EntryKind.COMMIT) if e.slot < preempted.slot]
    committed = max(int(e.payload["step"]) for e in commits)
    assert committed >= stopped_after
    shared = {e.payload["ckpt_id"] for e in commits if e.payload["tier"] == "shared"}
    assert any(e.payload["step"] == committed and e.payload["ckpt_id"] in shared
               for e in commits), "the stop checkpoint did not reach tier 1 before the requeue"
    resumed = first_after(states, "RUNNING", preempted.slot)
    assert resumed.payload["restored_step"] == committed > 0
    ledger = _assert_ledger_exact(run, steps)
    second = [int(str(line["step"])) for line in ledger if line["generation"] != 1]
    assert second[0] == committed, "the resumed incarnation did not start at the commit"
    return committed


def _assert_ledger_exact(run: TestbedRun, steps: int) -> list[dict[str, object]]:
    """Rank 0's sample ledger: every step once at least, and a replayed step consumed the same
    samples as the first time (no sample skipped or changed across restores)."""
    ledger = _ledger(run)
    by_step: dict[int, list[object]] = {}
    for line in ledger:
        by_step.setdefault(int(str(line["step"])), []).append(line["samples"])
    assert sorted(by_step) == list(range(steps)), "a step is missing from the ledger"
    assert all(all(s == seen[0] for s in seen) for seen in by_step.values())
    return ledger


def _preemption_timeline(run: TestbedRun, signalled_at: float) -> dict[str, float]:
    """Seconds of each part of signal → resumed first step (ours, Slurm's, ours again)."""
    valid = run.valid()
    states = run.states()
    preempted = first_after(states, "PREEMPTED")
    commits = [e for e in valid if e.kind == EntryKind.COMMIT and e.slot < preempted.slot]
    tier0 = [e for e in commits if e.payload["tier"] == "node_local"][-1]
    tier1 = next(e for e in commits if e.payload["ckpt_id"] == tier0.payload["ckpt_id"]
                 and e.payload["tier"] == "shared")
    sent = [e for e in valid if e.kind == EntryKind.NOTE
            and e.payload.get("event") == "requeue_sent"]
    requeued_at = sent[0].ts if sent else preempted.ts
    fence = next(e for e in valid if e.kind == EntryKind.FENCE and e.slot > preempted.slot)
    span = next(e for e in run.rank_events("restore")
                if e["rank"] == 0 and e["generation"] == fence.generation)
    running = first_after(states, "RUNNING", preempted.slot)
    return {
        "ours: signal -> stop commit (tier 0)": tier0.ts - signalled_at,
        "ours: tier 0 -> tier 1 commit": tier1.ts - tier0.ts,
        "ours: tier 1 -> requeue sent": requeued_at - tier1.ts,
        "slurm: requeue -> agent started": fence.ts - requeued_at,
        "ours: agent -> ranks up (torch, pg)": span["data"]["start_ts"] - fence.ts,
        "ours: restore": span["data"]["dur_s"],
        "ours: restored -> first step": running.ts - span["ts"],
        "total: signal -> first resumed step": running.ts - signalled_at,
    }


def _print_timeline(title: str, parts: dict[str, float]) -> None:
    print(f"\n{title}")
    for name, seconds in parts.items():
        print(f"  {name:<40} {seconds:6.2f} s")


def _preemptible_run(runs: RunFactory, testbed: Testbed, steps: int) -> TestbedRun:
    """A run a preemption reaches mid-training: paced at 0.1 s a step, it is still ~20 s from
    its end when the test signals it at step 20 (unpaced, a loaded machine delivered the
    signal after the last step)."""
    return runs.submit(slurm_spec(testbed, steps=steps, every_steps=10, config={"ledger": True}),
                       inject="slow@step=1,rank=0,seconds=0.1,every=1")


def test_signal_preemption_commits_requeues_once_and_resumes(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    run = _preemptible_run(runs, testbed, 240)
    run.wait_for("training past step 20", lambda: run.record().step >= 20, timeout=90)
    signalled_at = time.time()
    sent = run.cli("signal", run.name)
    assert sent.returncode == 0, sent.stderr
    step_at_signal = run.record().step
    committed = _assert_resumed_exactly(run, steps=240, stopped_after=step_at_signal)
    assert slurm.wait_for_state(int(run.job_id), {"COMPLETED"}, timeout=60) == "COMPLETED"
    assert scontrol_job(slurm, run.job_id).get("Restarts") == "1"
    history = slurm.wait_for_accounting(int(run.job_id), {"REQUEUED", "COMPLETED"}, timeout=30)
    assert [r.state for r in history] == ["REQUEUED", "COMPLETED"]
    notes = [e for e in run.valid(EntryKind.NOTE) if e.payload.get("event") == "requeue_sent"]
    assert len(notes) == 1 and "requeued job" in str(notes[0].payload["detail"])
    _allocations_agree_with_sacct(run, slurm)
    _print_timeline(f"signal preemption at step {step_at_signal}, resumed from {committed}",
                    _preemption_timeline(run, signalled_at))


def _allocations_agree_with_sacct(run: TestbedRun, slurm: JobClient) -> None:
    """Each allocation of a requeued run against Slurm's record of it: the same start, the
    same length (the record's end is the stop's state entry; Slurm's follows the agents'
    exit), node-hours by hand, and the wait for the second allocation as queue, outside ETTR."""
    rows = sacct_allocations(slurm, run.job_id)
    rec = run.record()
    fig = run_figures_of(run)
    print(f"\nsacct {rows}; record {rec.allocations}; ETTR {fig.ettr:.3f} of "
          f"{fig.allocated_s:.1f} s, {fig.node_hours:.5f} node-h, queued {fig.queue_s:.1f} s")
    assert len(rec.allocations) == len(rows) == 2
    for alloc, (start, end, nodes) in zip(rec.allocations, rows, strict=True):
        assert alloc.end is not None and abs(alloc.start - start) <= 1.0, (alloc, start)
        assert -2.0 <= end - alloc.end <= TEARDOWN_S, (alloc, end)  # sacct: whole seconds
        assert alloc.nodes == nodes
    hand_s = sum(end - start for start, end, _ in rows)
    hand_nh = sum((end - start) * n for start, end, n in rows) / 3600.0
    assert -2.0 <= hand_s - fig.allocated_s <= 2 * TEARDOWN_S  # sacct: whole seconds
    assert fig.node_hours == pytest.approx(hand_nh, abs=2 * TEARDOWN_S * 2 / 3600.0)
    assert fig.queue_s >= rows[1][0] - rows[0][1] - 2.0 and fig.queue_s > 0.0


def test_a_notice_as_the_agents_start_is_a_stop_and_a_requeue_not_a_failed_job(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """Slurm sends a notice to the agents' step from the step's start (a short time limit's
    warning can come that early). One a second after the step appears (each agent's
    interpreter starts with it ignored, its first instructions hold it) and one a second later
    (held while the agent imports and sets up, or on its flag): neither kills an agent; the
    gang stops before its first steps, is requeued once, and the next allocation runs the
    whole run. (Within the first milliseconds, before a task's shell has run, nothing in the
    task can catch it.)"""
    run = _preemptible_run(runs, testbed, 40)
    wait_until("the agents' step", lambda: f"{run.job_id}.0" in slurm.run(
        "squeue", "-h", "-s", "-j", run.job_id, "-o", "%i").stdout.split(),
        timeout=120, poll_s=0.05)
    for _ in range(2):
        time.sleep(1.0)
        sent = slurm.run("scancel", "--signal=USR1", run.job_id)
        assert sent.returncode == 0, sent.stderr
    # Both notices reached the first allocation when it had not been requeued once the second
    # was sent. On a loaded machine the first allocation (stopped before its first step) can
    # be requeued within that second: the second notice then stops the next allocation, a
    # preemption of its own, and the run is requeued twice.
    both_in_first = scontrol_job(slurm, run.job_id).get("Restarts") == "0"
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    requeues = 1 if both_in_first else rec.requeues
    assert rec.step == 40 and rec.requeues == requeues and requeues in (1, 2), \
        (rec.requeues, both_in_first)
    assert rec.job_ids == (run.job_id,)
    # each requeue is a preemption, or a segment where the stop committed progress (a loaded
    # machine can see the step late: the gang may already train when the first notice comes)
    faults = [(f.fault, f.node, f.rank, f.step, f.detail) for f in rec.faults]
    assert all(f.fault == "preemption" for f in rec.faults), faults
    assert len(rec.faults) + rec.segments == requeues, (faults, rec.segments)
    history = slurm.wait_for_accounting(int(run.job_id), {"REQUEUED", "COMPLETED"}, timeout=30)
    assert [r.state for r in history] == ["REQUEUED"] * requeues + ["COMPLETED"]


@pytest.mark.slow
def test_full_scancel_signal_reaches_agents_once_per_requeue(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    run = _preemptible_run(runs, testbed, 240)
    run.wait_for("training past step 20", lambda: run.record().step >= 20, timeout=90)
    sent = slurm.run("scancel", "--full", "-s", "USR1", run.job_id)
    assert sent.returncode == 0, sent.stderr
    _assert_resumed_exactly(run, steps=240, stopped_after=20)
    assert scontrol_job(slurm, run.job_id).get("Restarts") == "1"


@pytest.mark.slow
def test_high_priority_job_preempts_and_slurm_requeues_exactly_once(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    run = _preemptible_run(runs, testbed, 400)
    run.wait_for("training past step 20", lambda: run.record().step >= 20, timeout=90)
    victim_nodes = ",".join(run.record().membership)
    high = slurm.submit("#!/bin/sh\nsleep 20\n", "-p", "high", "-N2", "-w", victim_nodes,
                        "--exclusive", f"--output={run.run_dir}/high-%j.out")
    assert slurm.wait_for_state(high, {"RUNNING", "COMPLETED"}, timeout=60)
    committed = _assert_resumed_exactly(run, steps=400, stopped_after=20)
    history = slurm.wait_for_accounting(int(run.job_id), {"PREEMPTED", "COMPLETED"}, timeout=30)
    assert [r.state for r in history] == ["PREEMPTED", "COMPLETED"]  # never REQUEUED twice
    assert scontrol_job(slurm, run.job_id).get("Restarts") == "1"
    notes = [e for e in run.valid(EntryKind.NOTE) if e.payload.get("event") == "requeue_sent"]
    assert all("not requeueing" in str(n.payload["detail"]) for n in notes), notes
    print(f"\nreal preemption: resumed from committed step {committed}")


# -- failures inside the allocation ------------------------------------------------------------


def test_killed_rank_restarts_inside_the_allocation(testbed: Testbed, runs: RunFactory,
                                                    slurm: JobClient) -> None:
    run = runs.submit(slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10),
                      inject="crash@step=25,rank=1")
    rec = run.wait({"SUCCEEDED"}, timeout=150)
    assert rec.step == 40 and (rec.restarts, rec.requeues) == (1, 0)
    assert rec.job_ids == (run.job_id,)
    crash = [f for f in rec.faults if f.fault == "process_crash"]
    assert len(crash) == 1 and crash[0].rank == 1 and crash[0].node == rec.membership[1]
    assert "signal 9" in crash[0].detail
    states = run.states()
    recovering = first_after(states, "RECOVERING")
    resumed = first_after(states, "RUNNING", recovering.slot)
    # the newest commit before the crash at step 25 (an asynchronous save still in flight
    # when the rank died is lost with it)
    committed = [int(e.payload["step"]) for e in run.valid(EntryKind.COMMIT)
                 if e.slot < recovering.slot]
    assert resumed.payload["restored_step"] == max(committed) >= 10
    # same nodes: each node's tier 0 still there, the other node's pieces read from it
    assert resumed.payload["restored_tier"] in ("node_local", "peer")
    assert slurm.wait_for_state(int(run.job_id), {"COMPLETED"}, timeout=60) == "COMPLETED"
    assert scontrol_job(slurm, run.job_id).get("Restarts") == "0"


def test_spent_retry_budget_fails_with_the_reason(testbed: Testbed, runs: RunFactory,
                                                  slurm: JobClient) -> None:
    spec = slurm_spec(testbed, tasks_per_node=1, steps=40, every_steps=10,
                      retry={"max_attempts": {"process_crash": 0}, "in_allocation_restarts": 0})
    run = runs.submit(spec, inject="crash@step=5,rank=1,every=1")
    run.wait({"FAILED"}, timeout=120)
    # the result entry follows the FAILED state entry in the log
    run.wait_for("the run's result", lambda: run.record().result is not None, timeout=30)
    rec = run.record()
    reason = str((rec.result or {}).get("reason"))
    assert rec.result is not None and rec.result["state"] == "FAILED"
    assert "process_crash retry budget spent" in reason, reason
    assert (rec.requeues, rec.restarts) == (0, 0) and rec.job_ids == (run.job_id,)
    assert [f.fault for f in rec.faults] == ["process_crash"]
    wait_until("the job to end", lambda: slurm.state(int(run.job_id)) in {"FAILED", "COMPLETED"},
               timeout=60)
    status = run.cli("status", run.name, "--json")
    assert json.loads(status.stdout)["facts"]["state"] == "FAILED"
    manifest = run.shown_manifest("FAILED")
    assert [i["fault"] for i in manifest["incidents"]] == ["process_crash"]
