"""A long run's campaign figures for ``hpcrun status``: segments, budgets used, projected finish.

Pure: the run record and spec in, :class:`CampaignFigures` out; :func:`campaign_lines` and
:meth:`CampaignFigures.to_dict` render them. The figures come from the run's own log (the
record's allocated time, segments and first start), never from the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hpcrun.control.budget import allocated_nodes, projected_finish, total_steps, usage_of
from hpcrun.observe.figures import fmt_node_hours

if TYPE_CHECKING:
    from hpcrun.control.record import RunRecord
    from hpcrun.control.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignFigures:
    """What a run used of its budgets and when it should finish."""

    segments: int
    """Allocations that ended in a stop with committed progress."""
    max_segments: int | None
    """The segment budget (None: unlimited)."""
    wall_hours: float
    """Allocated wall hours so far."""
    max_wall_hours: float | None
    """The wall-hour budget."""
    node_hours: float
    """Allocated node-hours so far, hot spares included (the figure status and the report
    show)."""
    max_node_hours: float | None
    """The node-hour budget."""
    projected_finish: float | None
    """Unix time the run reaches ``config.steps`` at its rate so far (None: unknown)."""
    total_steps: int | None
    """``config.steps``, when the config names it."""
    after: tuple[str, ...] = ()
    """Runs this run waits for (``RUN:ok`` or ``RUN:any``)."""
    reason: str = ""
    """Why the run is in its state (shown once it ended)."""

    @property
    def budget_used_fraction(self) -> float | None:
        """The larger of the used fractions of the wall-hour and node-hour budgets."""
        used = [u / b for u, b in ((self.wall_hours, self.max_wall_hours),
                                   (self.node_hours, self.max_node_hours)) if b]
        return max(used) if used else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``hpcrun status --json``'s ``campaign``)."""
        return {**asdict(self), "after": list(self.after),
                "budget_used_fraction": self.budget_used_fraction}


def campaign_figures(record: RunRecord, spec: RunSpec, *, now: float) -> CampaignFigures:
    """The figures of ``record`` under ``spec``'s budgets at ``now``."""
    usage = usage_of(record, nodes=allocated_nodes(spec), now=now)
    steps = total_steps(spec)
    b = spec.budgets
    return CampaignFigures(
        segments=usage.segments, max_segments=b.max_segments, wall_hours=usage.wall_hours,
        max_wall_hours=b.max_wall_hours, node_hours=usage.node_hours,
        max_node_hours=b.max_node_hours, total_steps=steps, after=tuple(record.after),
        reason=str((record.state_info or {}).get("reason") or ""),
        projected_finish=projected_finish(record, total_steps=steps, now=now))


def _of(used: str, limit: float | int | None) -> str:
    return f"{used} of {limit:g}" if limit is not None else f"{used} (no limit)"


def campaign_lines(fig: CampaignFigures, *, state: str) -> list[str]:
    """The status lines: segments, budgets and, while the run is not over, its finish."""
    node_hours = (f"  node-hours {fmt_node_hours(fig.node_hours)} of {fig.max_node_hours:g}"
                  if fig.max_node_hours is not None else "")  # else the figures' row shows it
    lines = [f"segments    {_of(str(fig.segments), fig.max_segments)}",
             f"wall        {_of(f'{fig.wall_hours:.3f} h', fig.max_wall_hours)}{node_hours}"]
    if state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        lines.append("finish      " + _finish(fig))
    elif fig.reason:
        lines.append(f"ended       {state}: {fig.reason}")
    if fig.after:
        lines.append(f"after       {', '.join(fig.after)}")
    return lines


def _finish(fig: CampaignFigures) -> str:
    if fig.total_steps is None:
        return "unknown (config.steps not set)"
    if fig.projected_finish is None:
        return f"unknown (no progress toward {fig.total_steps} steps measured yet)"
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(fig.projected_finish))
    return f"{at} projected for step {fig.total_steps} at the run's rate so far"


# -- sweeps: one line per point and the totals --------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class PointRow:
    """One sweep point as ``hpcrun status SWEEP`` shows it."""

    index: int
    """Array task id."""
    run_id: str
    """Its run."""
    overrides: str
    """What it changes (``config.lr=0.001 config.seed=0``)."""
    state: str
    """Run state."""
    step: int
    """Last validated step."""
    loss: float | None
    """Newest loss rank 0 reported."""
    ettr: float | None
    """Effective training time ratio so far."""


def sweep_totals(rows: list[PointRow]) -> str:
    """One line: points per state and the mean ETTR of points that have one."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    ettrs = [r.ettr for r in rows if r.ettr is not None]
    mean = f"; mean ETTR {sum(ettrs) / len(ettrs):.1%}" if ettrs else ""
    return f"{len(rows)} points: {states}{mean}"


def sweep_lines(sweep_id: str, rows: list[PointRow]) -> list[str]:
    """The sweep status block."""
    out = [f"sweep       {sweep_id}",
           f"{'#':>3} {'RUN':<40} {'STATE':<10} {'STEP':>7} {'LOSS':>9} {'ETTR':>6}  POINT"]
    for r in rows:
        loss = f"{r.loss:.4g}" if r.loss is not None else "-"
        ettr = f"{r.ettr:.0%}" if r.ettr is not None else "-"
        out.append(f"{r.index:>3} {r.run_id:<40} {r.state:<10} {r.step:>7} {loss:>9} "
                   f"{ettr:>6}  {r.overrides}")
    out.append(f"total       {sweep_totals(rows)}")
    return out
