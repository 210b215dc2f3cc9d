"""The run figures that ``hpcrun status``, ``hpcrun report`` and ``hpcrun export`` share.

Each shared number is computed here, once, from the event summary
(:class:`~hpcrun.observe.summary.EventSummary`), and rendered by :func:`figure_rows`, so the
three commands cannot disagree: status folds the events incrementally, the report folds them
all, and the fold is the same (property-tested in ``summary.py``).

Every throughput names what it divides by:

- *per allocated second*: accepted tokens / allocated gang seconds (what the allocation bought);
- *per productive second*: accepted tokens / seconds charged to productive steps (the speed of
  the training loop itself, input wait, checkpoints and recovery excluded);
- *per wall second*: accepted tokens / end-to-end seconds from the first allocation to the last
  event, queue gaps between allocations included.

Allocated time is the run record's: each allocation runs from the scheduler's start to the
state that gave it back (:class:`AllocationFact`), and node-hours count every node it held,
hot spares included and shown apart; budgets count the same. Only without the record (a bare
event log) is allocated time what the events see, a generation's first event to its last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcrun.observe.ettr import (
    Allocation,
    Bucket,
    EttrReport,
    Timeline,
    ettr_from_parts,
    timeline_from_parts,
)
from hpcrun.observe.summary import EventSummary

FIGURES_SCHEMA_VERSION = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocationFact:
    """One allocation as the run record folds it (its ``allocations``)."""

    start: float
    """When the scheduler granted it."""
    end: float | None = None
    """When it was given back; None while it is held."""
    nodes: int = 1
    """Nodes held, hot spares included."""
    spares: int = 0
    """Of those, hot spares."""
    queued_s: float = 0.0
    """Wait before it."""
    requeued: bool = False
    """Given back for the run to go on in another allocation."""


def allocations_at(facts: Sequence[AllocationFact], now: float) -> list[Allocation]:
    """The record's allocations for ETTR, the one still held counted up to ``now``."""
    return [Allocation(start=a.start, end=max(a.start, now) if a.end is None else a.end,
                       nodes=max(1, a.nodes), spares=min(a.spares, max(0, a.nodes - 1)),
                       queued_s=a.queued_s, requeued=a.requeued) for a in facts]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFigures:
    """ETTR, the time breakdown, counts and throughputs of a run (from its events)."""

    allocated_s: float
    """Allocated gang seconds, summed over allocations."""
    wall_s: float
    """First allocation start to the last event, gaps between allocations included."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Allocated seconds charged to each :class:`~hpcrun.observe.ettr.Bucket`."""
    accepted_steps: int = 0
    """Distinct step indices completed."""
    replayed_steps: int = 0
    """Steps recomputed after a restore."""
    accepted_tokens: int = 0
    """Tokens of accepted steps, summed over ranks."""
    node_hours: float = 0.0
    """Allocated node-hours, hot spares included."""
    spare_node_hours: float = 0.0
    """Of ``node_hours``, the hours hot spares were held."""
    queue_s: float = 0.0
    """Seconds waited for allocations (outside ``allocated_s`` and ETTR)."""
    cost_per_token: float | None = None
    """Price per accepted token, when a node-hour price is known."""
    input_wait_measured: bool = False
    """Whether any step event carried a measured input wait."""

    @property
    def productive_s(self) -> float:
        return self.seconds.get(Bucket.PRODUCTIVE, 0.0)

    @property
    def input_wait_s(self) -> float:
        return self.seconds.get(Bucket.INPUT_WAIT, 0.0)

    @property
    def steps_reported(self) -> bool:
        """Whether the ranks reported any step (a plain script in script mode may never):
        without steps there is no productive time to count, so no ETTR."""
        return self.accepted_steps > 0

    @property
    def ettr(self) -> float:
        """Productive / allocated seconds (0 when nothing was allocated)."""
        return self.productive_s / self.allocated_s if self.allocated_s > 0 else 0.0

    @property
    def tokens_per_allocated_s(self) -> float | None:
        return _ratio(self.accepted_tokens, self.allocated_s)

    @property
    def tokens_per_productive_s(self) -> float | None:
        return _ratio(self.accepted_tokens, self.productive_s)

    @property
    def tokens_per_wall_s(self) -> float | None:
        return _ratio(self.accepted_tokens, self.wall_s)

    @property
    def waste_s(self) -> dict[str, float]:
        """Seconds per waste cause with any time charged (everything but productive)."""
        return {k: v for k, v in self.seconds.items() if k != Bucket.PRODUCTIVE and v > 0}

    def to_dict(self) -> dict[str, Any]:
        """JSON form (embedded in the report, ``figures`` of ``hpcrun status --json``)."""
        return {"schema_version": FIGURES_SCHEMA_VERSION,
                "ettr": self.ettr if self.steps_reported else None,
                "steps_reported": self.steps_reported,
                "allocated_s": self.allocated_s, "productive_s": self.productive_s,
                "wall_s": self.wall_s, "seconds": dict(self.seconds),
                "input_wait_s": self.input_wait_s,
                "input_wait_measured": self.input_wait_measured,
                "accepted_steps": self.accepted_steps, "replayed_steps": self.replayed_steps,
                "accepted_tokens": self.accepted_tokens, "node_hours": self.node_hours,
                "spare_node_hours": self.spare_node_hours, "queue_s": self.queue_s,
                "cost_per_token": self.cost_per_token,
                "tokens_per_allocated_s": self.tokens_per_allocated_s,
                "tokens_per_productive_s": self.tokens_per_productive_s,
                "tokens_per_wall_s": self.tokens_per_wall_s}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def run_figures(summary: EventSummary, *, allocations: Sequence[Allocation] = (),
                node_hour_price: float | None = None) -> RunFigures | None:
    """The shared figures of a run's folded events; None before any event.

    ``allocations``: the record's (:func:`allocations_at`); without them, the events'.
    """
    if not summary.events:
        return None
    return figures_from_ettr(
        ettr_report(summary, allocations=allocations, node_hour_price=node_hour_price),
        input_wait_measured=summary.input_wait_measured())


def ettr_report(summary: EventSummary, *, allocations: Sequence[Allocation] = (),
                node_hour_price: float | None = None) -> EttrReport:
    """The ETTR charge of the folded events over the record's allocations (else the events')."""
    return ettr_from_parts(list(allocations) or summary.allocations(), summary.gang_steps(),
                           summary.span_intervals(), node_hour_price=node_hour_price)


def run_timeline(summary: EventSummary, *, allocations: Sequence[Allocation] = ()) -> Timeline:
    """The resolved timeline that :func:`run_figures` charges (for the report's plot)."""
    return timeline_from_parts(list(allocations) or summary.allocations(), summary.gang_steps(),
                               summary.span_intervals())


def figures_from_ettr(report: EttrReport, *, input_wait_measured: bool) -> RunFigures:
    return RunFigures(allocated_s=report.allocated_s, wall_s=report.wall_s,
                      seconds=dict(report.seconds), accepted_steps=report.accepted_steps,
                      replayed_steps=report.replayed_steps,
                      accepted_tokens=report.accepted_tokens, node_hours=report.node_hours,
                      spare_node_hours=report.spare_node_hours, queue_s=report.queue_s,
                      cost_per_token=report.cost_per_token,
                      input_wait_measured=input_wait_measured)


# -- one rendering for every reader -------------------------------------------------------------

def fmt_seconds(seconds: float) -> str:
    """Seconds for people: ``0.58 s``, ``42.0 s``, ``19m 0s``, ``6h 0m``."""
    from hpcrun.checkpoint.cadence import format_duration  # no torch/h5py: cadence is pure

    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return format_duration(seconds)


def fmt_node_hours(node_hours: float, spare_node_hours: float = 0.0) -> str:
    """The one way node-hours are printed: ``0.012 (0.004 on spares)``."""
    spares = f" ({spare_node_hours:.3f} on spares)" if spare_node_hours > 0 else ""
    return f"{node_hours:.3f}{spares}"


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def figure_rows(fig: RunFigures) -> list[tuple[str, str]]:
    """(label, text) rows of the shared figures, as status and the report print them."""
    if not fig.steps_reported:
        return silent_rows(fig)
    waste = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in fig.waste_s.items())
    wait = (f"{fmt_seconds(fig.input_wait_s)} ({fig.input_wait_s / fig.allocated_s:.1%} of "
            "allocated)" if fig.input_wait_measured and fig.allocated_s > 0 else
            "not measured (no step event carried input_wait_s)")
    rows = [
        ("ETTR", f"{fig.ettr:.1%}: {fmt_seconds(fig.productive_s)} productive of "
                 f"{fmt_seconds(fig.allocated_s)} allocated"),
        ("waste", waste or "none"),
        ("input wait", wait),
        ("accepted", f"{fig.accepted_steps} steps, {fig.accepted_tokens:,} tokens; "
                     f"{fig.replayed_steps} steps replayed"),
        ("throughput", f"{fmt_rate(fig.tokens_per_allocated_s)} tok/s per allocated second, "
                       f"{fmt_rate(fig.tokens_per_productive_s)} tok/s per productive second"),
        ("end to end", f"{fmt_rate(fig.tokens_per_wall_s)} tok/s per wall second over "
                       f"{fmt_seconds(fig.wall_s)} (first allocation to last event)"),
        _queue_row(fig),
        ("node-hours", fmt_node_hours(fig.node_hours, fig.spare_node_hours) + (
            f"; {fig.cost_per_token:.3g} per token" if fig.cost_per_token is not None else "")),
    ]
    return rows


def _queue_row(fig: RunFigures) -> tuple[str, str]:
    return ("queued", f"{fmt_seconds(fig.queue_s)} waiting for allocations (outside ETTR)")


STEPS_NOT_REPORTED = "steps not reported by the script"
"""What status, the report and the export say instead of a step or an ETTR when the ranks
never reported a step (a plain script in script mode, :mod:`hpcrun.runtime.rank.script`)."""


def silent_rows(fig: RunFigures) -> list[tuple[str, str]]:
    """The figures that hold without steps: allocated and wall time, node-hours."""
    return [
        ("ETTR", "- (no step reported: no productive time to count; a script gives it "
                 "with hpcrun.lite's report(step))"),
        ("allocated", f"{fmt_seconds(fig.allocated_s)} of gang time"),
        ("wall", f"{fmt_seconds(fig.wall_s)} (first allocation to last event)"),
        _queue_row(fig),
        ("node-hours", fmt_node_hours(fig.node_hours, fig.spare_node_hours)),
    ]
