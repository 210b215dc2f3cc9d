"""ETTR, goodput and waste on constructed logs with known answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.observe.ettr import Allocation, Bucket, compute_ettr, gang_steps
from tests.unit.observe.builders import ev, runtime_two_generation_log, span, step


def test_the_runtimes_events_charge_every_second_to_its_cause() -> None:
    r = compute_ettr(runtime_two_generation_log(), node_hour_price=3.6)
    assert r.allocated_s == pytest.approx(116.0)  # [5, 65] + [1000, 1056]: first to last event
    assert r.seconds == pytest.approx({
        "productive": 55.0,   # 27 (steps 1-3) + 20 (steps 4, 5) in gen 1, 8 in gen 2
        "startup": 6.0,       # rank start to the first restore: 4 s in gen 1, 2 s in gen 2
        "input_wait": 5.0,    # 3 × 1 s in gen 1, 2 s in gen 2
        "checkpoint": 8.0,    # the async stage (5 s) and the final blocking one (3 s)
        "idle": 1.0,          # the final commit's non-blocking tail
        "recovery": 19.0,     # the restores: 1 s finding nothing, 18 s of step 3
        "replay": 20.0,       # steps 4 and 5 recomputed
        "stall": 2.0,         # the final stop agreement
    })
    assert r.ettr == pytest.approx(55.0 / 116.0)
    assert (r.accepted_steps, r.replayed_steps, r.accepted_tokens) == (6, 2, 1200)
    assert r.wall_s == pytest.approx(1051.0)
    assert r.throughput == pytest.approx(1200 / 1051.0)
    assert r.node_hours == pytest.approx((60 * 2 + 56 * 2) / 3600)  # 2 nodes, named by events
    assert r.cost_per_token == pytest.approx((232 / 3600) * 3.6 / 1200)


def test_submission_time_counts_in_wall_time_not_in_allocated_time() -> None:
    r = compute_ettr(runtime_two_generation_log(), submitted_ts=-944.0)
    assert r.wall_s == pytest.approx(2000.0)
    assert r.allocated_s == pytest.approx(116.0)
    assert r.cost_per_token is None


def test_ranks_of_one_step_merge_into_the_slowest_and_tokens_add_up() -> None:
    events = [step(1, 0.0, 10.0, rank=0, input_wait_s=1.0, tokens=50),
              step(1, 0.0, 12.0, rank=1, input_wait_s=3.0, tokens=50)]
    (gs,) = gang_steps(events)
    assert (gs.start, gs.end, gs.input_wait_s, gs.tokens) == (0.0, 12.0, 3.0, 100)
    r = compute_ettr(events)
    assert r.seconds[Bucket.PRODUCTIVE] == pytest.approx(9.0)
    assert r.seconds[Bucket.INPUT_WAIT] == pytest.approx(3.0)


def test_blocking_checkpoint_write_is_exposure_and_recovery_beats_steps() -> None:
    events = [step(1, 0.0, 10.0), span("ckpt_write", 10.0, 14.0, 1, blocking=True),
              span("recovery", 12.0, 20.0), step(2, 20.0, 30.0)]
    r = compute_ettr(events)
    assert r.seconds[Bucket.CHECKPOINT] == pytest.approx(2.0)  # 12..14 goes to recovery
    assert r.seconds[Bucket.RECOVERY] == pytest.approx(8.0)
    assert r.ettr == pytest.approx(20.0 / 30.0)


def test_explicit_allocations_from_the_record_override_event_bounds() -> None:
    events = [step(1, 10.0, 20.0)]
    r = compute_ettr(events, allocations=[Allocation(generation=1, start=0.0, end=40.0,
                                                     nodes=4)])
    assert r.seconds[Bucket.STARTUP] == pytest.approx(10.0)
    assert r.seconds[Bucket.IDLE] == pytest.approx(20.0)
    assert r.node_hours == pytest.approx(160 / 3600)


def test_no_events_means_nothing_allocated() -> None:
    r = compute_ettr([])
    assert (r.allocated_s, r.ettr, r.throughput) == (0.0, 0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["step", "ckpt_stage", "recovery", "collective",
                                           "admission"]),
                          st.floats(0, 100), st.floats(0, 20), st.integers(0, 5),
                          st.integers(1, 3)), min_size=1, max_size=30))
def test_buckets_always_sum_to_allocated_time(items: list[tuple[str, float, float, int, int]]
                                              ) -> None:
    events = [span(k, s, s + d, n, gen=g, input_wait_s=d / 3) for k, s, d, n, g in items]
    r = compute_ettr(events)
    assert sum(r.seconds.values()) == pytest.approx(r.allocated_s, abs=1e-6)
    assert 0.0 <= r.ettr <= 1.0 + 1e-9


def test_an_allocation_that_never_starts_work_is_all_startup() -> None:
    r = compute_ettr([ev("state", 0.0, state="STARTING", nodes=1), ev("fault", 30.0)])
    assert r.allocated_s == pytest.approx(30.0)  # instant events still extend the allocation
    assert r.seconds[Bucket.STARTUP] == pytest.approx(30.0)
    assert r.ettr == 0.0


def _restart_log() -> list:
    """Gen 1: 10 steps of 10 s from t=10, a fault at 110; gen 2 (a restart in the same
    allocation) first reports at 410 and takes 10 more steps."""
    g1 = [step(k, 10.0 * k, 10.0 * k + 10.0, gen=1) for k in range(1, 11)]
    g2 = [step(10 + k, 400.0 + 10.0 * k, 410.0 + 10.0 * k, gen=2) for k in range(1, 11)]
    return [*g1, ev("fault", 110.0, 10, gen=1, fault="crash"), *g2]


def test_a_300_s_restart_gap_inside_the_allocation_is_recovery() -> None:
    alloc = Allocation(start=0.0, end=520.0, nodes=2)
    r = compute_ettr(_restart_log(), allocations=[alloc])
    assert r.allocated_s == 520.0
    assert r.seconds[Bucket.PRODUCTIVE] == 200.0
    assert r.seconds[Bucket.RECOVERY] == 300.0     # 110 (gen 1's last event) .. 410
    assert r.seconds[Bucket.STARTUP] == 10.0       # granted at 0, first step at 10
    assert r.seconds[Bucket.IDLE] == 10.0          # last step ends at 510
    assert r.ettr == pytest.approx(200.0 / 520.0)
    assert sum(r.seconds.values()) == pytest.approx(r.allocated_s)


def test_per_generation_allocations_from_events_alone_miss_the_gap() -> None:
    """Why the record's allocations are used: the events alone score the restart 100%."""
    assert compute_ettr(_restart_log()).ettr == pytest.approx(1.0)


def test_a_requeue_gap_is_queue_outside_ettr_and_each_allocation_starts_with_startup() -> None:
    a1 = Allocation(start=0.0, end=115.0, nodes=2, queued_s=30.0)
    a2 = Allocation(start=395.0, end=520.0, nodes=2, queued_s=280.0)
    r = compute_ettr(_restart_log(), allocations=[a1, a2])
    assert r.allocated_s == 240.0 and r.queue_s == 310.0
    assert r.seconds[Bucket.STARTUP] == 10.0 + 15.0   # 0..10 and 395..410
    assert r.seconds[Bucket.RECOVERY] == 0.0          # no restart inside either allocation
    assert r.seconds[Bucket.IDLE] == 5.0 + 10.0       # 110..115 and 510..520
    assert r.ettr == pytest.approx(200.0 / 240.0)


def test_the_tail_of_an_allocation_given_back_to_a_requeue_is_recovery() -> None:
    """The stop, the decision, the requeue and the teardown after the gang's last work: the
    allocation that goes on to another is recovering; the last one's tail stays idle."""
    a1 = Allocation(start=0.0, end=115.0, nodes=2, queued_s=30.0, requeued=True)
    a2 = Allocation(start=395.0, end=520.0, nodes=2, queued_s=280.0)
    r = compute_ettr(_restart_log(), allocations=[a1, a2])
    assert r.seconds[Bucket.RECOVERY] == 5.0          # 110 (gen 1's last event) .. 115
    assert r.seconds[Bucket.IDLE] == 10.0             # 510..520, after the run's last step
    assert sum(r.seconds.values()) == pytest.approx(r.allocated_s)


def test_spares_count_in_node_hours_and_are_shown_apart() -> None:
    alloc = Allocation(start=0.0, end=3600.0, nodes=3, spares=1)
    r = compute_ettr(_restart_log(), allocations=[alloc])
    assert r.node_hours == pytest.approx(3.0) and r.spare_node_hours == pytest.approx(1.0)
    assert r.to_dict()["spare_node_hours"] == pytest.approx(1.0)
