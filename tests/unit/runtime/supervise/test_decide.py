"""The supervisor's decision core: every branch of ``decide``, with injected time."""

from __future__ import annotations

import random
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.record import CheckpointRef, FaultRecord, RunRecord, create_run
from hpcrun.control.retry import FaultClass
from hpcrun.control.spec import Budgets, RetryPolicy, RunSpec
from hpcrun.launch.signals import StopFlag
from hpcrun.runtime.incarnation import Ending
from hpcrun.runtime.node.budget_watch import BudgetWatch
from hpcrun.runtime.supervise.decide import (
    DecisionPolicy,
    Fail,
    GangFault,
    LeaveToSlurm,
    Observations,
    Requeue,
    RestartInAllocation,
    Shrink,
    Succeed,
    SwapSpare,
    account_for_requeue,
    decide,
    enough_to_decide,
    requeue_unrecorded,
    root_cause,
)
from hpcrun.scheduler.slurm import PastRun, SlurmJobState
from hpcrun.testing import FakeClock
from hpcrun.vocab import Tier

NODES = ("n0", "n1")
POLICY = DecisionPolicy(retry=RetryPolicy(jitter=False, backoff_base_s=10, backoff_cap_s=60),
                        max_requeues=5, spare_nodes=0)
RECORD = RunRecord(run_id="r", spec_id="s", generation=4, holder="h")
CRASH = GangFault(fault=FaultClass.PROCESS_CRASH, node="n1", rank=3, step=7,
                  signature="process_crash:rank3:-9", detail="killed by signal 9")


def obs(**over: Any) -> Observations:
    base: dict[str, Any] = dict(generation=4, attempt=0, nodes=NODES, waited_s=60.0,
                                preempt_signal=int(signal.SIGUSR1), backend="slurm")
    base.update(over)
    return Observations(**base)


def exits(*statuses: Ending) -> dict[str, Ending]:
    return dict(zip(NODES, statuses, strict=True))


def stopped(signum: int = signal.SIGUSR1, **over: Any) -> Observations:
    return obs(exits=exits(Ending.PREEMPTED, Ending.PREEMPTED), stop_requested=True,
               stop_signum=int(signum), **over)


def test_every_rank_succeeded_is_success() -> None:
    d = decide(obs(exits=exits(Ending.SUCCEEDED, Ending.SUCCEEDED)), RECORD, POLICY,
               now=FakeClock().now())
    assert d == Succeed(reason="all ranks finished")


def test_a_late_preemption_signal_after_every_rank_succeeded_is_still_success() -> None:
    late = obs(exits=exits(Ending.SUCCEEDED, Ending.SUCCEEDED), stop_requested=True,
               stop_signum=int(signal.SIGUSR1))
    assert isinstance(decide(late, RECORD, POLICY, now=FakeClock().now()), Succeed)


def test_a_crashed_rank_restarts_the_gang_in_the_allocation() -> None:
    d = decide(obs(exits=exits(Ending.SUCCEEDED, Ending.FAILED), faults=(CRASH,), attempt=1),
               RECORD, POLICY, now=FakeClock().now())
    assert d == RestartInAllocation(attempt=2,
                                    reason="process_crash: restart in allocation (1 of 2)")


def test_a_crash_after_the_in_allocation_restarts_requeues_with_backoff() -> None:
    record = replace(RECORD, restarts=2)
    d = decide(obs(faults=(CRASH,)), record, POLICY, now=FakeClock().now())
    assert d == Requeue(delay_s=10.0, exclude=(), preempted=False,
                        reason="process_crash: requeue after 10 s (attempt 1 of 3)", fault=CRASH)


def test_backoff_jitter_comes_from_the_injected_rng() -> None:
    jittery = replace(POLICY, retry=RetryPolicy(jitter=True, backoff_base_s=10))
    record = replace(RECORD, restarts=2)
    first = decide(obs(faults=(CRASH,)), record, jittery, now=0.0, rng=random.Random(7))
    again = decide(obs(faults=(CRASH,)), record, jittery, now=0.0, rng=random.Random(7))
    assert isinstance(first, Requeue) and first == again
    assert 0 <= first.delay_s <= 10 and first.delay_s != 10


def test_a_spent_retry_budget_fails_with_the_reason() -> None:
    clock = FakeClock()
    earlier = tuple(FaultRecord(fault=FaultClass.PROCESS_CRASH, ts=clock.now(), slot=s,
                                generation=g) for s, g in ((10, 1), (20, 2), (30, 3)))
    d = decide(obs(faults=(CRASH,)), replace(RECORD, faults=earlier), POLICY, now=clock.now())
    assert isinstance(d, Fail) and not d.preempted
    assert "process_crash retry budget spent (3 of 3 retries used)" in d.reason
    assert "retry.max_attempts.process_crash" in d.reason


def test_a_spent_requeue_budget_fails() -> None:
    record = replace(RECORD, restarts=2, requeues=5)
    d = decide(obs(faults=(CRASH,)), record, POLICY, now=0.0)
    assert isinstance(d, Fail) and "requeue budget spent (5 of 5)" in d.reason


def test_the_same_fault_at_the_same_step_again_and_again_is_deterministic() -> None:
    again = tuple(FaultRecord(fault=FaultClass.PROCESS_CRASH, ts=0.0, slot=s, generation=g,
                              signature=CRASH.signature, step=CRASH.step)
                  for s, g in ((10, 1), (20, 2)))
    d = decide(obs(faults=(CRASH,)), replace(RECORD, faults=again), POLICY, now=0.0)
    assert isinstance(d, Fail) and "deterministic failure" in d.reason


def test_a_fault_this_incarnation_logged_counts_once() -> None:
    logged = FaultRecord(fault=FaultClass.PROCESS_CRASH, ts=0.0, slot=40, generation=4,
                         node="n1", rank=3, step=7, signature=CRASH.signature)
    policy = replace(POLICY, retry=RetryPolicy(jitter=False, max_attempts={"process_crash": 1}))
    d = decide(obs(faults=(CRASH,)), replace(RECORD, faults=(logged,)), policy, now=0.0)
    assert isinstance(d, RestartInAllocation)


def test_a_node_silent_after_the_wait_is_a_lost_node_before_slurm_says_so() -> None:
    seen = obs(exits={"n0": Ending.FAILED}, faults=(CRASH,), timed_out=True)
    d = decide(seen, RECORD, POLICY, now=0.0)
    # no spare nodes: a lost node cannot host a restart, so the run requeues
    assert isinstance(d, Requeue) and d.reason.startswith("node_failure: requeue")


def test_a_silent_node_with_a_live_spare_swaps_the_spare_into_its_place() -> None:
    seen = obs(exits={"n0": Ending.SUCCEEDED}, timed_out=True, spares=("n2",))
    d = decide(seen, RECORD, replace(POLICY, spare_nodes=1), now=0.0)
    assert isinstance(d, SwapSpare) and d.reason.startswith("node_failure")
    assert d.lost == ("n1",) and d.gang == ("n0", "n2") and d.attempt == 1


def test_a_vanished_agent_is_a_lost_node_at_once_and_a_spare_takes_its_rank() -> None:
    gang = ("n0", "n1", "n2")
    seen = obs(nodes=gang, exits={"n0": Ending.FAILED}, lost=("n1",), spares=("n3", "n4"))
    assert enough_to_decide(seen, settled=False), "nothing the lost node says can come"
    d = decide(seen, RECORD, replace(POLICY, spare_nodes=2), now=0.0)
    assert isinstance(d, SwapSpare)
    assert (d.attempt, d.lost, d.gang) == (1, ("n1",), ("n0", "n3", "n2"))
    assert d.reason == "node_failure: restart in allocation (1 of 2): n1 lost, n3 takes its place"
    assert d.fault.fault == "node_failure" and d.fault.node == "n1"


def test_a_lost_node_without_a_live_spare_requeues_without_it() -> None:
    seen = obs(exits={"n0": Ending.FAILED}, lost=("n1",), spares=())
    d = decide(seen, RECORD, replace(POLICY, spare_nodes=1), now=0.0)
    assert isinstance(d, Requeue) and d.reason.startswith("node_failure: requeue")
    assert d.exclude == ("n1",)


def test_a_requeue_after_a_node_loss_keeps_the_earlier_quarantine_too() -> None:
    seen = obs(nodes=("n0", "n2"), lost=("n2",))
    d = decide(seen, replace(RECORD, quarantined=("n1",)), replace(POLICY, min_nodes=2), now=0.0)
    assert isinstance(d, Requeue) and d.exclude == ("n1", "n2")


def test_two_lost_nodes_and_one_spare_requeue() -> None:
    seen = obs(nodes=("n0", "n1", "n2"), lost=("n1", "n2"), spares=("n3",))
    d = decide(seen, RECORD, replace(POLICY, spare_nodes=1), now=0.0)
    assert isinstance(d, Requeue)


def test_a_spent_in_allocation_budget_requeues_even_with_a_spare() -> None:
    seen = obs(lost=("n1",), spares=("n2",))
    d = decide(seen, replace(RECORD, restarts=2), replace(POLICY, spare_nodes=1), now=0.0)
    assert isinstance(d, Requeue)


def test_a_stop_pending_with_a_lost_node_never_swaps() -> None:
    d = decide(stopped(lost=("n1",), spares=("n2",)), RECORD, replace(POLICY, spare_nodes=1),
               now=0.0)
    assert not isinstance(d, SwapSpare | RestartInAllocation)


# -- elastic shrink: a lost node, no spare left, the survivors go on -------------------------
ELASTIC = replace(POLICY, min_nodes=2)
GANG3 = ("n0", "n1", "n2")


def test_an_elastic_gang_without_a_spare_shrinks_onto_its_survivors_in_the_same_job() -> None:
    seen = obs(nodes=GANG3, exits={"n0": Ending.FAILED, "n2": Ending.FAILED}, lost=("n1",))
    d = decide(seen, RECORD, ELASTIC, now=FakeClock().now())
    assert isinstance(d, Shrink)
    # node ranks are dense: n2 moves from node rank 2 to 1
    assert (d.attempt, d.lost, d.gang) == (1, ("n1",), ("n0", "n2"))
    assert d.reason == ("node_failure: restart in allocation (1 of 2): n1 lost, no spare left; "
                        "the elastic gang shrinks from 3 to 2 nodes (membership.min_nodes 2)")
    assert d.fault.fault == "node_failure" and d.fault.node == "n1"


def test_a_silent_node_of_an_elastic_gang_shrinks_it_too() -> None:
    seen = obs(nodes=GANG3, exits={"n0": Ending.SUCCEEDED, "n1": Ending.FAILED}, timed_out=True)
    d = decide(seen, RECORD, ELASTIC, now=0.0)
    assert isinstance(d, Shrink) and d.lost == ("n2",) and d.gang == ("n0", "n1")


def test_a_live_spare_is_preferred_to_a_shrink() -> None:
    seen = obs(nodes=GANG3, lost=("n1",), spares=("n3",))
    d = decide(seen, RECORD, replace(ELASTIC, spare_nodes=1), now=0.0)
    assert isinstance(d, SwapSpare) and d.gang == ("n0", "n3", "n2")


def test_an_elastic_gang_at_min_nodes_requeues_instead_of_shrinking() -> None:
    seen = obs(nodes=("n0", "n1"), lost=("n1",))
    d = decide(seen, RECORD, ELASTIC, now=0.0)
    assert isinstance(d, Requeue) and d.reason.startswith("node_failure: requeue")


def test_two_lost_nodes_shrink_only_when_enough_survive() -> None:
    four = ("n0", "n1", "n2", "n3")
    seen = obs(nodes=four, lost=("n1", "n3"))
    d = decide(seen, RECORD, ELASTIC, now=0.0)
    assert isinstance(d, Shrink) and (d.lost, d.gang) == (("n1", "n3"), ("n0", "n2"))
    assert d.reason.endswith("n1, n3 lost, no spare left; the elastic gang shrinks from 4 to 2 "
                             "nodes (membership.min_nodes 2)")
    assert isinstance(decide(seen, RECORD, replace(POLICY, min_nodes=3), now=0.0), Requeue)


def test_a_fixed_gang_never_shrinks() -> None:
    seen = obs(nodes=GANG3, lost=("n1",))
    assert isinstance(decide(seen, RECORD, POLICY, now=0.0), Requeue)


def test_a_spent_in_allocation_budget_requeues_an_elastic_gang() -> None:
    seen = obs(nodes=GANG3, lost=("n1",))
    assert isinstance(decide(seen, replace(RECORD, restarts=2), ELASTIC, now=0.0), Requeue)


def test_a_stop_pending_with_a_lost_node_never_shrinks() -> None:
    seen = obs(nodes=GANG3, lost=("n1",), stop_requested=True, stop_signum=int(signal.SIGUSR1),
               exits={"n0": Ending.PREEMPTED, "n2": Ending.PREEMPTED})
    assert not isinstance(decide(seen, RECORD, ELASTIC, now=0.0), Shrink | RestartInAllocation)


def test_the_policy_reads_min_nodes_from_an_elastic_spec_only() -> None:
    base = {"name": "t", "entrypoint": "m:f", "resources": {"nodes": 3}}
    fixed = RunSpec.from_dict(base)
    elastic = RunSpec.from_dict({**base, "membership": {"mode": "elastic", "min_nodes": 2}})
    assert DecisionPolicy.of(fixed).min_nodes is None
    assert DecisionPolicy.of(elastic).min_nodes == 2


def test_failed_nodes_with_only_peer_loss_echoes_are_a_gang_crash() -> None:
    d = decide(obs(exits=exits(Ending.FAILED, Ending.FAILED)), RECORD, POLICY, now=0.0)
    assert d == RestartInAllocation(attempt=1,
                                    reason="process_crash: restart in allocation (1 of 2)")


def test_a_preempted_gang_requeues_once_without_delay() -> None:
    d = decide(stopped(), replace(RECORD, restarts=0), POLICY, now=0.0)
    assert d == Requeue(delay_s=0.0, exclude=(), preempted=True,
                        reason="preemption: requeue after 0 s (attempt 1 of 100)")


def test_a_pending_stop_wins_over_a_fault() -> None:
    d = decide(stopped(faults=(CRASH,)), RECORD, POLICY, now=0.0)
    assert isinstance(d, Requeue) and d.preempted


def test_sigterm_on_slurm_is_left_to_slurm() -> None:
    assert isinstance(decide(stopped(signal.SIGTERM), RECORD, POLICY, now=0.0), LeaveToSlurm)


@pytest.mark.parametrize("over", [{"backend": "local"},
                                  {"preempt_signal": int(signal.SIGTERM)}])
def test_sigterm_as_the_preemption_signal_or_locally_requeues(over: dict[str, Any]) -> None:
    d = decide(stopped(signal.SIGTERM, **over), RECORD, POLICY, now=0.0)
    assert isinstance(d, Requeue) and d.preempted


def test_a_spent_preemption_budget_fails_after_recording_the_preemption() -> None:
    policy = replace(POLICY, retry=RetryPolicy(max_attempts={"preemption": 1}))
    earlier = (FaultRecord(fault=FaultClass.PREEMPTION, ts=0.0, slot=9, generation=3,
                           signature="preemption"),)
    d = decide(stopped(), replace(RECORD, faults=earlier), policy, now=0.0)
    assert isinstance(d, Fail) and d.preempted and "preemption retry budget spent" in d.reason


def test_a_node_seen_failing_twice_within_the_window_is_excluded() -> None:
    clock = FakeClock()
    earlier = (FaultRecord(fault=FaultClass.PROCESS_CRASH, ts=clock.now(), slot=10,
                           generation=2, node="n1"),)
    record = replace(RECORD, restarts=2, faults=earlier)
    clock.advance(600)
    d = decide(obs(faults=(CRASH,)), record, POLICY, now=clock.now())
    assert isinstance(d, Requeue) and d.exclude == ("n1",)
    clock.advance(3600)  # the first failure left the quarantine window
    d = decide(obs(faults=(CRASH,)), record, POLICY, now=clock.now())
    assert isinstance(d, Requeue) and d.exclude == ()


def test_root_cause_prefers_a_lost_node_then_a_real_cause_then_the_first() -> None:
    echo = GangFault(fault=FaultClass.USER_ERROR, node="n0", rank=0, signature="e")
    lost = GangFault(fault=FaultClass.NODE_FAILURE, node="n1", signature="l")
    assert root_cause([echo, CRASH, lost]) == lost
    assert root_cause([echo, CRASH]) == CRASH
    assert root_cause([echo]) == echo


def test_enough_to_decide_waits_for_every_node_or_a_settled_fault() -> None:
    assert enough_to_decide(obs(exits=exits(Ending.SUCCEEDED, Ending.SUCCEEDED)), settled=False)
    assert not enough_to_decide(obs(exits={"n0": Ending.SUCCEEDED}), settled=True)
    assert not enough_to_decide(obs(faults=(CRASH,)), settled=False)
    assert enough_to_decide(obs(faults=(CRASH,)), settled=True)
    lost = GangFault(fault=FaultClass.NODE_FAILURE, node="n1")
    assert enough_to_decide(obs(faults=(lost,)), settled=False)


def test_a_requeue_slurm_did_by_itself_is_recorded_from_its_account() -> None:
    assert requeue_unrecorded("RUNNING") and requeue_unrecorded("STARTING")
    assert not any(requeue_unrecorded(s) for s in ("REQUEUED", "PREEMPTED", None))
    past = PastRun(state=SlurmJobState.NODE_FAIL, exit_code=0, signal=None,
                   nodes=("n0", "n1"), ended_at=1234.5)
    account = account_for_requeue(past, job_id="77", restart_count=1, last_step=12)
    assert account is not None
    assert account.fault.fault == FaultClass.NODE_FAILURE and account.fault.step == 12
    assert account.fault.signature == "slurm:NODE_FAIL" and account.decided_at == 1234.5
    assert account.reason == ("Slurm requeued job 77 (restart 1) after its previous run ended "
                              "NODE_FAIL on n0,n1")
    assert account_for_requeue(None, job_id="77", restart_count=1, last_step=12) is None


# -- long runs: segments and budgets ----------------------------------------------------------

def _committed(step: int, **over: Any) -> RunRecord:
    ckpt = CheckpointRef(ckpt_id=f"c{step}", step=step, tier=Tier.SHARED, generation=4, slot=50,
                         manifest="m")
    return replace(RECORD, checkpoints=(ckpt,), **over)


BUDGETED = replace(POLICY, budgets=Budgets(max_requeues=5), allocated_nodes=2)


def test_a_stop_that_committed_progress_is_a_segment_not_a_fault() -> None:
    rec = _committed(160, segment_from_step=100, segments=11, requeues=11, alloc_since=0.0)
    d = decide(stopped(), rec, BUDGETED, now=60.0)
    assert isinstance(d, Requeue) and d.preempted and d.delay_s == 0.0
    assert d.segment is not None and (d.segment.step_from, d.segment.step_to) == (100, 160)
    assert "segment 12 ended at step 160" in d.reason


def test_a_stop_without_progress_counts_as_a_preemption_fault() -> None:
    rec = _committed(100, segment_from_step=100, requeues=5, segments=0)
    d = decide(stopped(), rec, BUDGETED, now=0.0)
    assert isinstance(d, Fail) and "requeue budget spent (5 of 5)" in d.reason


def test_the_segment_budget_ends_the_run_failed() -> None:
    policy = replace(BUDGETED, budgets=Budgets(max_segments=3))
    d = decide(stopped(), _committed(160, segments=3, alloc_since=0.0), policy, now=1.0)
    assert isinstance(d, Fail) and d.preempted and "segment budget spent (3 of 3" in d.reason


def test_a_spent_wall_budget_fails_instead_of_requeueing() -> None:
    policy = replace(BUDGETED, budgets=Budgets(max_wall_hours=1.0))
    rec = _committed(160, wall_s=3000.0, alloc_since=1000.0)
    d = decide(stopped(), rec, policy, now=1600.0)
    assert isinstance(d, Fail) and d.preempted and "wall-hour budget spent" in d.reason
    assert isinstance(decide(stopped(), rec, policy, now=1100.0), Requeue)


def test_a_spent_node_hour_budget_also_stops_a_fault_requeue() -> None:
    policy = replace(BUDGETED, budgets=Budgets(max_node_hours=1.0),
                     retry=RetryPolicy(in_allocation_restarts=0, jitter=False))
    rec = replace(RECORD, wall_s=1800.0)
    d = decide(obs(faults=(CRASH,)), rec, policy, now=0.0)
    assert isinstance(d, Fail) and "node-hour budget spent (1.000 of 1 node-hours on 2 " \
        "nodes)" in d.reason


def test_the_budget_watch_stops_the_gang_at_the_budgets_end(tmp_path: Path) -> None:
    clock = FakeClock()
    spec = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                              "budgets": {"max_wall_hours": 0.5}})
    run_dir = create_run(tmp_path, spec, clock=clock)
    flag = StopFlag()
    watch = BudgetWatch.start(run_dir, spec, clock=clock)
    clock.advance(1799.0)
    assert not watch.check(flag) and not flag.is_set
    clock.advance(1.0)
    assert watch.check(flag) and flag.is_set
    unbudgeted = replace(spec, budgets=Budgets())
    assert BudgetWatch.start(run_dir, unbudgeted, clock=clock).deadline is None
