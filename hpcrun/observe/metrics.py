"""The training metrics a run's steps report (loss first): one series, shown everywhere.

``ctx.step_done(loss=..., **metrics)`` (and ``hpcrun.lite``'s ``report``) writes each metric
into the step event. :func:`fold_step_metrics` folds those events into one row per step;
:func:`metric_series` turns the rows into :class:`MetricSeries`, which status (last, min,
trend), ``status --json``, the report's plots, the Prometheus export and ``hpcrun metrics``
all print, so they agree.

1. A step's value is the lowest rank's that reported it (rank 0 in a fixed gang): a rank's
   local loss is not the gang's, and rank 0 is what a tracker logs.
2. After a restore the gang replays the steps since the checkpoint: each step is shown once,
   the last incarnation's (highest generation's) value wins, and the series counts the steps
   it replaced (:attr:`MetricSeries.replayed_steps`).
3. A value that is not a finite number (a string, a bool, NaN, infinity) is skipped.

The fold keeps the winner by (generation, -rank), which is associative and commutative, so
node streams fold in any order to the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcrun.protocols import Event

RESERVED_KEYS = frozenset({"dur_s", "tokens", "input_wait_s", "start_ts", "sdc_suspect"})
"""Step event fields hpcrun writes for itself; every other numeric field is a metric."""
PRIMARY = "loss"
"""Shown first everywhere."""
TREND_WINDOW = 20
"""Steps the trend is fitted over."""

MetricRows = dict[int, list[Any]]
"""step → [generation, rank, {name: value}, sorted generations that reported the step]."""


def step_metrics(data: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of one step event's data (hpcrun's own fields left out)."""
    out: dict[str, float] = {}
    for name, value in data.items():
        if name in RESERVED_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[str(name)] = float(value)
    return out


def fold_step_metrics(rows: MetricRows, e: Event) -> None:
    """Fold one step event into ``rows`` (see module: the winner by (generation, -rank))."""
    values = step_metrics(e.data)
    if not values and e.step not in rows:
        return
    row = rows.get(e.step)
    if row is None:
        rows[e.step] = [e.generation, e.rank, values, [e.generation]]
        return
    if e.generation not in row[3]:
        row[3] = sorted([*row[3], e.generation])
    if values and (e.generation, -e.rank) > (row[0], -row[1]):
        row[0], row[1], row[2] = e.generation, e.rank, values


def rows_to_json(rows: MetricRows) -> list[list[Any]]:
    """Rows as JSON lists ``[step, generation, rank, {name: value}, [generations]]``."""
    return [[k, g, r, v, gens] for k, (g, r, v, gens) in sorted(rows.items())]


def rows_from_json(raw: Iterable[Sequence[Any]]) -> MetricRows:
    """Inverse of :func:`rows_to_json`; raises ValueError/TypeError when malformed."""
    return {int(k): [int(g), int(r), {str(n): float(x) for n, x in v.items()},
                     [int(y) for y in gens]] for k, g, r, v, gens in raw}


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricStat:
    """What status shows of one metric."""

    name: str
    """Metric name as the step reported it."""
    last: float
    """Value at the newest step that reported it."""
    last_step: int
    """That step."""
    min: float
    """Smallest value over the series."""
    min_step: int
    """Step of the smallest value (the first such step)."""
    trend: float | None
    """Least-squares change over the last :data:`TREND_WINDOW` points (value units; None
    with fewer than 2 points)."""
    points: int
    """Steps in the series."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricSeries:
    """Every numeric metric per step, each step once."""

    names: tuple[str, ...]
    """Metric names, ``loss`` first, then alphabetical."""
    steps: tuple[int, ...]
    """Steps that reported any metric, ascending."""
    values: Mapping[str, tuple[tuple[int, float], ...]]
    """name → (step, value) pairs, ascending by step."""
    replayed_steps: int
    """Steps reported by more than one generation (replayed after a restore): shown once,
    with the last incarnation's value."""

    def stats(self, *, window: int = TREND_WINDOW) -> tuple[MetricStat, ...]:
        """Last, min and trend of each metric, in :attr:`names` order."""
        return tuple(metric_stat(n, self.values[n], window=window) for n in self.names)

    def table(self) -> list[list[str]]:
        """A header row (``step`` then the names) and one row per step (empty: not reported)."""
        by_name = {n: dict(self.values[n]) for n in self.names}
        rows = [["step", *self.names]]
        rows += [[str(k), *(_fmt(by_name[n].get(k)) for n in self.names)] for k in self.steps]
        return rows

    def to_dict(self, *, window: int = TREND_WINDOW) -> dict[str, Any]:
        """The JSON form ``status --json`` embeds (stats only, not every point)."""
        return {"names": list(self.names), "steps": len(self.steps),
                "replayed_steps": self.replayed_steps,
                "stats": {s.name: {"last": s.last, "last_step": s.last_step, "min": s.min,
                                   "min_step": s.min_step, "trend": s.trend,
                                   "points": s.points}
                          for s in self.stats(window=window)}}


def _fmt(value: float | None) -> str:
    return "" if value is None else repr(value)


def order_names(names: Iterable[str]) -> tuple[str, ...]:
    """``loss`` first, then the others alphabetically."""
    unique = set(names)
    return ((PRIMARY,) if PRIMARY in unique else ()) + tuple(sorted(unique - {PRIMARY}))


def metric_series(rows: Mapping[int, Sequence[Any]]) -> MetricSeries:
    """The series of folded rows (pure; see module)."""
    values: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(rows):
        for name, value in rows[step][2].items():
            values.setdefault(name, []).append((step, float(value)))
    return MetricSeries(names=order_names(values),
                        steps=tuple(k for k in sorted(rows) if rows[k][2]),
                        values={n: tuple(v) for n, v in values.items()},
                        replayed_steps=sum(1 for r in rows.values() if len(r[3]) > 1))


def fitted_change(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope times the step span of ``points`` (None with fewer than 2 steps)."""
    if len(points) < 2:
        return None
    xs, ys = [float(k) for k, _ in points], [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return slope * (xs[-1] - xs[0])


def metric_stat(name: str, points: Sequence[tuple[int, float]], *,
                window: int = TREND_WINDOW) -> MetricStat:
    """Last, min and trend of one non-empty series."""
    low_step, low = min(points, key=lambda p: (p[1], p[0]))
    return MetricStat(name=name, last=points[-1][1], last_step=points[-1][0], min=low,
                      min_step=low_step, trend=fitted_change(points[-window:]),
                      points=len(points))


def describe_stat(s: MetricStat, *, window: int = TREND_WINDOW) -> str:
    """One status line's text for a metric."""
    trend = ""
    if s.trend is not None:
        word = "falling" if s.trend < 0 else "rising" if s.trend > 0 else "flat"
        trend = f"; {word} {s.trend:+.4g} over the last {min(window, s.points)} steps"
    return (f"{s.name} {s.last:.6g} at step {s.last_step} (min {s.min:.6g} at step "
            f"{s.min_step}{trend})")


def status_lines(series: MetricSeries | None, *, window: int = TREND_WINDOW) -> list[str]:
    """The ``metric`` lines of ``hpcrun status`` (none when no step reported a metric)."""
    if series is None or not series.names:
        return []
    lines = [f"metric      {describe_stat(s, window=window)}" for s in series.stats(window=window)]
    if series.replayed_steps:
        lines.append(f"metric      {series.replayed_steps} step(s) replayed after a restore "
                     "are shown once, with the last incarnation's value")
    return lines


def render_table(series: MetricSeries) -> str:
    """The ``hpcrun metrics`` text table: one row per step, right-aligned columns."""
    rows = series.table()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                     for r in rows)


def render_csv(series: MetricSeries) -> str:
    """The ``hpcrun metrics --csv`` text: a header row, then one row per step."""
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(series.table())
    return buf.getvalue()


# -- requeues, restarts and restores, from the run log ------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class RunMarker:
    """An interruption or a restore, drawn as a vertical line on the metric plots."""

    kind: str
    """``requeue``, ``restart`` or ``restore``."""
    ts: float
    """When the run log recorded it."""
    generation: int
    """Generation of the entry."""
    step: int | None = None
    """Step it happened at: the restored step of a restore; None until :func:`place_markers`
    places an interruption after the last gang step that ended before it."""


def markers_from_log(entries: Iterable[Any]) -> tuple[RunMarker, ...]:
    """Requeues, restarts and restores from the run log's valid entries (pure), counted the
    way the record counts them (``hpcrun.control.record``)."""
    from hpcrun.control.entries import PayloadError, StatePayload, decode_as
    from hpcrun.control.payload import EntryKind
    from hpcrun.control.states import RunState

    out: list[RunMarker] = []
    state: RunState | None = None
    for e in entries:
        if e.kind != EntryKind.STATE:
            continue
        try:
            p = decode_as(e, StatePayload)
        except PayloadError:
            continue
        kind = ("restart" if p.state == RunState.RECOVERING and state != p.state else
                "requeue" if state != p.state and (p.state == RunState.REQUEUED or (
                    p.state == RunState.STARTING and state in (RunState.PREEMPTED,
                                                               RunState.RUNNING))) else "")
        if kind:
            out.append(RunMarker(kind=kind, ts=e.ts, generation=e.generation))
        if p.state == RunState.RUNNING and p.restored_step:
            out.append(RunMarker(kind="restore", ts=e.ts, generation=e.generation,
                                 step=p.restored_step))
        state = p.state
    return tuple(out)


def place_markers(markers: Iterable[RunMarker],
                  step_ends: Iterable[tuple[int, float]]) -> tuple[RunMarker, ...]:
    """Markers with a step: an interruption after the newest step that ended before it."""
    ends = sorted(step_ends, key=lambda p: p[1])
    out = []
    for m in markers:
        if m.step is None:
            before = [k for k, end in ends if end <= m.ts]
            m = RunMarker(kind=m.kind, ts=m.ts, generation=m.generation,
                          step=max(before) if before else 0)
        out.append(m)
    return tuple(out)
