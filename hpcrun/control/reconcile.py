"""Reconcile a run's record with what Slurm says, between allocations (login node).

:func:`reconcile` is pure: ``(record, observation, now, policy) -> [Action]``. Each action carries
an ``op_id`` that is a digest of (run, generation, action kind, attempt), so a pass re-run after a
crash plans the same ids, and an unfinished operation of an earlier pass is resumed under its
original id. :func:`execute` is the effectful shell: it logs the operation's intent *before*
sending it, tags the job with ``--comment=hpcrun:<op_id>``, and logs ``done`` after. An operation
already ``done`` is skipped; of two passes racing on the same operation, the intent in the earlier
slot wins (the log's order decides, as with fences). :func:`watch_once` is one bounded,
lock-free pass for ``hpcrun status`` and a cron-safe ``hpcrun watch``.

The login node writes run state only when no incarnation can be starting under the job (the job
has ended, vanished, is held, or is about to be requeued by us): its fence would void a fresh
incarnation's entries otherwise.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from hpcrun.clock import Clock
from hpcrun.control.fencing import UNFENCED, Fence
from hpcrun.control.log import EntryKind, LogEntry, RunLog, new_holder
from hpcrun.control.record import FaultRecord, RunRecord, load_run_spec, read_record
from hpcrun.control.retry import FaultClass, RetryAction, classify_exit, decide_retry
from hpcrun.control.spec import RetryPolicy, RunSpec
from hpcrun.control.states import RunState, is_terminal
from hpcrun.errors import HpcrunError, SchedulerError
from hpcrun.launch.slurm import (
    ACTIVE,
    Observation,
    SlurmClient,
    SlurmJobState,
    parse_slurm_time,
)
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = [
    "Action", "ActionKind", "Cancel", "ExcludeNodes", "MarkFailed", "MarkState", "Observation",
    "Outcome", "ReconcilePolicy", "RecordFault", "Release", "Requeue", "SetBeginTime", "Submit",
    "WatchResult", "execute", "op_id_for", "reconcile", "watch_once",
]

_ALIVE = frozenset({SlurmJobState.RUNNING, SlurmJobState.COMPLETING, SlurmJobState.SIGNALING,
                    SlurmJobState.STAGE_OUT, SlurmJobState.CONFIGURING})


class ActionKind(StrEnum):
    """What an action does."""

    SUBMIT = "submit"
    REQUEUE = "requeue"
    SET_BEGIN_TIME = "set_begin_time"
    EXCLUDE_NODES = "exclude_nodes"
    RELEASE = "release"
    CANCEL = "cancel"
    MARK_FAILED = "mark_failed"
    MARK_STATE = "mark_state"
    RECORD_FAULT = "record_fault"


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """One step towards the desired state; ``op_id`` makes it idempotent."""

    kind: ClassVar[ActionKind]
    op_id: str
    """Deterministic id: digest of (run, generation, kind, attempt)."""
    attempt: str
    """What makes this operation distinct from the previous one of its kind."""

    def payload(self) -> dict[str, Any]:
        """Fields for the ``op`` log entry (JSON values)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class Submit(Action):
    """``sbatch`` a fresh job (the previous one is gone), not before ``delay_s``."""

    kind: ClassVar[ActionKind] = ActionKind.SUBMIT
    delay_s: float = 0.0
    """Seconds before the job may start (``--begin=now+N``)."""
    exclude: tuple[str, ...] = ()
    """Nodes to avoid (``--exclude``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Requeue(Action):
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
    """
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
        return [Requeue(op_id=pending["op_id"], attempt=pending["attempt"], job_id=obs.job_id,
                        delay_s=float(pending.get("delay_s", 0.0)),
                        exclude=tuple(pending.get("exclude", ())))]
    attempt = f"{obs.job_id}:{record.requeues}"
    if obs.admin_held and policy.max_requeues is not None \
            and record.requeues >= policy.max_requeues:
        reason = (f"Slurm holds job {obs.job_id} ({obs.reason}) and the requeue budget is spent "
                  f"({record.requeues} of {policy.max_requeues})")
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
    if state == SlurmJobState.FAILED and obs.ended_s_ago is not None \
            and obs.ended_s_ago < policy.node_settle_s:
        return []  # a lost node may not be flagged yet: classify on a later pass
    fault = FaultClass.UNKNOWN if state == SlurmJobState.COMPLETED else classify_exit(
        slurm_state=state.value, exit_code=obs.exit_code, signal=obs.signal)
    detail = f"job {obs.job_id} ended {state.value} (exit {obs.exit_code}, signal " \
             f"{obs.signal}) without a result"
    return _retry(record, obs, fault, detail, now, policy)


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
        actions.append(Requeue(op_id=op_id_for(record, ActionKind.REQUEUE, attempt),
                               attempt=attempt, job_id=obs.job_id, delay_s=decision.delay_s,
                               exclude=exclude))
    else:
        actions.append(_submit(record, decision.delay_s, exclude))
    return actions


# ---------------------------------------------------------------- effectful shell


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What :func:`execute` did with one action."""

    op_id: str
    """The operation."""
    kind: ActionKind
    """Its kind."""
    status: str
    """``done``, ``already-done`` or ``elsewhere`` (another pass claimed it first)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """What it produced (e.g. the job id of a submit)."""


Submitter = Callable[[Submit, str], str]
"""Submits a fresh job for a :class:`Submit` with the given ``--comment``; returns its id."""


def script_submitter(run_dir: str | os.PathLike[str], slurm: SlurmClient) -> Submitter:
    """Resubmit ``<run_dir>/job.sh`` (the batch script written at submit)."""
    script = Path(run_dir) / "job.sh"

    def submit(action: Submit, comment: str) -> str:
        if not script.exists():
            raise SchedulerError(f"cannot resubmit: {script} is missing; expected the batch "
                                 "script written by `hpcrun submit`; resubmit the run by hand")
        args = [f"--comment={comment}"]
        if action.delay_s > 0:
            args.append(f"--begin=now+{math.ceil(action.delay_s)}")
        if action.exclude:
            args.append(f"--exclude={','.join(action.exclude)}")
        return slurm.sbatch(script, args)

    return submit


class _Executor:
    def __init__(self, *, log: RunLog, slurm: SlurmClient, record: RunRecord,
                 fence: Fence | None, submitter: Submitter | None, holder_prefix: str) -> None:
        self.log, self.slurm, self.record = log, slurm, record
        self.fence, self.submitter, self.holder_prefix = fence, submitter, holder_prefix

    def run(self, action: Action) -> Outcome:
        if self.record.op_done(action.op_id):
            return Outcome(op_id=action.op_id, kind=action.kind, status="already-done")
        known = self.record.ops.get(action.op_id)
        try_no = len(known.get("tries", {})) if known else 0
        mine = self._op(action, "intent", {"try": try_no})
        if not self._won(action.op_id, try_no, mine.slot):
            return Outcome(op_id=action.op_id, kind=action.kind, status="elsewhere")
        try:
            detail = self._perform(action, resumed=known is not None)
        except HpcrunError as exc:
            self._op(action, "failed", {"error": str(exc)})
            raise
        self._op(action, "done", detail)
        return Outcome(op_id=action.op_id, kind=action.kind, status="done", detail=detail)

    def _op(self, action: Action, phase: str, extra: Mapping[str, Any]) -> LogEntry:
        payload = {**action.payload(), **extra, "action": action.kind.value, "phase": phase}
        return self.log.append(EntryKind.OP, generation=UNFENCED, holder="", payload=payload)

    def _won(self, op_id: str, try_no: int, slot: int) -> bool:
        """Whether our intent is the first claim of this try (log order decides)."""
        for e in self.log.read(since_slot=self.record.last_slot + 1):
            p = e.payload
            if (e.kind == EntryKind.OP and p.get("op_id") == op_id and p.get("phase") == "intent"
                    and p.get("try") == try_no):
                return e.slot == slot
        return True

    def _fenced(self, kind: str, payload: Mapping[str, Any]) -> None:
        if self.fence is None:
            claim = self.log.claim(new_holder(self.holder_prefix))
            self.fence = Fence(generation=claim.generation, holder=claim.holder, slot=claim.slot)
        self.log.publish(kind, generation=self.fence.generation, holder=self.fence.holder,
                         payload=payload)

    def _perform(self, action: Action, *, resumed: bool) -> dict[str, Any]:
        handler = getattr(self, f"_do_{action.kind.value}")
        return handler(action, resumed)  # type: ignore[no-any-return]

    def _do_record_fault(self, a: RecordFault, resumed: bool) -> dict[str, Any]:
        self.log.append(EntryKind.FAULT, generation=UNFENCED, holder="", payload={
            "fault": a.fault.value, "node": None, "rank": None, "step": a.step,
            "signature": a.signature, "detail": a.detail, "op_id": a.op_id})
        return {}

    def _do_mark_state(self, a: MarkState, resumed: bool) -> dict[str, Any]:
        self._fenced(EntryKind.STATE, {"state": a.state.value, "reason": a.reason,
                                       "not_before": a.not_before, "exclude": list(a.exclude),
                                       "op_id": a.op_id})
        return {}

    def _do_mark_failed(self, a: MarkFailed, resumed: bool) -> dict[str, Any]:
        self._fenced(EntryKind.RESULT, {"state": RunState.FAILED.value, "reason": a.reason,
                                        "op_id": a.op_id})
        return {}

    def _do_submit(self, a: Submit, resumed: bool) -> dict[str, Any]:
        comment = f"hpcrun:{a.op_id}"
        found = self.slurm.find_by_comment(comment) if resumed else []
        if found:
            job_id = found[-1]  # the crashed pass did submit: bind that job, never a second
        else:
            if self.submitter is None:
                raise SchedulerError("no submitter configured for a resubmission; pass one to "
                                     "execute() or write job.sh into the run directory")
            job_id = self.submitter(a, comment)
        self.log.append(EntryKind.JOB, generation=UNFENCED, holder="",
                        payload={"job_id": job_id, "backend": "slurm", "op_id": a.op_id})
        return {"job_id": job_id, "rebound": bool(found)}

    def _do_requeue(self, a: Requeue, resumed: bool) -> dict[str, Any]:
        obs = self.slurm.observe(a.job_id)
        if not obs.held:
            self.slurm.requeuehold(a.job_id)  # updates below cannot race the requeue's kill
        fields_ = {"Comment": f"hpcrun:{a.op_id}"}
        if a.delay_s >= 1:
            fields_["StartTime"] = f"now+{math.ceil(a.delay_s)}"
        if a.exclude:
            fields_["ExcNodeList"] = ",".join(a.exclude)
        try:
            self.slurm.update_job(a.job_id, **fields_)
        finally:  # a refused update must not leave the job held forever
            self.slurm.release(a.job_id)
        return {"job_id": a.job_id}

    def _do_set_begin_time(self, a: SetBeginTime, resumed: bool) -> dict[str, Any]:
        self.slurm.update_job(a.job_id, StartTime=f"now+{math.ceil(a.delay_s)}")
        return {}

    def _do_exclude_nodes(self, a: ExcludeNodes, resumed: bool) -> dict[str, Any]:
        self.slurm.update_job(a.job_id, ExcNodeList=",".join(a.nodes))
        return {}

    def _do_release(self, a: Release, resumed: bool) -> dict[str, Any]:
        self.slurm.release(a.job_id)
        return {}

    def _do_cancel(self, a: Cancel, resumed: bool) -> dict[str, Any]:
        return {"known": self.slurm.scancel(a.job_id)}


def execute(actions: Sequence[Action], *, log: RunLog, slurm: SlurmClient, record: RunRecord,
            fence: Fence | None = None, submitter: Submitter | None = None,
            holder_prefix: str = "watch-") -> list[Outcome]:
    """Carry out ``actions`` in order: log intent, send, log done.

    Args:
        actions: from :func:`reconcile`.
        log: the run's log.
        slurm: the scheduler client.
        record: the record the actions were planned from (for already-done operations).
        fence: the caller's fencing token for state entries; None claims a new generation
            (holder ``<holder_prefix><hex>``) the first time a state entry is written.
        submitter: how to submit a fresh job (default: none; see :func:`script_submitter`).

    Raises:
        SchedulerError: Slurm refused or failed; the operation is logged ``failed`` and the
            next pass resumes it.
        StaleGenerationError: another incarnation fenced between planning and writing.
    """
    ex = _Executor(log=log, slurm=slurm, record=record, fence=fence, submitter=submitter,
                   holder_prefix=holder_prefix)
    return [ex.run(a) for a in actions]


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchResult:
    """One reconcile pass."""

    record: RunRecord
    """The record the pass planned from."""
    observation: Observation | None
    """What Slurm said about the newest job."""
    actions: tuple[Action, ...]
    """What was planned."""
    outcomes: tuple[Outcome, ...]
    """What was done."""


def heartbeat_age(record: RunRecord, run_dir: Path, now: float,
                  storage: Storage = LOCAL_STORAGE) -> float | None:
    """Seconds since the newest heartbeat (the log's summary or a ``heartbeat/`` file)."""
    stamps = [float(record.heartbeat["last_ts"])] if record.heartbeat else []
    for name in storage.listdir(run_dir / "heartbeat"):
        try:
            stamps.append(os.stat(run_dir / "heartbeat" / name).st_mtime)
        except OSError:
            continue  # removed while listing
    return now - max(stamps) if stamps else None


def _ended_badly(obs: Observation, record: RunRecord) -> bool:
    """A job that ended without completing while the run had not finished."""
    return not is_terminal(record.state) and not obs.vanished and obs.state not in ACTIVE \
        and obs.state not in (SlurmJobState.COMPLETED, SlurmJobState.CANCELLED)


def _node_evidence(obs: Observation, slurm: SlurmClient,
                   now: float) -> tuple[Observation, float]:
    """``obs`` with the nodes Slurm now reports lost and, while the controller holds the job,
    how long ago it ended; and the site's node settle time. Best effort: when a query fails
    they stay unknown and the job's own end state decides."""
    try:
        down = slurm.down_nodes(obs.nodes)
        end = slurm.scontrol_show_job(obs.job_id).get("EndTime", "") if obs.in_controller \
            else ""
        settle_s = slurm.node_settle_s()
    except SchedulerError:
        return obs, 0.0
    ended = parse_slurm_time(end)
    return replace(obs, down_nodes=down,
                   ended_s_ago=None if ended is None else now - ended), settle_s


def watch_once(run_dir: str | os.PathLike[str], slurm: SlurmClient, clock: Clock, *,
               storage: Storage = LOCAL_STORAGE, submitter: Submitter | None = None,
               dry_run: bool = False, **policy_overrides: Any) -> WatchResult:
    """One bounded, idempotent, lock-free reconcile pass over a run.

    ``policy_overrides`` go to :meth:`ReconcilePolicy.from_spec` (``hang_timeout_s``,
    ``preempt_mode``). With ``dry_run`` the actions are planned but not executed.
    """
    run_dir = Path(run_dir)
    spec = load_run_spec(run_dir, storage=storage)
    record = read_record(run_dir, storage=storage, spec_id=spec.spec_id)
    now = clock.now()
    jobs = record.slurm_job_ids()
    if record.job_ids and not jobs:  # a local-backend run: nothing for Slurm to reconcile
        return WatchResult(record=record, observation=None, actions=(), outcomes=())
    obs = slurm.observe(jobs[-1]) if jobs else None
    if obs is not None:
        obs = replace(obs, heartbeat_age_s=heartbeat_age(record, run_dir, now, storage))
    if obs is not None and _ended_badly(obs, record):
        obs, settle_s = _node_evidence(obs, slurm, now)
        policy_overrides = {"node_settle_s": settle_s, **policy_overrides}
    policy = ReconcilePolicy.from_spec(spec, **policy_overrides)
    actions = reconcile(record, obs, now, policy)
    outcomes: list[Outcome] = []
    if actions and not dry_run:
        outcomes = execute(actions, log=RunLog(run_dir, storage=storage, clock=clock),
                           slurm=slurm, record=record,
                           submitter=submitter or script_submitter(run_dir, slurm))
    return WatchResult(record=record, observation=obs, actions=tuple(actions),
                       outcomes=tuple(outcomes))
