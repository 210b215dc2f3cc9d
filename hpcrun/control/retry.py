"""Fault classes, bounded backoff, retry decisions and node quarantine (all pure).

A failure is classified into a :class:`FaultClass`; each class has its own retry budget in the
spec's :class:`~hpcrun.control.spec.RetryPolicy`. A retry is a gang restart inside the allocation
while that budget lasts (no queue wait), else a requeue after an exponential, fully jittered,
capped delay. The same fault signature at the same step ``deterministic_repeat_limit`` times is a
deterministic failure: the run fails instead of feeding a retry storm. A node seen in
``quarantine_after`` failures within ``quarantine_window_s`` is excluded from later allocations.
A preemption or time-limit stop that committed progress is a segment (:func:`segment_progress`),
not a fault: it does not count against ``budgets.max_requeues`` (:func:`fault_requeues`).
"""

from __future__ import annotations

import math
import signal as _signal
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from hpcrun.control.record import FaultRecord, RunRecord
from hpcrun.control.spec import ADDED_BUDGETS, RetryPolicy
from hpcrun.errors import ArgumentError
from hpcrun.vocab import FaultClass

NODE_SUSPECT = frozenset({
    FaultClass.NODE_FAILURE, FaultClass.PROCESS_CRASH, FaultClass.HANG, FaultClass.NONFINITE,
    FaultClass.STORAGE_ERROR, FaultClass.SDC,
})
"""Classes that count against the node they happened on (preemption and timeouts do not)."""

ALLOCATION_ENDING = frozenset({FaultClass.PREEMPTION, FaultClass.TIMEOUT})
"""Classes after which the allocation is gone: only a requeue helps, without delay."""

EXIT_USAGE = 2
"""Exit status of a worker that stopped on an :class:`~hpcrun.errors.HpcrunError` (bad input)."""


class RetryAction(StrEnum):
    """What to do about a fault."""

    RESTART = "restart"  # restart the gang inside the current allocation
    REQUEUE = "requeue"  # give the allocation back and queue again after a delay
    FAIL = "fail"        # stop: budget spent, deterministic repeat, or not retryable


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryDecision:
    """The outcome of :func:`decide_retry`."""

    action: RetryAction
    """Restart, requeue or fail."""
    fault: FaultClass
    """The class the decision is about."""
    attempt: int
    """How many faults of this class the run has seen, this one included."""
    delay_s: float = 0.0
    """Seconds to wait before the restart or the requeued job may start."""
    exclude: tuple[str, ...] = ()
    """Nodes the next allocation must avoid (quarantined)."""
    reason: str = ""
    """One line for people: why this decision."""

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.attempt < 1:
            raise ArgumentError(f"RetryDecision needs delay_s >= 0 and attempt >= 1, found "
                             f"delay_s={self.delay_s} attempt={self.attempt}")


class Random(Protocol):
    """What backoff needs from a random source (``random.Random`` fits)."""

    def random(self) -> float: ...


def backoff_bound(policy: RetryPolicy, attempt: int) -> float:
    """Upper bound of the delay before retry ``attempt`` (1-based): base·factor^(n-1), capped."""
    if attempt < 1 or policy.backoff_base_s == 0:
        return 0.0
    if policy.backoff_factor > 1:
        # compare in log space: factor**n overflows a float long before attempts run out
        log_bound = math.log(policy.backoff_base_s) + (attempt - 1) * math.log(
            policy.backoff_factor)
        if log_bound >= math.log(policy.backoff_cap_s):
            return policy.backoff_cap_s
    try:
        raw = policy.backoff_base_s * policy.backoff_factor ** (attempt - 1)
    except OverflowError:  # a tiny base times a huge power: the log form is finite
        raw = math.exp(math.log(policy.backoff_base_s)
                       + (attempt - 1) * math.log(policy.backoff_factor))
    return min(policy.backoff_cap_s, raw)


def backoff_delay(policy: RetryPolicy, attempt: int, rng: Random | None) -> float:
    """Delay before retry ``attempt``: full jitter (uniform in [0, bound]) or the bound itself."""
    bound = backoff_bound(policy, attempt)
    if not policy.jitter or rng is None:
        return bound
    return bound * rng.random()


_PREEMPT_SIGNALS = {_signal.SIGTERM, _signal.SIGUSR1, _signal.SIGUSR2}
_STATE_CLASS = {
    "PREEMPTED": FaultClass.PREEMPTION, "TIMEOUT": FaultClass.TIMEOUT,
    "DEADLINE": FaultClass.TIMEOUT, "NODE_FAIL": FaultClass.NODE_FAILURE,
    "BOOT_FAIL": FaultClass.NODE_FAILURE, "OUT_OF_MEMORY": FaultClass.PROCESS_CRASH,
}


def classify_exit(*, slurm_state: str | None = None, exit_code: int | None = None,
                  signal: int | None = None) -> FaultClass:
    """Classify a failed job or rank from what the scheduler reports.

    Args:
        slurm_state: Slurm job state (a ``SlurmJobState`` value such as ``NODE_FAIL``).
        exit_code: exit status of the batch script or rank, when it exited.
        signal: number of the signal that ended it, when it was killed.

    Returns:
        The fault class; :attr:`FaultClass.UNKNOWN` when nothing tells.
    """
    state = (slurm_state or "").upper()
    if state in _STATE_CLASS:
        return _STATE_CLASS[state]
    if signal:
        return FaultClass.PREEMPTION if signal in _PREEMPT_SIGNALS and state == "CANCELLED" \
            else FaultClass.PROCESS_CRASH
    if exit_code == EXIT_USAGE:
        return FaultClass.USER_ERROR
    if exit_code:  # a Python exception (1), or death by signal N reported as 128+N
        return FaultClass.PROCESS_CRASH
    return FaultClass.UNKNOWN


def _history(record: RunRecord, fault: FaultRecord) -> list[FaultRecord]:
    """The run's faults with ``fault`` counted once (it may already be in the record)."""
    earlier = [f for f in record.faults if fault.slot < 0 or f.slot != fault.slot]
    return [*earlier, fault]


def _incident(fault: FaultRecord) -> tuple[int, int]:
    """Faults recorded under one generation are one incident (when one rank hangs, every rank
    of the gang stops making progress and each node reports it); unfenced observations, such
    as the login node's, count one by one."""
    return (fault.generation, -1) if fault.generation >= 0 else (-1, fault.slot)


def _repeats(history: list[FaultRecord], fault: FaultRecord) -> int:
    if not fault.signature or fault.step is None:
        return 1
    return sum(1 for f in history if (f.signature, f.step) == (fault.signature, fault.step))


def decide_retry(record: RunRecord, fault: FaultRecord, policy: RetryPolicy, *,
                 max_requeues: int | None = None, spares_available: bool = True,
                 rng: Random | None = None, now: float | None = None) -> RetryDecision:
    """Decide what to do about ``fault`` given the run's history.

    Args:
        record: the run record (its ``faults``, ``restarts`` and ``requeues`` are the history).
        fault: the fault to decide about; counted once whether or not it is already in ``record``.
        policy: the spec's retry policy.
        max_requeues: the spec's requeue budget (``budgets.max_requeues``); None for no limit.
        spares_available: whether the allocation can host a restart (False after node loss
            without spare nodes).
        rng: random source for jitter; None disables jitter.
        now: time for the quarantine window; defaults to the fault's time.
    """
    history = _history(record, fault)
    cls = FaultClass(fault.fault)
    attempt = len({_incident(f) for f in history if f.fault == cls})
    exclude = tuple(sorted(set(record.quarantined) | quarantine_candidates(
        history, fault.ts if now is None else now, policy)))
    budget = policy.max_attempts.get(cls.value, ADDED_BUDGETS.get(cls.value, 0))

    def fail(reason: str) -> RetryDecision:
        return RetryDecision(action=RetryAction.FAIL, fault=cls, attempt=attempt,
                             exclude=exclude, reason=reason)

    if attempt > budget:
        return fail(f"{cls.value} retry budget spent ({attempt - 1} of {budget} retries used); "
                    f"raise retry.max_attempts.{cls.value} to allow more")
    repeats = _repeats(history, fault)
    if repeats >= policy.deterministic_repeat_limit:
        return fail(f"deterministic failure: {fault.signature!r} at step {fault.step} "
                    f"{repeats} times; fix the cause, retrying would repeat it")
    if (cls not in ALLOCATION_ENDING and spares_available
            and record.restarts < policy.in_allocation_restarts):
        return RetryDecision(action=RetryAction.RESTART, fault=cls, attempt=attempt,
                             exclude=exclude, reason=f"{cls.value}: restart in allocation "
                             f"({record.restarts + 1} of {policy.in_allocation_restarts})")
    if max_requeues is not None and fault_requeues(record) >= max_requeues:
        return fail(f"requeue budget spent ({fault_requeues(record)} of {max_requeues}); "
                    "raise budgets.max_requeues to allow more")
    delay = 0.0 if cls in ALLOCATION_ENDING else backoff_delay(policy, attempt, rng)
    return RetryDecision(action=RetryAction.REQUEUE, fault=cls, attempt=attempt, delay_s=delay,
                         exclude=exclude, reason=f"{cls.value}: requeue after {delay:.0f} s "
                         f"(attempt {attempt} of {budget})")


def fault_requeues(record: RunRecord) -> int:
    """Requeues that count against ``budgets.max_requeues``: every requeue but the segments
    (a stop that committed progress is how a long run outlives a walltime cap, not a fault)."""
    return max(0, record.requeues - record.segments)


def segment_progress(record: RunRecord) -> int | None:
    """The step a stop committed beyond where the current allocation started, or None when it
    made no progress (then the stop counts as a fault: a run killed by its time limit before
    its first commit must not requeue forever)."""
    newest = max((c.step for c in record.checkpoints), default=None)
    if newest is None or newest <= record.segment_from_step:
        return None
    return newest


def _names_culprit(f: FaultRecord) -> bool:
    """Whether the fault's node is evidence against that node. A hang is only when its
    evidence named the ranks that did not arrive (``hang:culprit:<node>:<rank>``) or the node
    itself went silent: otherwise every rank of the gang stalls waiting for the stuck one, and
    the node that reported is just where it was seen."""
    if f.fault != FaultClass.HANG:
        return True
    return f.signature.startswith(("hang:culprit:", "hang:node_silent:"))


def quarantine_candidates(faults: Iterable[FaultRecord], now: float,
                          policy: RetryPolicy) -> set[str]:
    """Nodes with at least ``quarantine_after`` node-suspect faults in the window ending ``now``."""
    since = now - policy.quarantine_window_s
    seen = {(f.node, _incident(f)) for f in faults
            if f.node and f.fault in NODE_SUSPECT and since < f.ts <= now and _names_culprit(f)}
    counts = Counter(node for node, _ in seen)
    return {node for node, n in counts.items() if n >= policy.quarantine_after}
