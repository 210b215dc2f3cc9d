"""The supervisor's decision core (pure): what the supervising agent saw → one typed decision.

``decide(observations, record, policy, now=..., rng=...)`` is the whole rule set for the end of
an incarnation:

- a gang node whose agent vanished (liveness stale), or that never reported within the wait,
  is a lost node (``node_failure``), even before Slurm flags it; with a live hot spare for
  each lost node the gang restarts in the allocation with the spares in their places
  (``SwapSpare``); without one an elastic gang with ``membership.min_nodes`` survivors goes
  on without it in the same job (``Shrink``), else the run requeues;
- a node whose ranks failed with no recorded cause (every failure an echo of a lost peer) is a
  ``process_crash`` of the gang;
- a gang fault with no stop pending goes through the control plane's retry rules: restart in
  the allocation, requeue with backoff and quarantine, or fail (:func:`root_cause` picks the
  fault to act on);
- every rank succeeded → succeed, even when a preemption signal arrived after the last step;
- a stopped gang whose stop committed progress is a *segment* of a long run (:func:`segment`):
  requeue at once without a fault, within ``budgets.max_segments``;
- anything else is a stopped gang: :func:`hpcrun.runtime.preemption.decide_after_stop`;
- no requeue outlives the run's wall-hour or node-hour budget (:func:`within_budget`): the run
  ends FAILED with the reason instead.

:func:`account_for_requeue` is the one decision at an incarnation's start: recording why Slurm
requeued the job by itself when the last gang could not say.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from hpcrun.control.budget import budget_spent, segments_spent, usage_of
from hpcrun.control.entries import SegmentNote
from hpcrun.control.retry import FaultClass, classify_exit, segment_progress
from hpcrun.control.states import RunState
from hpcrun.runtime import preemption
from hpcrun.runtime.incarnation import Ending
from hpcrun.runtime.node.membership import NODE_STALE_S
from hpcrun.runtime.supervise.decisions import (
    Decision,
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
    retry_decision,
)

if TYPE_CHECKING:
    from hpcrun.control.record import RunRecord
    from hpcrun.scheduler.slurm import PastRun

__all__ = [
    "Decision",
    "DecisionPolicy",
    "Fail",
    "GangFault",
    "LeaveToSlurm",
    "Observations",
    "Requeue",
    "RestartInAllocation",
    "Shrink",
    "SlurmRequeued",
    "Succeed",
    "SwapSpare",
    "account_for_requeue",
    "decide",
    "enough_to_decide",
    "requeue_unrecorded",
    "root_cause",
    "segment",
    "within_budget",
]

D = TypeVar("D", bound=Decision)


def decide(obs: Observations, record: RunRecord, policy: DecisionPolicy, *, now: float,
           rng: random.Random | None = None) -> Decision:
    """What to do now that the incarnation of ``obs`` ended (pure but for ``rng``'s state).

    Args:
        obs: what the supervising agent gathered (node exits, gang faults, its stop flag).
        record: the run record (its faults, restarts and requeues are the retry history).
        policy: retry rules and budgets from the spec.
        now: wall-clock time (fault times, the quarantine window).
        rng: random source for backoff jitter (None: no jitter).
    """
    faults = _faults(obs)
    if faults and not obs.stop_requested:
        return within_budget(retry_decision(obs, record, root_cause(faults), policy, now=now,
                                            rng=rng), record, policy, now=now)
    if not faults and obs.exits and all(s is Ending.SUCCEEDED for s in obs.exits.values()):
        return Succeed()
    if preemption.slurm_is_ending(obs):
        return LeaveToSlurm()
    step = segment_progress(record)
    if step is not None and not faults:
        return within_budget(segment(record, policy, step, now=now), record, policy, now=now)
    return within_budget(preemption.decide_after_stop(obs, record, policy, now=now, rng=rng),
                         record, policy, now=now)


def segment(record: RunRecord, policy: DecisionPolicy, step: int, *,
            now: float) -> Requeue | Fail:
    """A stop that committed progress (``step``) is a segment of a long run: requeue at once,
    without a fault, unless the segment budget is spent."""
    usage = usage_of(record, nodes=policy.allocated_nodes, now=now)
    spent = segments_spent(usage, policy.budgets) if policy.budgets is not None else None
    if spent is not None:
        return Fail(reason=spent, preempted=True)
    reason = (f"segment {usage.segments + 1} ended at step {step} (from step "
              f"{record.segment_from_step}) after a stop with a commit; requeue")
    return Requeue(delay_s=0.0, exclude=tuple(record.quarantined), reason=reason,
                   preempted=True, segment=SegmentNote(step_from=record.segment_from_step,
                                                       step_to=step, reason=reason))


def within_budget(decision: D, record: RunRecord, policy: DecisionPolicy, *,
                  now: float) -> D | Fail:
    """``decision``, unless it is a requeue and the run's wall-hour or node-hour budget is
    spent: then the run ends FAILED with the reason (it stopped at a step boundary and
    committed, so nothing is lost)."""
    if not isinstance(decision, Requeue) or policy.budgets is None:
        return decision
    spent = budget_spent(usage_of(record, nodes=policy.allocated_nodes, now=now),
                         policy.budgets)
    return decision if spent is None else Fail(reason=spent, preempted=decision.preempted)


def _faults(obs: Observations) -> tuple[GangFault, ...]:
    """The faults to act on: a silent node after the wait replaces what was seen; failed nodes
    with no recorded cause make one (unless a stop explains them)."""
    if obs.lost:
        return (vanished_node_fault(obs.lost),)
    missing = sorted(set(obs.nodes) - set(obs.exits))
    if obs.timed_out and missing:
        return (silent_node_fault(missing, obs.waited_s),)
    if obs.faults or obs.stop_requested:
        return obs.faults
    return unexplained(obs.exits)


def silent_node_fault(missing: Iterable[str], waited_s: float) -> GangFault:
    """A node that left no exit note within the wait is lost (before Slurm may say so)."""
    nodes = list(missing)
    return GangFault(fault=FaultClass.NODE_FAILURE, node=nodes[0],
                     signature=f"node_failure:{nodes[0]}",
                     detail=f"no exit report from {', '.join(nodes)} within {waited_s:.0f} s")


def vanished_node_fault(lost: Iterable[str]) -> GangFault:
    """Gang nodes whose agent stopped beating are lost: nothing they would report can come."""
    nodes = list(lost)
    return GangFault(fault=FaultClass.NODE_FAILURE, node=nodes[0],
                     signature=f"node_failure:{nodes[0]}",
                     detail=f"agent of {', '.join(nodes)} vanished: no liveness beat for "
                            f"{NODE_STALE_S:.0f} s")


def unexplained(exits: Mapping[str, Ending]) -> tuple[GangFault, ...]:
    """A node failed but no rank recorded a cause (every failure was a peer-loss echo)."""
    failed = sorted(n for n, s in exits.items() if s is Ending.FAILED)
    if not failed:
        return ()
    return (GangFault(fault=FaultClass.PROCESS_CRASH, signature="gang:peer_lost",
                      detail=f"ranks on {', '.join(failed)} lost their peers; no rank recorded "
                             "a cause (see the ranks' logs)"),)


def root_cause(faults: Iterable[GangFault]) -> GangFault:
    """The fault to act on: a lost node explains its peers' collective errors, so it comes
    first; then a rank that crashed, hung or failed otherwise, whose peers' collective errors
    surface as user errors (on another node, possibly logged first); otherwise the first
    recorded fault (the rest are its echoes)."""
    seen = list(faults)
    lost = [f for f in seen if f.fault == FaultClass.NODE_FAILURE]
    causes = [f for f in seen if f.fault != FaultClass.USER_ERROR]
    return (lost or causes or seen)[0]


def enough_to_decide(obs: Observations, *, settled: bool) -> bool:
    """Whether the supervisor may stop waiting: every node reported, a node vanished, or a fault
    was logged and either the others had ``settled`` time to report or it is a lost node (the
    cause)."""
    if set(obs.nodes) <= set(obs.exits) or obs.lost:
        return True
    lost = any(f.fault == FaultClass.NODE_FAILURE for f in obs.faults)
    return bool(obs.faults) and (settled or lost)


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmRequeued:
    """Slurm requeued the job by itself (NODE_FAIL, a preemption no agent saw) and the last
    gang logged no decision: record the fault (unfenced) and REQUEUED."""

    fault: GangFault
    """What Slurm's account says ended the previous run."""
    reason: str
    """The REQUEUED state's reason."""
    decided_at: float | None
    """Slurm's end time of that run (when the requeue happened)."""


def requeue_unrecorded(last_state: str | None) -> bool:
    """Whether the last incarnation ended without recording a decision: a job start after a
    requeue then asks Slurm why (None: there was no incarnation yet)."""
    return last_state not in (RunState.REQUEUED, RunState.PREEMPTED, None)


def account_for_requeue(past: PastRun | None, *, job_id: str, restart_count: int,
                        last_step: int | None) -> SlurmRequeued | None:
    """How to record a requeue Slurm did by itself, from its account of the previous run
    (``sacct --duplicates``); None when there is no account (the record infers it). Pure.

    Args:
        past: Slurm's account of the job's previous run, if any.
        job_id: the job.
        restart_count: ``SLURM_RESTART_COUNT`` of this start.
        last_step: the newest step the log reported, for the fault.
    """
    if past is None:
        return None
    fault = classify_exit(slurm_state=str(past.state), exit_code=past.exit_code,
                          signal=past.signal)
    detail = (f"Slurm requeued job {job_id} (restart {restart_count}) after its previous run "
              f"ended {past.state}" + (f" on {','.join(past.nodes)}" if past.nodes else ""))
    return SlurmRequeued(
        fault=GangFault(fault=fault, step=last_step, signature=f"slurm:{past.state}",
                        detail=detail),
        reason=detail, decided_at=past.ended_at)
