"""What the supervisor sees and what it can decide: the typed inputs and outputs of
:func:`hpcrun.runtime.supervise.decide.decide` (all values, no effects).

A :class:`Decision` is one of a closed set of frozen dataclasses; the supervising agent
(:mod:`hpcrun.runtime.supervise.supervisor`) carries it out. A new way to end an incarnation (swap a
spare node in: :class:`SwapSpare`; shrink the gang: :class:`Shrink`) is a new variant here, a branch
in ``decide`` and a case in the shell.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcrun.control.budget import allocated_nodes
from hpcrun.control.elastic import is_elastic, shrink_gang, swap_in
from hpcrun.control.entries import FaultPayload, SegmentNote
from hpcrun.control.record import FaultRecord, RunRecord
from hpcrun.control.retry import FaultClass, RetryAction, decide_retry
from hpcrun.runtime.incarnation import Ending
from hpcrun.vocab import Backend

if TYPE_CHECKING:
    from hpcrun.control.spec import Budgets, RetryPolicy, RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class GangFault:
    """A fault that ends the gang, as a FAULT entry's payload carries it."""

    fault: str
    """Fault class (a :class:`~hpcrun.control.retry.FaultClass` value; a word a rank reports
    outside it, such as ``stale``, is read back from the log as ``unknown``, as the record
    keeps it)."""
    node: str | None = None
    """Node it happened on, when known."""
    rank: int | None = None
    """Rank it happened on, when known."""
    step: int | None = None
    """Step it happened at, when known."""
    signature: str = ""
    """Stable fingerprint for repeat detection."""
    detail: str = ""
    """One line for people."""

    @classmethod
    def from_entry(cls, fault: FaultPayload) -> GangFault:
        """The gang fault a FAULT entry's payload records."""
        return cls(fault=fault.fault, node=fault.node, rank=fault.rank, step=fault.step,
                   signature=fault.signature, detail=fault.detail)

    def to_entry(self) -> FaultPayload:
        """The FAULT payload this fault is logged as.

        Raises:
            ValueError: ``fault`` is not a :class:`~hpcrun.control.retry.FaultClass` value (a
                word only a rank's exit report carries, such as ``stale``, is never logged
                from a ``GangFault``).
        """
        return FaultPayload(fault=FaultClass(self.fault), node=self.node, rank=self.rank,
                            step=self.step, signature=self.signature, detail=self.detail)


@dataclass(frozen=True, kw_only=True, slots=True)
class Observations:
    """What the supervising agent saw when its incarnation ended."""

    generation: int
    """Generation of the incarnation that ended."""
    attempt: int
    """Its in-allocation attempt (0 for the allocation's first gang start)."""
    nodes: tuple[str, ...]
    """Every node of the gang."""
    exits: Mapping[str, Ending] = field(default_factory=dict)
    """node → how its ranks ended (from ``node_exit`` notes)."""
    faults: tuple[GangFault, ...] = ()
    """Gang faults logged under this incarnation, in log order."""
    timed_out: bool = False
    """Whether the wait for node exits ran out with nodes still silent."""
    waited_s: float = 0.0
    """How long the supervisor waited for node exits (for the silent-node fault's detail)."""
    stop_requested: bool = False
    """Whether this agent got a preemption or termination signal."""
    stop_signum: int | None = None
    """The first signal that asked it to stop."""
    preempt_signal: int = 10
    """The site's preemption signal."""
    backend: Backend = Backend.SLURM
    """``slurm`` or ``local``."""
    lost: tuple[str, ...] = ()
    """Gang nodes whose agent vanished (liveness stale): lost, whatever else was seen."""
    spares: tuple[str, ...] = ()
    """Hot spare nodes of the allocation still alive and not quarantined, in allocation
    order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """The parts of the spec the supervisor's decisions read."""

    retry: RetryPolicy
    """Per-class budgets, backoff, quarantine."""
    max_requeues: int | None = None
    """The run's requeue budget; None for no limit."""
    spare_nodes: int = 0
    """Spare nodes in the allocation (a lost node can be replaced only with one)."""
    budgets: Budgets | None = None
    """The run's segment, wall-hour and node-hour budgets; None for no limits."""
    allocated_nodes: int = 1
    """Nodes an allocation holds (for node-hours)."""
    min_nodes: int | None = None
    """Fewest nodes an elastic gang continues on (``membership.min_nodes``); None for a fixed
    gang, which never shrinks."""

    @classmethod
    def of(cls, spec: RunSpec) -> DecisionPolicy:
        return cls(retry=spec.retry, max_requeues=spec.budgets.max_requeues,
                   spare_nodes=spec.resources.spare_nodes, budgets=spec.budgets,
                   allocated_nodes=allocated_nodes(spec),
                   min_nodes=spec.membership.min_nodes if is_elastic(spec) else None)


@dataclass(frozen=True, kw_only=True, slots=True)
class Succeed:
    """Every rank finished: the last checkpoint reaches tier 1 and the run is SUCCEEDED."""

    reason: str = "all ranks finished"
    """The SUCCEEDED state's reason."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartInAllocation:
    """Restart the gang in this allocation under a new generation (RECOVERING, then STARTING)."""

    attempt: int
    """The next in-allocation attempt."""
    reason: str
    """Why (the retry rule that allowed it)."""
    rollback: bool = False
    """Restore the newest *known-good* checkpoint, not merely the newest (an ``sdc`` fault;
    the restore reads the fault from the log, so this is what the decision promises)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Requeue:
    """Give the allocation back and queue again after ``delay_s`` (REQUEUED)."""

    delay_s: float
    """Backoff before the requeued job may start."""
    exclude: tuple[str, ...]
    """Quarantined nodes the next allocation must avoid."""
    reason: str
    """Why (the retry rule that chose it)."""
    preempted: bool
    """Whether the gang stopped for a preemption (PREEMPTED is recorded first, after the
    checkpoint reached tier 1) rather than for a fault (RECOVERING)."""
    segment: SegmentNote | None = None
    """Set when the stop committed progress: a segment of a long run, logged instead of a
    preemption fault."""
    rollback: bool = False
    """Restore the newest *known-good* checkpoint, not merely the newest (an ``sdc`` fault)."""
    lost: tuple[str, ...] = ()
    """Gang nodes lost with their tier 0: before the requeue the survivors drain the partner
    copies they hold of those nodes' newest shards."""
    fault: GangFault | None = None
    """The root cause of a requeue after a fault (logged unless a node logged it already: a
    vanished node logs nothing itself)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Fail:
    """End the run FAILED."""

    reason: str
    """Why (a spent budget, a deterministic repeat)."""
    preempted: bool = False
    """Whether the gang stopped for a preemption (PREEMPTED is recorded first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaveToSlurm:
    """The gang stopped on SIGTERM: Slurm is ending the job (scancel, a preemption's grace
    period, the time limit). Record PREEMPTED and stay until Slurm ends the job; requeueing here
    would undo a user's scancel, and Slurm requeues a preempted job by itself."""

    reason: str = "stopped on SIGTERM: Slurm is ending the job"
    """The note's detail."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SwapSpare:
    """A gang node is lost and a hot spare is alive: quarantine the lost node and restart the
    gang in this allocation, under a new generation, with the spare in the lost node's place
    (same job, no requeue)."""

    attempt: int
    """The next in-allocation attempt."""
    lost: tuple[str, ...]
    """The lost nodes (quarantined)."""
    gang: tuple[str, ...]
    """The next incarnation's nodes, in node-rank order (each spare in a lost node's place)."""
    reason: str
    """Why (the retry rule that allowed it)."""
    fault: GangFault
    """The node failure (logged when the supervising agent's watch has not logged it yet)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Shrink:
    """A gang node is lost, no hot spare is left and the run is elastic with nodes to spare:
    quarantine the lost node and restart the gang in this allocation, under a new generation,
    on the survivors (same job, no requeue). Node ranks are re-assigned densely, the world size
    is the smaller gang's, and the restore reshards the state onto it."""

    attempt: int
    """The next in-allocation attempt."""
    lost: tuple[str, ...]
    """The lost nodes (quarantined)."""
    gang: tuple[str, ...]
    """The survivors, in their node-rank order: the next incarnation's nodes."""
    reason: str
    """Why (the retry rule that allowed it, the sizes)."""
    fault: GangFault
    """The node failure (logged when the supervising agent's watch has not logged it yet)."""


Decision = (Succeed | RestartInAllocation | SwapSpare | Shrink | Requeue | Fail
            | LeaveToSlurm)
"""Everything the supervisor can decide when an incarnation ends."""


def lost_nodes(obs: Observations, fault: GangFault) -> tuple[str, ...]:
    """The gang nodes a node failure took: the vanished ones, else the fault's node, else the
    nodes that stayed silent through the whole wait."""
    if fault.fault != FaultClass.NODE_FAILURE:
        return ()
    if obs.lost:
        return obs.lost
    if fault.node in obs.nodes:
        return (str(fault.node),)
    return tuple(n for n in obs.nodes if n not in obs.exits) if obs.timed_out else ()


def fault_record(obs: Observations, record: RunRecord, fault: GangFault,
                 now: float) -> FaultRecord:
    """The record's copy of ``fault`` when this incarnation logged it, else a new one (pure)."""
    for known in reversed(record.faults):
        if known.generation == obs.generation and (known.signature, known.node, known.rank) == (
                fault.signature, fault.node, fault.rank):
            return known
    cls = FaultClass(fault.fault) if fault.fault in set(FaultClass) else FaultClass.UNKNOWN
    return FaultRecord(fault=cls, node=fault.node, rank=fault.rank, step=fault.step,
                       signature=fault.signature, detail=fault.detail, ts=now)


def can_shrink(obs: Observations, lost: tuple[str, ...], policy: DecisionPolicy) -> bool:
    """Whether an elastic gang can go on without ``lost``: at least ``min_nodes`` survive."""
    return (policy.min_nodes is not None and bool(lost)
            and len(shrink_gang(obs.nodes, lost)) >= policy.min_nodes)


def retry_decision(obs: Observations, record: RunRecord, fault: GangFault,
                   policy: DecisionPolicy, *, now: float, rng: random.Random | None,
                   preempted: bool = False
                   ) -> Requeue | Fail | RestartInAllocation | SwapSpare | Shrink:
    """The control plane's retry rules applied to ``fault`` (pure but for ``rng``'s state).

    A lost node is replaced in the allocation by a live hot spare (one per lost node:
    :class:`SwapSpare`); without one an elastic gang with at least ``min_nodes`` survivors
    continues on them (:class:`Shrink`); otherwise the run requeues. A preempted gang is never
    restarted in its allocation (the allocation is ending). Silent data corruption on a named node
    quarantines it at once and requeues without it (a spare swap can carry the rollback later), as
    does a requeue after a node loss for the lost nodes;
    without a named node the gang restarts in the allocation; either way it rolls back to the
    newest known-good checkpoint.
    """
    lost = lost_nodes(obs, fault)
    sdc = fault.fault == FaultClass.SDC
    faulty = fault.node if sdc and fault.node else None
    swap = bool(lost) and len(obs.spares) >= len(lost)
    spares = (fault.fault != FaultClass.NODE_FAILURE or swap
              or can_shrink(obs, lost, policy)) and not faulty
    rd = decide_retry(record, fault_record(obs, record, fault, now), policy.retry,
                      max_requeues=policy.max_requeues, spares_available=spares,
                      rng=rng if policy.retry.jitter else None, now=now)
    if rd.action == RetryAction.RESTART and not preempted:
        if fault.fault == FaultClass.NODE_FAILURE and not swap:
            gang = shrink_gang(obs.nodes, lost)
            return Shrink(attempt=obs.attempt + 1, lost=lost, gang=gang, fault=fault,
                          reason=f"{rd.reason}: {', '.join(lost)} lost, no spare left; the "
                                 f"elastic gang shrinks from {len(obs.nodes)} to {len(gang)} "
                                 f"nodes (membership.min_nodes {policy.min_nodes})")
        if fault.fault == FaultClass.NODE_FAILURE:
            gang = swap_in(obs.nodes, lost, obs.spares)
            return SwapSpare(attempt=obs.attempt + 1, lost=lost, gang=gang, fault=fault,
                             reason=f"{rd.reason}: {', '.join(lost)} lost, "
                                    f"{', '.join(n for n in gang if n not in obs.nodes)} "
                                    "takes its place")
        return RestartInAllocation(attempt=obs.attempt + 1, reason=_rollback(rd.reason, sdc),
                                   rollback=sdc)
    if rd.action == RetryAction.FAIL:
        return Fail(reason=rd.reason, preempted=preempted)
    # the node the evidence names leaves with the allocation: a corrupting device, or a node that
    # vanished (quarantined at once, as a spare swap or a shrink does, so the requeue's
    # ExcNodeList keeps it out even when Slurm returns it to service)
    exclude = tuple(sorted({*rd.exclude, *lost, *((faulty,) if faulty else ())}))
    return Requeue(delay_s=rd.delay_s, exclude=exclude, reason=_rollback(rd.reason, sdc),
                   preempted=preempted, rollback=sdc, lost=lost,
                   fault=None if preempted else fault)


def _rollback(reason: str, sdc: bool) -> str:
    return f"{reason}; rolling back to the newest known-good checkpoint" if sdc else reason
