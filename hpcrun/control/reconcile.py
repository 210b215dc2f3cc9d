"""Reconcile a run's record with what Slurm says, between allocations (login node).

:func:`reconcile` is pure: ``(record, observation, now, policy) -> [Action]``. Each action carries
an ``op_id`` that is a digest of (run, generation, action kind, attempt), so a pass re-run after a
crash plans the same ids, and an unfinished operation of an earlier pass is resumed under its
original id. The effectful shell (execute the actions, one watch pass) is
:mod:`hpcrun.control.watch`.

The login node writes run state only when no incarnation can be starting under the job (the job
has ended, vanished, is held, or is about to be requeued by us): its fence would void a fresh
incarnation's entries otherwise.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from hpcrun.control.depend import never_satisfied, never_satisfied_reason
from hpcrun.control.entries import ActionKind, OpPayload, OpPhase
from hpcrun.control.lease import live_lease
from hpcrun.control.record import FaultRecord, RunRecord
from hpcrun.control.retry import (
    FaultClass,
    RetryAction,
    classify_exit,
    decide_retry,
    fault_requeues,
)
from hpcrun.control.spec import RetryPolicy, RunSpec
from hpcrun.control.states import RunState, is_terminal
from hpcrun.scheduler.slurm import ACTIVE, Observation, SlurmJobState

__all__ = [
    "Action",
    "ActionKind",
    "Cancel",
    "ExcludeNodes",
    "MarkFailed",
    "MarkState",
    "Observation",
    "ReconcilePolicy",
    "ReconcileRequeue",
    "RecordFault",
    "Release",
    "SetBeginTime",
    "Submit",
    "awaiting_node_state",
    "op_id_for",
    "reconcile",
]

_ALIVE = frozenset({SlurmJobState.RUNNING, SlurmJobState.COMPLETING, SlurmJobState.SIGNALING,
                    SlurmJobState.STAGE_OUT, SlurmJobState.CONFIGURING})


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """One step towards the desired state; ``op_id`` makes it idempotent."""

    kind: ClassVar[ActionKind]
    op_id: str
    """Deterministic id: digest of (run, generation, kind, attempt)."""
    attempt: str
    """What makes this operation distinct from the previous one of its kind."""

    def payload(self) -> dict[str, Any]:
        """The action's fields as JSON values."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def op_entry(self, phase: OpPhase, **outcome: Any) -> OpPayload:
        """The ``op`` entry of one phase of this action: its fields plus ``outcome`` (the try
        an intent claims, a failure's error, what ``done`` produced)."""
        return OpPayload.from_payload({**self.payload(), **outcome, "action": self.kind.value,
                                       "phase": phase.value})


@dataclass(frozen=True, kw_only=True, slots=True)
class Submit(Action):
    """``sbatch`` a fresh job (the previous one is gone), not before ``delay_s``."""

    kind: ClassVar[ActionKind] = ActionKind.SUBMIT
    delay_s: float = 0.0
    """Seconds before the job may start (``--begin=now+N``)."""
    exclude: tuple[str, ...] = ()
    """Nodes to avoid (``--exclude``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileRequeue(Action):
    """requeuehold → update StartTime/ExcNodeList/Comment → release, on the same job id."""

    kind: ClassVar[ActionKind] = ActionKind.REQUEUE
    job_id: str
    """Job to requeue."""
    delay_s: float = 0.0
    """Backoff before it may start again."""
    exclude: tuple[str, ...] = ()
    """Nodes to avoid."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SetBeginTime(Action):
    """Delay a pending job (``scontrol update StartTime=now+N``)."""

    kind: ClassVar[ActionKind] = ActionKind.SET_BEGIN_TIME
    job_id: str
    """Pending job."""
    delay_s: float
    """Seconds from now."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExcludeNodes(Action):
    """Keep a pending job off nodes (``scontrol update ExcNodeList=...``)."""

    kind: ClassVar[ActionKind] = ActionKind.EXCLUDE_NODES
    job_id: str
    """Pending job."""
    nodes: tuple[str, ...]
    """Nodes to exclude."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Release(Action):
    """Release a held job."""

    kind: ClassVar[ActionKind] = ActionKind.RELEASE
    job_id: str
    """Held job."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cancel(Action):
    """scancel a job that should not run (the record is terminal)."""

    kind: ClassVar[ActionKind] = ActionKind.CANCEL
    job_id: str
    """Job to cancel."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkFailed(Action):
    """Record the run as FAILED (a fenced result entry)."""

    kind: ClassVar[ActionKind] = ActionKind.MARK_FAILED
    reason: str
    """One line: why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkState(Action):
    """Record a state change (a fenced state entry)."""

    kind: ClassVar[ActionKind] = ActionKind.MARK_STATE
    state: RunState
    """Target state."""
    reason: str
    """One line: why."""
    not_before: float | None = None
    """For REQUEUED: earliest start of the next allocation (epoch seconds)."""
    exclude: tuple[str, ...] = ()
    """For REQUEUED: nodes the next allocation avoids."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordFault(Action):
    """Record a fault the scheduler reported (an unfenced observation)."""

    kind: ClassVar[ActionKind] = ActionKind.RECORD_FAULT
    fault: FaultClass
    """Its class."""
    signature: str
    """Fingerprint for deterministic-repeat detection."""
    detail: str
    """One line for people."""
    step: int | None = None
    """Last validated step when it was seen."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcilePolicy:
    """What reconcile needs beyond the record: retry rules and site behaviour."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """The spec's retry policy."""
    max_requeues: int | None = None
    """The spec's requeue budget."""
    hang_timeout_s: float = 900.0
    """Heartbeat age after which a running job counts as hung (the in-job agent reacts sooner)."""
    preempt_mode: str = "requeue"
    """Site's Slurm PreemptMode; with ``requeue`` Slurm requeues preempted jobs itself."""
    exclude: tuple[str, ...] = ()
    """Nodes the spec always excludes (merged into every new exclusion list)."""
    node_settle_s: float = 0.0
    """How long a FAILED job's lost node may still look healthy to slurmctld: a node that dies
    before Slurm notices makes ``srun`` abort, and the job ends FAILED instead of NODE_FAIL.
    Within this time of the end, a FAILED job whose nodes all look up waits for the next pass."""

    @classmethod
    def from_spec(cls, spec: RunSpec, **overrides: Any) -> ReconcilePolicy:
        return cls(retry=spec.retry, max_requeues=spec.budgets.max_requeues,
                   exclude=spec.resources.exclude, **overrides)


def op_id_for(record: RunRecord, kind: ActionKind, attempt: str) -> str:
    """Deterministic op id from (run, generation, kind, attempt)."""
    key = f"{record.run_id}|{record.generation}|{kind.value}|{attempt}"
    return f"{kind.value}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _unfinished(record: RunRecord, kind: ActionKind, **match: Any) -> Mapping[str, Any] | None:
    """The newest operation of ``kind`` whose fields match and that is not done."""
    found = [op for op in record.ops.values() if op.get("action") == kind.value
             and op.get("phase") != "done" and all(op.get(k) == v for k, v in match.items())]
    return max(found, key=lambda op: op["slot"], default=None)


def reconcile(record: RunRecord, observed: Observation | None, now: float,
              policy: ReconcilePolicy) -> list[Action]:
    """Actions that bring the run back towards its desired state (pure).

    Args:
        record: the folded run record.
        observed: what Slurm says about the run's newest job (None when it has no job yet),
            with ``heartbeat_age_s`` filled when known.
        now: wall-clock time (epoch seconds).
        policy: retry rules and site behaviour.

    Nothing is planned while another pass's operation holds its lease on the run
    (:mod:`hpcrun.control.lease`): that pass is still sending it.
    """
    if live_lease(record.op_claims, now) is not None:
        return []
    if is_terminal(record.state):
        return _cleanup(record, observed)
    if observed is None:
        return _resume_submit(record)
    if observed.held:
        return _on_held(record, observed, policy)
    if record.state == RunState.REQUEUED:
        return _while_requeued(record, observed, now, policy)
    return _while_live(record, observed, now, policy)


def _cleanup(record: RunRecord, obs: Observation | None) -> list[Action]:
    if obs is None or obs.state not in ACTIVE:
        return []
    return [Cancel(op_id=op_id_for(record, ActionKind.CANCEL, obs.job_id),
                   attempt=obs.job_id, job_id=obs.job_id)]


def _submit(record: RunRecord, delay_s: float, exclude: Sequence[str]) -> Submit:
    attempt = str(len(record.job_ids))
    pending = _unfinished(record, ActionKind.SUBMIT, attempt=attempt)
    if pending is not None:  # resume under the original id: execute checks the job's comment
        return Submit(op_id=pending["op_id"], attempt=attempt,
                      delay_s=float(pending.get("delay_s", 0.0)),
                      exclude=tuple(pending.get("exclude", ())))
    return Submit(op_id=op_id_for(record, ActionKind.SUBMIT, attempt), attempt=attempt,
                  delay_s=delay_s, exclude=tuple(exclude))


def _resume_submit(record: RunRecord) -> list[Action]:
    """No job yet: only finish a submission an earlier pass started (``hpcrun submit`` owns
    the first one)."""
    pending = _unfinished(record, ActionKind.SUBMIT, attempt=str(len(record.job_ids)))
    return [] if pending is None else [_submit(record, 0.0, ())]


def _on_held(record: RunRecord, obs: Observation, policy: ReconcilePolicy) -> list[Action]:
    pending = _unfinished(record, ActionKind.REQUEUE, job_id=obs.job_id)
    if pending is not None:  # our requeuehold went through, the update/release did not
        return [ReconcileRequeue(op_id=pending["op_id"], attempt=pending["attempt"],
                                 job_id=obs.job_id, delay_s=float(pending.get("delay_s", 0.0)),
                                 exclude=tuple(pending.get("exclude", ())))]
    attempt = f"{obs.job_id}:{record.requeues}"
    if obs.admin_held and policy.max_requeues is not None \
            and fault_requeues(record) >= policy.max_requeues:
        reason = (f"Slurm holds job {obs.job_id} ({obs.reason}) and the requeue budget is spent "
                  f"({fault_requeues(record)} of {policy.max_requeues})")
        return [MarkFailed(op_id=op_id_for(record, ActionKind.MARK_FAILED, attempt),
                           attempt=attempt, reason=reason),
                Cancel(op_id=op_id_for(record, ActionKind.CANCEL, obs.job_id),
                       attempt=obs.job_id, job_id=obs.job_id)]
    return [Release(op_id=op_id_for(record, ActionKind.RELEASE, attempt), attempt=attempt,
                    job_id=obs.job_id)]


def _while_requeued(record: RunRecord, obs: Observation, now: float,
                    policy: ReconcilePolicy) -> list[Action]:
    if obs.state in ACTIVE:
        return []  # the requeued job waits for its allocation
    info = record.state_info or {}
    not_before = info.get("not_before")
    delay = max(0.0, float(not_before) - now) if isinstance(not_before, int | float) else 0.0
    exclude = info.get("exclude") if isinstance(info.get("exclude"), list) else []
    return [_submit(record, delay, _merge(policy.exclude, exclude or []))]


def _while_live(record: RunRecord, obs: Observation, now: float,
                policy: ReconcilePolicy) -> list[Action]:
    state = obs.state
    if obs.vanished:
        return _retry(record, obs, FaultClass.UNKNOWN, "job vanished from squeue and sacct",
                      now, policy)
    if state in _ALIVE:
        age = obs.heartbeat_age_s
        hung = (record.state in (RunState.RUNNING, RunState.RECOVERING) and age is not None
                and age > policy.hang_timeout_s)
        return _retry(record, obs, FaultClass.HANG, f"no heartbeat for {age:.0f} s",
                      now, policy) if hung else []
    if state == SlurmJobState.PENDING and never_satisfied(obs.reason):
        return _dependency_failed(record, obs)
    if state in ACTIVE:
        return _exclude_quarantined(record, obs)
    if state == SlurmJobState.PREEMPTED and policy.preempt_mode == "requeue" \
            and obs.in_controller:
        return []  # Slurm requeues it by itself: never requeue twice
    if state == SlurmJobState.CANCELLED:
        attempt = f"{obs.job_id}:{record.requeues}"
        return [MarkState(op_id=op_id_for(record, ActionKind.MARK_STATE, attempt),
                          attempt=attempt, state=RunState.CANCELLED,
                          reason=f"job {obs.job_id} was cancelled outside hpcrun")]
    if obs.down_nodes and state != SlurmJobState.COMPLETED:
        return _retry(record, obs, FaultClass.NODE_FAILURE,
                      f"job {obs.job_id} ended {state.value}; node(s) "
                      f"{','.join(obs.down_nodes)} down or not responding", now, policy)
    if awaiting_node_state(obs, policy):
        return []  # a lost node may not be flagged yet: classify on a later pass
    fault = FaultClass.UNKNOWN if state == SlurmJobState.COMPLETED else classify_exit(
        slurm_state=state.value, exit_code=obs.exit_code, signal=obs.signal)
    detail = f"job {obs.job_id} ended {state.value} (exit {obs.exit_code}, signal " \
             f"{obs.signal}) without a result"
    return _retry(record, obs, fault, detail, now, policy)


def _dependency_failed(record: RunRecord, obs: Observation) -> list[Action]:
    """Slurm says the job's dependency can never be met (its upstream failed): the run ends
    CANCELLED with the reason, and the job leaves the queue."""
    attempt = f"{obs.job_id}:{record.requeues}"
    return [MarkState(op_id=op_id_for(record, ActionKind.MARK_STATE, attempt), attempt=attempt,
                      state=RunState.CANCELLED,
                      reason=never_satisfied_reason(obs.job_id, record.after)),
            Cancel(op_id=op_id_for(record, ActionKind.CANCEL, obs.job_id), attempt=obs.job_id,
                   job_id=obs.job_id)]


def awaiting_node_state(obs: Observation, policy: ReconcilePolicy) -> bool:
    """A FAILED job, none of whose nodes Slurm reports lost yet, that ended less than the
    site's settle time ago: srun aborts before slurmctld marks a dead node down (pure)."""
    return (obs.state == SlurmJobState.FAILED and not obs.down_nodes
            and obs.ended_s_ago is not None and obs.ended_s_ago < policy.node_settle_s)


def _exclude_quarantined(record: RunRecord, obs: Observation) -> list[Action]:
    """A job Slurm requeued by itself still avoids the nodes quarantined since it was queued."""
    if not record.quarantined:
        return []
    attempt = f"{obs.job_id}:{record.requeues}:{','.join(record.quarantined)}"
    op_id = op_id_for(record, ActionKind.EXCLUDE_NODES, attempt)
    if record.op_done(op_id):
        return []
    return [ExcludeNodes(op_id=op_id, attempt=attempt, job_id=obs.job_id,
                         nodes=record.quarantined)]


def _merge(*lists: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted({n for lst in lists for n in lst}))


def _retry(record: RunRecord, obs: Observation, cls: FaultClass, detail: str, now: float,
           policy: ReconcilePolicy) -> list[Action]:
    """Record the fault once, then requeue (or resubmit) with backoff, or fail."""
    attempt = f"{obs.job_id}:{record.requeues}"
    rf_id = op_id_for(record, ActionKind.RECORD_FAULT, attempt)
    logged = [f for f in record.faults if f.op_id == rf_id]
    signature = f"slurm:{obs.state.value}:{obs.exit_code}:{obs.signal}"
    fault = logged[0] if logged else FaultRecord(
        fault=cls, ts=now, step=record.step, signature=signature, detail=detail, op_id=rf_id)
    actions: list[Action] = [] if logged else [RecordFault(
        op_id=rf_id, attempt=attempt, fault=cls, signature=signature, detail=detail,
        step=record.step)]
    decision = decide_retry(record, fault, policy.retry, max_requeues=policy.max_requeues,
                            spares_available=False, now=now,
                            rng=random.Random(rf_id))  # jitter, yet the same on a re-run
    if decision.action == RetryAction.FAIL:
        actions.append(MarkFailed(op_id=op_id_for(record, ActionKind.MARK_FAILED, attempt),
                                  attempt=attempt, reason=decision.reason))
        if obs.state in ACTIVE:
            actions.append(Cancel(op_id=op_id_for(record, ActionKind.CANCEL, obs.job_id),
                                  attempt=obs.job_id, job_id=obs.job_id))
        return actions
    exclude = _merge(policy.exclude, decision.exclude)
    actions.append(MarkState(
        op_id=op_id_for(record, ActionKind.MARK_STATE, attempt), attempt=attempt,
        state=RunState.REQUEUED, reason=decision.reason, not_before=now + decision.delay_s,
        exclude=exclude))
    if obs.state in _ALIVE:  # hung: requeue the same job id once we hold the fence
        actions.append(ReconcileRequeue(op_id=op_id_for(record, ActionKind.REQUEUE, attempt),
                               attempt=attempt, job_id=obs.job_id, delay_s=decision.delay_s,
                               exclude=exclude))
    else:
        actions.append(_submit(record, decision.delay_s, exclude))
    return actions
