"""The effectful shell around :func:`~hpcrun.control.reconcile.reconcile` (login node).

:func:`execute` logs each operation's intent *before* sending it, tags the job with
``--comment=hpcrun:<op_id>``, and logs ``done`` after. An operation already ``done`` is skipped.
Each intent holds a bounded lease on the run (:mod:`hpcrun.control.lease`): of passes racing on
a run, the log's order decides which one acts, as with fences, and the others leave it; a pass
takes over an unfinished operation only once its lease expired. :func:`watch_once` is one
bounded, lock-free pass for ``hpcrun status`` and a cron-safe ``hpcrun watch``: it reads the
record, asks Slurm about the newest job (and, for a job that ended badly, about its nodes),
plans with :func:`reconcile` and executes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.ending import EndPublisher, publish_ending
from hpcrun.control.entries import (
    EntryPayload,
    FaultPayload,
    JobPayload,
    OpPhase,
    ResultPayload,
    StatePayload,
)
from hpcrun.control.fencing import UNFENCED, Fence
from hpcrun.control.lease import lease_seconds, live_lease
from hpcrun.control.log import LogEntry, RunLog, new_holder
from hpcrun.control.reconcile import (
    Action,
    ActionKind,
    Cancel,
    ExcludeNodes,
    MarkFailed,
    MarkState,
    ReconcilePolicy,
    ReconcileRequeue,
    RecordFault,
    Release,
    SetBeginTime,
    Submit,
    awaiting_node_state,
    reconcile,
)
from hpcrun.control.record import RunRecord, continue_fold, load_run_spec, read_record
from hpcrun.control.states import RunState, is_terminal
from hpcrun.errors import HpcrunError, SchedulerError
from hpcrun.scheduler.slurm import ACTIVE, Observation, SlurmClient, SlurmJobState, parse_slurm_time
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import Backend

__all__ = [
    "Submitter",
    "WatchOutcome",
    "WatchResult",
    "execute",
    "heartbeat_age",
    "script_submitter",
    "watch_once",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchOutcome:
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
                 fence: Fence | None, submitter: Submitter | None, holder_prefix: str,
                 clock: Clock, lease_s: float, on_end: EndPublisher | None = None) -> None:
        self.log, self.slurm, self.record = log, slurm, record
        self.on_end = on_end
        self.fence, self.submitter, self.holder_prefix = fence, submitter, holder_prefix
        self.clock, self.lease_s = clock, lease_s
        self.pass_id = new_holder("pass-")
        self.base = record.last_slot  # the record this pass planned from

    def run(self, action: Action) -> WatchOutcome:
        if self.record.op_done(action.op_id):
            return WatchOutcome(op_id=action.op_id, kind=action.kind, status="already-done")
        resumed = action.op_id in self.record.ops  # an earlier pass may have sent it
        mine = self._op(action, OpPhase.INTENT, {"base": self.base,
                                                 "lease_until": self.clock.now() + self.lease_s})
        if not self._holds(mine.slot):
            return WatchOutcome(op_id=action.op_id, kind=action.kind, status="elsewhere")
        try:
            detail = self._perform(action, resumed=resumed)
        except HpcrunError as exc:
            self._op(action, OpPhase.FAILED, {"error": str(exc)})
            raise
        self._op(action, OpPhase.DONE, detail)
        return WatchOutcome(op_id=action.op_id, kind=action.kind, status="done", detail=detail)

    def _op(self, action: Action, phase: OpPhase, outcome: Mapping[str, Any]) -> LogEntry:
        entry = action.op_entry(phase, **{"pass": self.pass_id, **outcome})
        return self.log.append_entry(entry, generation=UNFENCED, holder="")

    def _holds(self, slot: int) -> bool:
        """Whether our intent at ``slot`` claimed the run (log order decides, see
        :mod:`hpcrun.control.lease`); folds the log forward as a side effect."""
        new = self.log.read(since_slot=self.record.last_slot + 1)
        self.record = continue_fold(self.record, new, skipped=self.log.skipped)
        lease = self.record.op_claims.lease
        return lease is not None and (lease.pass_id, lease.slot) == (self.pass_id, slot)

    def _fenced(self, payload: EntryPayload) -> None:
        if self.fence is None:
            claim = self.log.claim(new_holder(self.holder_prefix))
            self.fence = Fence(generation=claim.generation, holder=claim.holder, slot=claim.slot)
        self.log.publish_entry(payload, generation=self.fence.generation,
                               holder=self.fence.holder)

    def _ended(self) -> None:
        """The run reached a terminal state under this pass's fence: its post-run manifest."""
        if self.fence is None:
            return  # nothing was published under a fence of this pass
        publish_ending(self.on_end, self.log, generation=self.fence.generation,
                       holder=self.fence.holder)

    def _perform(self, action: Action, *, resumed: bool) -> dict[str, Any]:
        handler = getattr(self, f"_do_{action.kind.value}")
        return handler(action, resumed)  # type: ignore[no-any-return]

    def _do_record_fault(self, a: RecordFault, resumed: bool) -> dict[str, Any]:
        self.log.append_entry(FaultPayload(
            fault=a.fault, step=a.step, signature=a.signature, detail=a.detail, op_id=a.op_id),
            generation=UNFENCED, holder="")
        return {}

    def _do_mark_state(self, a: MarkState, resumed: bool) -> dict[str, Any]:
        self._fenced(StatePayload(state=a.state, reason=a.reason, not_before=a.not_before,
                                  exclude=a.exclude, op_id=a.op_id))
        if is_terminal(a.state):
            self._ended()
        return {}

    def _do_mark_failed(self, a: MarkFailed, resumed: bool) -> dict[str, Any]:
        self._fenced(ResultPayload(state=RunState.FAILED, reason=a.reason, op_id=a.op_id))
        self._ended()
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
        self.log.append_entry(JobPayload(job_id=job_id, backend=Backend.SLURM, op_id=a.op_id),
                              generation=UNFENCED, holder="")
        return {"job_id": job_id, "rebound": bool(found)}

    def _do_requeue(self, a: ReconcileRequeue, resumed: bool) -> dict[str, Any]:
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
            holder_prefix: str = "watch-", clock: Clock = SYSTEM_CLOCK,
            lease_s: float | None = None, on_end: EndPublisher | None = None) -> list[WatchOutcome]:
    """Carry out ``actions`` in order: log intent (with a lease), send, log done.

    The pass stops at the first intent that does not claim the run (another pass holds it,
    or acted since ``record`` was read): that action's outcome is ``elsewhere``.

    Args:
        actions: from :func:`reconcile`.
        log: the run's log.
        slurm: the scheduler client.
        record: the record the actions were planned from (for already-done operations).
        fence: the caller's fencing token for state entries; None claims a new generation
            (holder ``<holder_prefix><hex>``) the first time a state entry is written.
        submitter: how to submit a fresh job (default: none; see :func:`script_submitter`).
        clock: the time an intent's lease is measured from.
        lease_s: how long an intent holds the run; default
            :func:`~hpcrun.control.lease.lease_seconds` of the client's command timeout.
        on_end: publishes the post-run manifest when an action ends the run (see
            :mod:`hpcrun.control.ending`); None publishes none.

    Raises:
        SchedulerError: Slurm refused or failed; the operation is logged ``failed`` and the
            next pass resumes it.
        StaleGenerationError: another incarnation fenced between planning and writing.
    """
    ex = _Executor(log=log, slurm=slurm, record=record, fence=fence, submitter=submitter,
                   holder_prefix=holder_prefix, clock=clock,
                   lease_s=lease_seconds(slurm.timeout) if lease_s is None else lease_s,
                   on_end=on_end)
    outcomes: list[WatchOutcome] = []
    for action in actions:
        outcomes.append(ex.run(action))
        if outcomes[-1].status == "elsewhere":
            break  # this pass planned from a record that no longer holds
    return outcomes


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchResult:
    """One reconcile pass."""

    record: RunRecord
    """The record the pass planned from."""
    observation: Observation | None
    """What Slurm said about the newest job."""
    actions: tuple[Action, ...]
    """What was planned."""
    outcomes: tuple[WatchOutcome, ...]
    """What was done."""
    waiting: str = ""
    """Why nothing was done yet although the job ended (one line; empty otherwise)."""

    def summary(self) -> str:
        """One line for people: what Slurm said and what the pass did (or waits for)."""
        seen = self.observation.state if self.observation is not None else "no slurm job"
        acts = ", ".join(type(a).__name__ for a in self.actions) or (
            self.waiting or "nothing to do")
        lost = next((o for o in self.outcomes if o.status == "elsewhere"), None)
        if lost is not None:
            acts += (f"; another pass acted on the run first ({lost.kind.value} not sent), "
                     "left to it")
        return f"slurm {seen}: {acts}"


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


def _waiting(record: RunRecord, obs: Observation | None, policy: ReconcilePolicy,
             now: float) -> str:
    """Why a pass that planned nothing waits (empty when it does not)."""
    lease = live_lease(record.op_claims, now)
    if lease is not None:
        return (f"operation {lease.op_id} of another pass holds the run for "
                f"{lease.until - now:.0f} s more (intent at log slot {lease.slot}); this pass "
                "leaves it alone")
    return _settling(obs, policy)


def _settling(obs: Observation | None, policy: ReconcilePolicy) -> str:
    if obs is None or not awaiting_node_state(obs, policy):
        return ""
    return (f"job {obs.job_id} ended FAILED {obs.ended_s_ago or 0:.0f} s ago; waiting until "
            f"{policy.node_settle_s:.0f} s for Slurm to mark a lost node down before classifying")


def watch_once(run_dir: str | os.PathLike[str], slurm: SlurmClient, clock: Clock, *,
               storage: Storage = LOCAL_STORAGE, submitter: Submitter | None = None,
               dry_run: bool = False, on_end: EndPublisher | None = None,
               **policy_overrides: Any) -> WatchResult:
    """One bounded, idempotent, lock-free reconcile pass over a run.

    ``policy_overrides`` go to :meth:`ReconcilePolicy.from_spec` (``hang_timeout_s``,
    ``preempt_mode``). With ``dry_run`` the actions are planned but not executed. ``on_end``
    publishes the post-run manifest when the pass ends the run.
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
    waiting = _waiting(record, obs, policy, now) if not actions else ""
    outcomes: list[WatchOutcome] = []
    if actions and not dry_run:
        outcomes = execute(actions, log=RunLog(run_dir, storage=storage, clock=clock),
                           slurm=slurm, record=record, clock=clock,
                           submitter=submitter or script_submitter(run_dir, slurm),
                           on_end=on_end)
    return WatchResult(record=record, observation=obs, actions=tuple(actions),
                       outcomes=tuple(outcomes), waiting=waiting)
