"""RTO split from log entries and rank events (pure)."""

from __future__ import annotations

from hpcrun.control.log import LogEntry
from hpcrun.drill.rto import PHASES, phase_durations, rto_splits, summarize
from hpcrun.protocols import Event


def _e(slot: int, kind: str, gen: int, ts: float, **payload: object) -> LogEntry:
    return LogEntry(slot=slot, kind=kind, generation=gen, holder=f"h{gen}", ts=ts, writer="t",
                    payload=payload)


def _ev(kind: str, gen: int, ts: float, step: int = 0, rank: int = 0, **data: object) -> Event:
    return Event(kind=kind, ts=ts, run_id="r", generation=gen, step=step, rank=rank, data=data)


def _preempted_run() -> tuple[list[LogEntry], list[Event]]:
    entries = [
        _e(0, "fence", 1, 100.0), _e(1, "state", 1, 100.1, state="STARTING"),
        _e(2, "state", 1, 105.0, state="RUNNING", restored_step=0),
        _e(3, "state", 1, 112.0, state="PREEMPTED"), _e(4, "fault", 1, 112.1, fault="preemption"),
        _e(5, "state", 1, 112.2, state="REQUEUED"),
        _e(6, "fence", 2, 115.0), _e(7, "state", 2, 115.1, state="STARTING"),
        _e(8, "state", 2, 121.0, state="RUNNING", restored_step=20),
    ]
    events = [
        _ev("step", 1, 109.0, step=20), _ev("fault_injected", 1, 110.0, step=20),
        _ev("restore", 2, 120.0, start_ts=119.0, rank=0),
        _ev("restore", 2, 120.5, start_ts=119.5, rank=1),
    ]
    return entries, events


def test_split_of_a_preemption_has_every_phase_in_order() -> None:
    entries, events = _preempted_run()
    (s,) = rto_splits(entries, events)
    assert (s.from_generation, s.to_generation, s.cause) == (1, 2, "preemption")
    assert s.phases == {"detect": 2.0, "requeue_wait": 3.0, "start": 4.0, "restore": 1.5,
                        "first_step": 0.5}
    assert s.total_s == 11.0 and sum(s.phases.values()) == s.total_s
    assert s.steps_lost == 0 and s.restored_step == 20


def test_a_straggler_pacing_every_step_is_not_the_interruption() -> None:
    # tests pace runs with a `slow` injection in every step: the crash, not the first paced
    # step, starts the recovery
    entries, events = _preempted_run()
    events.insert(0, _ev("fault_injected", 1, 101.0, step=1, fault="slow"))
    (s,) = rto_splits(entries, events)
    assert s.phases["detect"] == 2.0 and s.total_s == 11.0


def test_node_failure_is_the_cause_even_when_echoes_were_logged_first() -> None:
    entries, events = _preempted_run()
    entries[4] = _e(4, "fault", 1, 112.1, fault="user_error")
    entries.insert(5, _e(5, "fault", 1, 112.15, fault="node_failure"))
    (s,) = rto_splits(entries, events)
    assert s.cause == "node_failure"


def test_node_loss_decided_by_a_reconcile_pass_is_measured_from_the_crash() -> None:
    # the job's srun aborted (no decision by the dead gang); a login-node pass claimed
    # generation 2, recorded the fault and requeued; generation 3 is the next incarnation
    entries = [
        _e(0, "fence", 1, 100.0), _e(1, "state", 1, 100.1, state="STARTING"),
        _e(2, "state", 1, 105.0, state="RUNNING", restored_step=0),
        _e(3, "note", -1, 110.0, event="fault_injected", fault="node-loss", node="node4"),
        _e(4, "fault", -1, 140.0, fault="node_failure"),
        _e(5, "fence", 2, 140.1), _e(6, "state", 2, 140.2, state="REQUEUED"),
        _e(7, "fence", 3, 145.0), _e(8, "state", 3, 145.1, state="STARTING"),
        _e(9, "state", 3, 152.0, state="RUNNING", restored_step=50),
    ]
    (s,) = rto_splits(entries, [_ev("step", 1, 109.0, step=60)])
    assert (s.from_generation, s.to_generation, s.cause) == (1, 3, "node_failure")
    assert s.total_s == 42.0 and round(s.phases["detect"], 6) == 30.2 and s.steps_lost == 10


def test_a_requeue_slurm_decided_is_timed_by_slurm_and_logged_by_the_next_gang() -> None:
    entries = [
        _e(0, "fence", 1, 100.0), _e(1, "state", 1, 100.1, state="STARTING"),
        _e(2, "state", 1, 105.0, state="RUNNING", restored_step=0),
        _e(3, "note", -1, 110.0, event="fault_injected", fault="node-loss"),
        _e(4, "fence", 2, 150.0), _e(5, "fault", 2, 150.1, fault="node_failure"),
        _e(6, "state", 2, 150.2, state="REQUEUED", decided_at=140.0),
        _e(7, "state", 2, 150.3, state="STARTING"),
        _e(8, "state", 2, 157.0, state="RUNNING", restored_step=50),
    ]
    (s,) = rto_splits(entries, [])
    assert s.cause == "node_failure" and s.total_s == 47.0
    assert s.phases["detect"] == 30.0 and s.phases["requeue_wait"] == 10.0


def test_a_fence_without_validated_progress_is_not_a_recovery() -> None:
    entries, events = _preempted_run()
    assert rto_splits(entries[:-1], events) == []


def test_missing_restore_events_fold_start_into_one_phase() -> None:
    marks = {"interrupted": 0.0, "decided": 1.0, "fence": 2.0, "running": 5.0}
    assert phase_durations(marks) == {"detect": 1.0, "requeue_wait": 1.0, "start": 3.0}


def test_summary_averages_per_cause() -> None:
    entries, events = _preempted_run()
    splits = rto_splits(entries, events) * 2
    row = summarize(splits)["preemption"]
    assert row["count"] == 2 and row["total"] == 11.0 and set(PHASES) <= set(row)
