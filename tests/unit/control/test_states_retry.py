"""State machine, backoff, retry decisions and quarantine (pure logic, property-tested)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.control.record import FaultRecord, RunRecord
from hpcrun.control.retry import (
    FaultClass,
    RetryAction,
    backoff_bound,
    backoff_delay,
    classify_exit,
    decide_retry,
    quarantine_candidates,
)
from hpcrun.control.spec import RetryPolicy
from hpcrun.control.states import TERMINAL, RunState, can_transition, is_terminal, transition
from hpcrun.errors import TransitionError

states = st.sampled_from(list(RunState))


@settings(max_examples=200, deadline=None)
@given(st.lists(states, max_size=30))
def test_never_leaves_a_terminal_state(targets: list[RunState]) -> None:
    state = RunState.PENDING
    reached_terminal = None
    for target in targets:
        try:
            state = transition(state, target)
        except TransitionError:
            continue
        if reached_terminal is not None:
            assert state == reached_terminal
        if is_terminal(state):
            reached_terminal = state


def test_happy_path_and_requeue_cycle_are_legal() -> None:
    path = [RunState.STARTING, RunState.RUNNING, RunState.PREEMPTED, RunState.REQUEUED,
            RunState.STARTING, RunState.RUNNING, RunState.RECOVERING, RunState.STARTING,
            RunState.RUNNING, RunState.SUCCEEDED]
    state = RunState.PENDING
    for target in path:
        state = transition(state, target)
    assert state == RunState.SUCCEEDED


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_illegal_transition_message_names_both_states(terminal: RunState) -> None:
    with pytest.raises(TransitionError, match=f"from {terminal.value} to RUNNING"):
        transition(terminal, RunState.RUNNING)
    assert can_transition(terminal, terminal)


def test_pending_cannot_skip_to_succeeded() -> None:
    with pytest.raises(TransitionError):
        transition(RunState.PENDING, RunState.SUCCEEDED)


@settings(max_examples=200, deadline=None)
@given(base=st.floats(0, 100), factor=st.floats(1, 5), cap_extra=st.floats(0, 1000),
       attempt=st.integers(1, 10_000), u=st.floats(0, 1, exclude_max=True))
def test_backoff_is_within_zero_and_cap(base: float, factor: float, cap_extra: float,
                                        attempt: int, u: float) -> None:
    policy = RetryPolicy(backoff_base_s=base, backoff_factor=factor,
                         backoff_cap_s=base + cap_extra)
    rng = random.Random()
    rng.random = lambda: u  # type: ignore[method-assign]
    delay = backoff_delay(policy, attempt, rng)
    assert 0 <= delay <= policy.backoff_cap_s


@settings(max_examples=100, deadline=None)
@given(base=st.floats(0.1, 50), factor=st.floats(1.01, 4), attempt=st.integers(1, 200))
def test_backoff_grows_with_attempt_without_jitter(base: float, factor: float,
                                                  attempt: int) -> None:
    policy = RetryPolicy(backoff_base_s=base, backoff_factor=factor, backoff_cap_s=base * 1e6,
                         jitter=False)
    now, nxt = backoff_delay(policy, attempt, None), backoff_delay(policy, attempt + 1, None)
    assert nxt >= now
    if now < policy.backoff_cap_s:
        assert nxt > now
    assert backoff_bound(policy, 1) == pytest.approx(base)


def _fault(cls: FaultClass = FaultClass.PROCESS_CRASH, *, slot: int, ts: float = 1000.0,
           node: str | None = None, step: int | None = 50, sig: str = "RuntimeError@train:42"
           ) -> FaultRecord:
    return FaultRecord(fault=cls, ts=ts, slot=slot, node=node, step=step, signature=sig)


def _record(faults: tuple[FaultRecord, ...] = (), *, restarts: int = 0,
            requeues: int = 0) -> RunRecord:
    return RunRecord(run_id="r", spec_id="s", state=RunState.RUNNING, faults=faults,
                     restarts=restarts, requeues=requeues)


def test_restart_inside_allocation_then_requeue_with_backoff() -> None:
    policy = RetryPolicy(in_allocation_restarts=1, jitter=False, deterministic_repeat_limit=10)
    first = decide_retry(_record(), _fault(slot=5, step=10), policy)
    assert first.action == RetryAction.RESTART and first.delay_s == 0
    second = decide_retry(_record((_fault(slot=5, step=10),), restarts=1),
                          _fault(slot=9, step=20), policy)
    assert second.action == RetryAction.REQUEUE
    assert second.delay_s == policy.backoff_base_s * policy.backoff_factor  # attempt 2


def test_deterministic_repeat_escalates_to_failed() -> None:
    policy = RetryPolicy(deterministic_repeat_limit=3,
                         max_attempts={"process_crash": 100})
    history = (_fault(slot=1), _fault(slot=2))
    decision = decide_retry(_record(history), _fault(slot=3), policy)
    assert decision.action == RetryAction.FAIL
    assert "deterministic" in decision.reason and "step 50" in decision.reason
    # the same fault at different steps is not deterministic
    moving = (_fault(slot=1, step=10), _fault(slot=2, step=20))
    assert decide_retry(_record(moving), _fault(slot=3, step=30), policy).action \
        != RetryAction.FAIL


def test_fault_already_in_the_record_is_counted_once() -> None:
    policy = RetryPolicy(deterministic_repeat_limit=3, max_attempts={"process_crash": 100})
    history = (_fault(slot=1), _fault(slot=2))
    assert decide_retry(_record(history), history[-1], policy).action != RetryAction.FAIL


def test_per_class_budget_is_enforced() -> None:
    policy = RetryPolicy(max_attempts={"hang": 1}, deterministic_repeat_limit=10)
    history = (_fault(FaultClass.HANG, slot=1, step=1),)
    decision = decide_retry(_record(history), _fault(FaultClass.HANG, slot=2, step=2), policy)
    assert decision.action == RetryAction.FAIL
    assert "retry.max_attempts.hang" in decision.reason
    user = decide_retry(_record(), _fault(FaultClass.USER_ERROR, slot=1), RetryPolicy())
    assert user.action == RetryAction.FAIL  # user errors get no retries by default


def test_preemption_requeues_at_once_and_respects_requeue_budget() -> None:
    policy = RetryPolicy()
    decision = decide_retry(_record(), _fault(FaultClass.PREEMPTION, slot=1), policy,
                            max_requeues=5)
    assert decision.action == RetryAction.REQUEUE and decision.delay_s == 0
    spent = decide_retry(_record(requeues=5), _fault(FaultClass.PREEMPTION, slot=1), policy,
                         max_requeues=5)
    assert spent.action == RetryAction.FAIL and "budgets.max_requeues" in spent.reason


def test_quarantine_after_k_failures_inside_window_only() -> None:
    policy = RetryPolicy(quarantine_after=2, quarantine_window_s=3600)
    inside = [_fault(slot=1, ts=1000, node="n3"), _fault(slot=2, ts=4000, node="n3"),
              _fault(slot=3, ts=4000, node="n4")]
    assert quarantine_candidates(inside, 4500, policy) == {"n3"}
    # the first failure has left the window by now
    assert quarantine_candidates(inside, 1000 + 3600 + 1, policy) == set()
    preempted = [_fault(FaultClass.PREEMPTION, slot=i, ts=4000, node="n5") for i in range(5)]
    assert quarantine_candidates(preempted, 4500, policy) == set()
    # a start-up hang names the node that noticed, not the stuck one: no evidence against it
    unstarted = [_fault(FaultClass.HANG, slot=i, ts=4000, node="n6",
                        sig="hang:never_stepped:n6:0") for i in range(5)]
    assert quarantine_candidates(unstarted, 4500, policy) == set()
    # a hang stalls every rank of the gang: only the node its evidence names is suspect
    unnamed = [_fault(FaultClass.HANG, slot=i, ts=4000, node="n7",
                      sig="hang:no_progress:n7:0") for i in range(5)]
    named = [_fault(FaultClass.HANG, slot=10 + i, ts=4000, node="n8",
                    sig="hang:culprit:n8:3") for i in range(2)]
    assert quarantine_candidates(unnamed + named, 4500, policy) == {"n8"}


def test_decision_excludes_quarantined_nodes() -> None:
    policy = RetryPolicy(quarantine_after=2, in_allocation_restarts=0,
                         deterministic_repeat_limit=10)
    history = (_fault(slot=1, ts=1000, node="n3", step=1),)
    decision = decide_retry(_record(history), _fault(slot=2, ts=1100, node="n3", step=2),
                            policy)
    assert decision.exclude == ("n3",)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"slurm_state": "PREEMPTED"}, FaultClass.PREEMPTION),
    ({"slurm_state": "TIMEOUT"}, FaultClass.TIMEOUT),
    ({"slurm_state": "NODE_FAIL"}, FaultClass.NODE_FAILURE),
    ({"slurm_state": "OUT_OF_MEMORY", "exit_code": 0, "signal": 9}, FaultClass.PROCESS_CRASH),
    ({"slurm_state": "FAILED", "exit_code": 0, "signal": 9}, FaultClass.PROCESS_CRASH),
    ({"slurm_state": "FAILED", "exit_code": 2}, FaultClass.USER_ERROR),
    ({"slurm_state": "FAILED", "exit_code": 1}, FaultClass.PROCESS_CRASH),
    ({"slurm_state": "COMPLETED", "exit_code": 0}, FaultClass.UNKNOWN),
])
def test_classify_exit(kwargs: dict, expected: FaultClass) -> None:
    assert classify_exit(**kwargs) == expected
