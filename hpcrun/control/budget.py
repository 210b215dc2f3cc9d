"""A long run's budget: segments, allocated wall time and node-hours, measured from its log (pure).

A run that outlives its site's walltime cap is a chain of *segments*: allocations that end in a
preemption or time-limit stop after committing progress. The record folds what each allocation
used (:attr:`~hpcrun.control.record.RunRecord.wall_s`, ``alloc_since``, ``segments``); this
module turns that into figures (:func:`usage_of`), the spec's verdict on them
(:func:`budget_spent`), the time the current allocation may still use (:func:`remaining_s`) and
the projected finish at the run's own rate (:func:`projected_finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcrun.errors import ArgumentError

if TYPE_CHECKING:
    from hpcrun.control.record import RunRecord
    from hpcrun.control.spec import Budgets, RunSpec

BUDGET_SLACK_S = 5.0
"""A budget counts as spent this close to its end: the agents stop at the end itself, and the
decision that follows reads a clock a little earlier than theirs may be."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """What a run has used of its budgets so far."""

    segments: int
    """Allocations that ended in a stop with committed progress."""
    wall_s: float
    """Allocated wall seconds, the current allocation's included up to now."""
    nodes: int
    """Nodes each allocation holds (gang plus spares)."""
    node_s: float | None = None
    """Node-seconds held, spares included (None: ``wall_s`` x ``nodes``)."""
    spare_node_s: float = 0.0
    """Of those, node-seconds on hot spares."""

    def __post_init__(self) -> None:
        if self.segments < 0 or self.wall_s < 0 or self.nodes < 1:
            raise ArgumentError(f"Usage needs segments >= 0, wall_s >= 0 and nodes >= 1, "
                                f"found {self.segments}, {self.wall_s}, {self.nodes}")

    @property
    def wall_hours(self) -> float:
        """Allocated wall hours."""
        return self.wall_s / 3600.0

    @property
    def node_hours(self) -> float:
        """Allocated node-hours, hot spares included."""
        return (self.node_s if self.node_s is not None else self.wall_s * self.nodes) / 3600.0

    @property
    def spare_node_hours(self) -> float:
        """Of :attr:`node_hours`, the hours hot spares were held."""
        return self.spare_node_s / 3600.0


def allocated_nodes(spec: RunSpec) -> int:
    """Nodes one allocation of ``spec`` holds (the gang and its spares)."""
    return spec.resources.nodes + spec.resources.spare_nodes


UNLIMITED_SEGMENTS_CAP = 100_000
"""How many allocations a launcher that counts them allows when segments are unlimited."""


def allocation_cap(budgets: Budgets) -> int:
    """Allocations a launcher may start for one run: its fault requeues and its segments (the
    supervisor's decisions enforce the budgets; this only bounds a loop)."""
    segments = budgets.max_segments if budgets.max_segments is not None \
        else UNLIMITED_SEGMENTS_CAP
    return budgets.max_requeues + segments + 1


def usage_of(record: RunRecord, *, nodes: int, now: float) -> Usage:
    """The run's usage at ``now``: closed allocations plus the open one so far.

    Each allocation counts the nodes it held (``nodes``, the spec's gang plus spares, where an
    older log does not name them), so budgets, status, the report and the export show one
    node-hours figure (:attr:`~hpcrun.control.record.RunRecord.allocations`).
    """
    open_s = max(0.0, now - record.alloc_since) if record.alloc_since is not None else 0.0
    node_s = sum(a.seconds(now) * (a.nodes or nodes) for a in record.allocations)
    spare_s = sum(a.seconds(now) * a.spares for a in record.allocations)
    held = record.allocations[-1].nodes if record.allocations else 0
    return Usage(segments=record.segments, wall_s=record.wall_s + open_s, nodes=held or nodes,
                 node_s=node_s if record.allocations else None, spare_node_s=spare_s)


def budget_spent(usage: Usage, budgets: Budgets) -> str | None:
    """Why the run must stop for its wall-hour or node-hour budget, or None while it may go on."""
    slack_h = BUDGET_SLACK_S / 3600.0
    if budgets.max_wall_hours is not None and usage.wall_hours + slack_h >= budgets.max_wall_hours:
        return (f"wall-hour budget spent ({usage.wall_hours:.3f} of {budgets.max_wall_hours:g} h "
                "allocated); raise budgets.max_wall_hours to continue")
    if budgets.max_node_hours is not None \
            and usage.node_hours + slack_h * usage.nodes >= budgets.max_node_hours:
        return (f"node-hour budget spent ({usage.node_hours:.3f} of {budgets.max_node_hours:g} "
                f"node-hours on {usage.nodes} nodes); raise budgets.max_node_hours to continue")
    return None


def segments_spent(usage: Usage, budgets: Budgets) -> str | None:
    """Why one more segment is not allowed, or None."""
    if budgets.max_segments is not None and usage.segments >= budgets.max_segments:
        return (f"segment budget spent ({usage.segments} of {budgets.max_segments} segments); "
                "raise budgets.max_segments to continue")
    return None


def remaining_s(usage: Usage, budgets: Budgets) -> float | None:
    """Wall seconds the run may still hold an allocation under both budgets; None: no limit."""
    left = []
    if budgets.max_wall_hours is not None:
        left.append(budgets.max_wall_hours * 3600.0 - usage.wall_s)
    if budgets.max_node_hours is not None:
        left.append((budgets.max_node_hours - usage.node_hours) * 3600.0 / usage.nodes)
    return max(0.0, min(left)) if left else None


def projected_finish(record: RunRecord, *, total_steps: int | None, now: float) -> float | None:
    """When the run reaches ``total_steps`` at the rate it has made progress since its first
    start (queue waits and requeues included: that is the rate a user sees); None when the
    total is unknown or nothing was measured yet."""
    if total_steps is None or record.first_started is None or record.step <= 0:
        return None
    if record.step >= total_steps:
        return now
    elapsed = now - record.first_started
    if elapsed <= 0:
        return None
    return now + (total_steps - record.step) * elapsed / record.step


def total_steps(spec: RunSpec) -> int | None:
    """The run's step count when its config names one (``config.steps``), else None."""
    steps = spec.config.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 \
        else None
