"""The run state machine (pure).

::

    PENDING ─► STARTING ─► RUNNING ─► SUCCEEDED
                  ▲  │        │
                  │  └───►────┼──► PREEMPTED ──► REQUEUED ──► STARTING ...
                  │           └──► RECOVERING ─► STARTING (restart inside the allocation)
                  └────────────────────────────────────────┘
    any non-terminal state ─► FAILED | CANCELLED

Checkpointing is not a state: saves are asynchronous and tracked per checkpoint. Terminal states
(SUCCEEDED, FAILED, CANCELLED) are never left; recording the same state again is a no-op.
"""

from __future__ import annotations

from hpcrun.errors import TransitionError
from hpcrun.vocab import TERMINAL, RunState

__all__ = ["TERMINAL", "TRANSITIONS", "RunState", "can_transition", "is_terminal", "transition"]



_ENDINGS = frozenset({RunState.FAILED, RunState.CANCELLED})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.STARTING, RunState.REQUEUED}) | _ENDINGS,
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.RECOVERING, RunState.PREEMPTED,
                                  RunState.REQUEUED, RunState.SUCCEEDED}) | _ENDINGS,
    # RUNNING → STARTING: Slurm requeued the job (node failure, --requeue) and it started again
    # before anyone recorded REQUEUED.
    RunState.RUNNING: frozenset({RunState.STARTING, RunState.PREEMPTED, RunState.RECOVERING,
                                 RunState.REQUEUED, RunState.SUCCEEDED}) | _ENDINGS,
    # Slurm may requeue a preempted job by itself (PreemptMode=REQUEUE): it starts again
    # without anyone having recorded REQUEUED.
    RunState.PREEMPTED: frozenset({RunState.REQUEUED, RunState.STARTING}) | _ENDINGS,
    RunState.RECOVERING: frozenset({RunState.STARTING, RunState.RUNNING, RunState.PREEMPTED,
                                    RunState.REQUEUED}) | _ENDINGS,
    RunState.REQUEUED: frozenset({RunState.PENDING, RunState.STARTING}) | _ENDINGS,
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}
"""Legal targets of each state (besides staying in it)."""


def is_terminal(state: RunState) -> bool:
    """Whether ``state`` ends the run."""
    return state in TERMINAL


def can_transition(current: RunState, target: RunState) -> bool:
    """Whether ``current → target`` is legal (staying in a state always is)."""
    return current == target or target in TRANSITIONS[current]


def transition(current: RunState, target: RunState) -> RunState:
    """Return ``target`` when the change is legal.

    Raises:
        TransitionError: the state machine does not allow ``current → target``.
    """
    if not can_transition(current, target):
        allowed = sorted(s.value for s in TRANSITIONS[current]) or ["none: terminal"]
        raise TransitionError(
            f"run state cannot go from {current.value} to {target.value}; from {current.value} "
            f"it may go to {', '.join(allowed)}; a terminal run must be resubmitted as a new run"
        )
    return target
