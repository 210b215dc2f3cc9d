"""``hpcrun report``: one self-contained HTML page with the run's plots (embedded PNGs).

Plots: the loss curve and one plot per other metric the steps reported (each step once, the
last incarnation's value of a replayed step; requeues, restarts and restores from the run log as
vertical lines); the timeline of allocations (generations) with time charged by bucket and
incidents (the record's faults, hang and straggler events) marked; step time per rank
(heatmap); input wait per step; checkpoint stall and time to commit; the ETTR waste breakdown;
and the Young waste curve for the run's measured C and estimated M with the chosen interval
marked. Plots are drawn with matplotlib's Agg backend, so no display is needed; each ``draw_*``
returns its :class:`~matplotlib.figure.Figure` (what the tests inspect), each ``plot_*`` its PNG.

Every figure the page shares with ``hpcrun status`` comes from
:func:`hpcrun.observe.figures.run_figures` and is printed by
:func:`~hpcrun.observe.figures.figure_rows`; the timeline is cut from the same charge, binned
so that each bucket's painted area is proportional to its seconds. The figures are also
embedded as JSON (``<script type="application/json" id="hpcrun-figures">``) for tools.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure  # Figure, not pyplot: no global state, no display needed
from matplotlib.patches import Rectangle

from hpcrun.checkpoint.cadence import (
    DEFAULT_MTBF_PRIOR_H,
    NOT_INTERRUPTIONS,
    InterruptionHistory,
    MtbfEstimate,
    choose_interval,
    expected_waste,
    format_duration,
)
from hpcrun.observe.ettr import Bucket, Timeline, bin_segments
from hpcrun.observe.figures import (
    STEPS_NOT_REPORTED,
    RunFigures,
    allocations_at,
    figure_rows,
    run_figures,
    run_timeline,
)
from hpcrun.observe.metrics import PRIMARY, MetricSeries, RunMarker, place_markers
from hpcrun.observe.status import RecordFacts
from hpcrun.observe.summary import EventSummary, summarize_events
from hpcrun.protocols import Event

COLORS = {Bucket.PRODUCTIVE: "#2ca02c", Bucket.RECOVERY: "#d62728", Bucket.CHECKPOINT: "#1f77b4",
          Bucket.REPLAY: "#ff7f0e", Bucket.INPUT_WAIT: "#9467bd", Bucket.STARTUP: "#8c564b",
          Bucket.STALL: "#e377c2", Bucket.IDLE: "#bbbbbb"}
INCIDENT_KINDS = ("fault", "hang", "straggler")
MARKER_STYLES = {"requeue": ("#d62728", "--"), "restart": ("#ff7f0e", "--"),
                 "restore": ("#2ca02c", ":")}
"""Colour and line style of each run-log marker on the metric plots."""
TIMELINE_BINS = 400
"""Bins across the timeline's width (about one per 2 pixels of the figure)."""
DEFAULT_COST_S = 30.0
"""Checkpoint cost C assumed when the run staged no checkpoint."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plot:
    """One figure of the report."""

    title: str
    """Section heading."""
    png: bytes
    """The rendered PNG."""
    caption: str
    """One sentence on how to read it."""


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return buf.getvalue()


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=ax.transAxes)


def incidents(events: Sequence[Event], facts: RecordFacts | None) -> list[tuple[float, int, str]]:
    """(ts, generation, what) of every incident: the record's faults (the one place every
    fault is kept) and hang, straggler and fault events."""
    out = [(e.ts, e.generation, e.kind) for e in events if e.kind in INCIDENT_KINDS]
    out += [(f.ts, f.generation, f.fault) for f in (facts.faults if facts else ())
            if f.ts is not None]
    return sorted(out)


def plot_timeline(events: Sequence[Event], segments: Timeline,
                  facts: RecordFacts | None = None) -> bytes:
    """PNG of :func:`draw_timeline`."""
    return _png(draw_timeline(events, segments, facts))


def draw_timeline(events: Sequence[Event], segments: Timeline,
                  facts: RecordFacts | None = None) -> Figure:
    """Allocations by generation, time coloured by bucket, incidents as red marks.

    Each row is cut into :data:`TIMELINE_BINS` bins and each bin painted as a stack of its
    buckets' shares, so a colour's area is proportional to the seconds ETTR charges it. An
    incident of an unknown generation is drawn on the newest row.
    """
    fig = Figure(figsize=(10, 2.8))
    ax = fig.subplots()
    origin = min((a.start for a, _ in segments), default=0.0)
    width = max((a.end for a, _ in segments), default=origin) - origin
    rows = [a.generation if a.generation is not None else i + 1
            for i, (a, _) in enumerate(segments)]  # the record's allocations: one row each
    for row, (_, segs) in zip(rows, segments if width > 0 else [], strict=False):
        _paint_row(ax, row, bin_segments(segs, start=origin, width=width,
                                         bins=TIMELINE_BINS), width / TIMELINE_BINS)
    newest = max(rows, default=0)
    for ts, gen, what in incidents(events, facts) if segments else []:
        y = (gen if gen >= 0 else newest) + 0.45
        ax.plot(ts - origin, y, marker="v", color="red", markersize=9)
        ax.annotate(what, (ts - origin, y), fontsize=7, color="red", xytext=(3, 3),
                    textcoords="offset points")
    if not segments:
        _empty(ax, "allocations")
    ax.set_yticks(sorted(set(rows)))
    ax.set_xlabel("seconds since the first allocation")
    ax.set_ylabel("generation")
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=COLORS[b], label=b) for b in Bucket],
              ncol=8, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return fig


def _paint_row(ax: Any, generation: int, bins: Sequence[dict[Bucket, float]],
               bin_s: float) -> None:
    """One generation's row: per bin, a stack of bucket shares (height 0.8 = a full bin)."""
    lefts = [i * bin_s for i in range(len(bins))]
    bottom = [generation - 0.4] * len(bins)
    for bucket in Bucket:
        heights = [0.8 * b.get(bucket, 0.0) / bin_s for b in bins]
        if any(heights):
            ax.bar(lefts, heights, width=bin_s, bottom=bottom, align="edge",
                   color=COLORS[bucket], linewidth=0)
            bottom = [y + h for y, h in zip(bottom, heights, strict=True)]


def plot_heatmap(events: Sequence[Event]) -> bytes:
    """PNG of :func:`draw_heatmap`."""
    return _png(draw_heatmap(events))


def draw_heatmap(events: Sequence[Event]) -> Figure:
    """Step time per rank (rows) and step (columns)."""
    cells: dict[tuple[int, int], float] = {}
    for e in events:
        if e.kind == "step" and e.rank >= 0 and isinstance(e.data.get("dur_s"), int | float):
            cells[(e.rank, e.step)] = float(e.data["dur_s"])
    fig = Figure(figsize=(10, 3))
    ax = fig.subplots()
    if cells:
        ranks = sorted({r for r, _ in cells})
        steps = sorted({s for _, s in cells})
        ri, si = {r: i for i, r in enumerate(ranks)}, {s: i for i, s in enumerate(steps)}
        grid = [[float("nan")] * len(steps) for _ in ranks]
        for (r, s), v in cells.items():
            grid[ri[r]][si[s]] = v
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5))
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks] if len(ranks) <= 32 else None)
        fig.colorbar(im, ax=ax, label="step time (s)")
    else:
        _empty(ax, "steps")
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    return fig


def plot_input_wait(summary: EventSummary) -> bytes:
    """PNG of :func:`draw_input_wait`."""
    return _png(draw_input_wait(summary))


def draw_input_wait(summary: EventSummary) -> Figure:
    """Gang input wait per step (the slowest rank's)."""
    steps = summary.gang_steps()
    fig = Figure(figsize=(10, 2.5))
    ax = fig.subplots()
    if steps and summary.input_wait_measured():
        ax.plot([s.step for s in steps], [s.input_wait_s for s in steps], ".-", color="#9467bd")
    else:
        _empty(ax, "input wait" if steps else "steps")
    ax.set_xlabel("step")
    ax.set_ylabel("input wait (s)")
    return fig


def commit_times(events: Sequence[Event]) -> list[tuple[int, float]]:
    """(step, seconds from the save's start to its commit) per committed checkpoint.

    A save starts with its ``ckpt_stage`` span and is committed when a rank emits its
    ``checkpoint`` event; per step the earliest start and the first commit seen count (the
    time until the checkpoint was durable on its tier). Agents' ``drain`` events, where
    present, give the time to the shared tier instead (their ``lag_s``).
    """
    starts: dict[int, float] = {}
    for e in events:
        if e.kind == "ckpt_stage":
            a = float(e.data.get("start_ts", e.ts))
            starts[e.step] = min(starts.get(e.step, a), a)
    done: dict[int, float] = {}
    for e in events:
        if e.kind == "checkpoint" and e.step in starts and e.step not in done:
            done[e.step] = max(0.0, e.ts - starts[e.step])
    for e in events:
        if e.kind == "drain" and isinstance(lag := e.data.get("lag_s", e.data.get("dur_s")),
                                            int | float):
            done[e.step] = float(lag)
    return sorted(done.items())


def plot_checkpoints(events: Sequence[Event]) -> bytes:
    """PNG of :func:`draw_checkpoints`."""
    return _png(draw_checkpoints(events))


def draw_checkpoints(events: Sequence[Event]) -> Figure:
    """Exposed checkpoint stall (stage) and the time to commit per checkpoint."""
    stall = [(e.step, float(e.data.get("dur_s", 0.0))) for e in events if e.kind == "ckpt_stage"]
    durable = commit_times(events)
    fig = Figure(figsize=(10, 2.5))
    ax = fig.subplots()
    if stall:
        ax.bar([s for s, _ in stall], [v for _, v in stall], color="#1f77b4", label="stage stall")
    if durable:
        ax.plot([s for s, _ in durable], [v for _, v in durable], "o-", color="#ff7f0e",
                label="time to commit")
    if stall or durable:
        ax.legend(fontsize=8)
    else:
        _empty(ax, "checkpoints")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    return fig


def plot_metric(name: str, series: MetricSeries, markers: Sequence[RunMarker]) -> bytes:
    """PNG of :func:`draw_metric`."""
    return _png(draw_metric(name, series, markers))


def draw_metric(name: str, series: MetricSeries, markers: Sequence[RunMarker]) -> Figure:
    """One metric per step, requeues, restarts and restores as vertical lines."""
    points = series.values.get(name, ())
    fig = Figure(figsize=(10, 2.8))
    ax = fig.subplots()
    if points:
        ax.plot([k for k, _ in points], [v for _, v in points], "-", color="#333333",
                label=name, marker="." if len(points) <= 200 else None)
        seen: set[str] = set()
        for m in markers:
            color, style = MARKER_STYLES[m.kind]
            ax.axvline(m.step or 0, color=color, ls=style, lw=1,
                       label=m.kind if m.kind not in seen else None)
            seen.add(m.kind)
        ax.legend(fontsize=8)
    else:
        _empty(ax, name)
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    return fig


def plot_waste(figures: RunFigures | None) -> bytes:
    """PNG of :func:`draw_waste`."""
    return _png(draw_waste(figures))


def draw_waste(figures: RunFigures | None) -> Figure:
    """Allocated seconds by bucket."""
    fig = Figure(figsize=(10, 2.8))
    ax = fig.subplots()
    seconds = figures.seconds if figures is not None else {}
    items = [(b, seconds.get(b, 0.0)) for b in Bucket]
    ax.barh([b.value for b, _ in items], [v for _, v in items],
            color=[COLORS[b] for b, _ in items])
    ax.invert_yaxis()
    if figures is not None and not figures.steps_reported:
        ax.set_xlabel(f"seconds ({STEPS_NOT_REPORTED}: no ETTR; {figures.allocated_s:.3g} s "
                      "allocated)")
    elif figures is not None:
        ax.set_xlabel(f"seconds (ETTR {figures.ettr:.1%} of {figures.allocated_s:.3g} s "
                      "allocated)")
    else:
        _empty(ax, "allocations")
    return fig


def measured_cost(events: Sequence[Event]) -> float:
    """C: the mean exposed stage time of the run's checkpoints (30 s when none was staged)."""
    stages = [float(e.data["dur_s"]) for e in events if e.kind == "ckpt_stage"
              and isinstance(e.data.get("dur_s"), int | float) and e.data["dur_s"] > 0]
    return statistics.mean(stages) if stages else DEFAULT_COST_S


def fallback_mtbf(facts: RecordFacts | None, figures: RunFigures | None) -> MtbfEstimate:
    """The estimate without the run's site and log: the default prior, the record's faults
    and the allocated time the events show."""
    faults = [f for f in (facts.faults if facts else ()) if f.fault not in NOT_INTERRUPTIONS]
    return MtbfEstimate(prior_s=DEFAULT_MTBF_PRIOR_H * 3600.0, history=InterruptionHistory(
        interruptions=len(faults), exposure_s=figures.allocated_s if figures else 0.0))


def plot_young(cost_s: float, mtbf_s: float, rpo_s: float | None) -> bytes:
    """PNG of :func:`draw_young`."""
    return _png(draw_young(cost_s, mtbf_s, rpo_s))


def draw_young(cost_s: float, mtbf_s: float, rpo_s: float | None) -> Figure:
    """W(T) over a range of intervals, with Young's and the chosen interval marked."""
    plan = choose_interval(cost_s=cost_s, mtbf_s=mtbf_s, rpo_s=rpo_s)
    lo, hi = max(cost_s / 4, 1.0), max(plan.young_s * 6, plan.interval_s * 2)
    ts = [lo * (hi / lo) ** (i / 199) for i in range(200)]
    fig = Figure(figsize=(10, 3))
    ax = fig.subplots()
    ax.plot(ts, [100 * expected_waste(t, cost_s=cost_s, mtbf_s=mtbf_s) for t in ts],
            color="#333333")
    ax.axvline(plan.young_s, color="#1f77b4", ls="--",
               label=f"Young {format_duration(plan.young_s)}")
    ax.axvline(plan.interval_s, color="#d62728",
               label=f"chosen {format_duration(plan.interval_s)}"
                     + (" (RPO)" if plan.limited_by_rpo else ""))
    ax.set_xscale("log")
    ax.set_xlabel(f"checkpoint interval T (s); C = {cost_s:.3g} s, "
                  f"M = {format_duration(mtbf_s)}")
    ax.set_ylabel("expected waste (%)")
    ax.legend(fontsize=8)
    return fig


def metric_plots(series: MetricSeries, markers: Sequence[RunMarker]
                 ) -> list[tuple[str, Callable[[], bytes], str]]:
    """The loss curve (always, "no loss recorded" without one) and one plot per other
    metric."""
    replayed = (f" {series.replayed_steps} step(s) replayed after a restore are shown once, "
                "with the last incarnation's value." if series.replayed_steps else "")
    lines = ("Vertical lines from the run log: requeues (red dashed), restarts (orange dashed), "
             "restores (green dotted, at the restored step).")
    names = [PRIMARY, *(n for n in series.names if n != PRIMARY)]
    return [(("Loss" if n == PRIMARY else f"Metric: {n}"),
             functools.partial(plot_metric, n, series, markers),
             f"{n} reported by the lowest rank at each step.{replayed} {lines}")
            for n in names]


def build_plots(events: Sequence[Event], summary: EventSummary, figures: RunFigures | None,
                mtbf: MtbfEstimate, facts: RecordFacts | None = None,
                markers: Sequence[RunMarker] = ()) -> list[Plot]:
    """All plots of the report."""
    cost = measured_cost(events)
    rpo_s = facts.rpo_s if facts else None
    series = summary.metric_series()
    placed = place_markers(markers, ((s.step, s.end) for s in summary.gang_steps()))
    makers: list[tuple[str, Callable[[], bytes], str]] = [
        *metric_plots(series, placed),
        ("Timeline", lambda: plot_timeline(events, run_timeline(summary), facts),
         "Each row is one generation (allocation); colour shows where its time went, each "
         "colour's area proportional to its seconds; red marks are incidents."),
        ("Step time per rank", lambda: plot_heatmap(events),
         "A straggler is a bright row; a slow node shows as a band of rows."),
        ("Input wait", lambda: plot_input_wait(summary),
         "Time the slowest rank waited for its batch in each step."),
        ("Checkpoint stall and time to commit", lambda: plot_checkpoints(events),
         "Bars: training paused for the host copy; line: time from a save's start until the "
         "checkpoint was committed (durable on its tier)."),
        ("Where the allocated time went", lambda: plot_waste(figures),
         "Every allocated second is charged to exactly one bucket."),
        ("Checkpoint interval", lambda: plot_young(cost, max(mtbf.mtbf_s, 2 * cost), rpo_s),
         f"Expected waste W(T) = C/T + T/2M for the measured C and {mtbf.describe()}."),
    ]
    return [Plot(title=t, png=make(), caption=c) for t, make, c in makers]


def _summary_rows(facts: RecordFacts | None, figures: RunFigures | None,
                  mtbf: MtbfEstimate) -> list[tuple[str, str]]:
    rows = []
    if facts is not None:
        rows += [("run", facts.run_id), ("state", facts.state),
                 ("generation", str(facts.generation)),
                 ("step", str(facts.step) if facts.step > 0 or figures is None
                  or figures.steps_reported else STEPS_NOT_REPORTED),
                 ("restarts / requeues", f"{facts.restarts} / {facts.requeues}")]
    rows += figure_rows(figures) if figures is not None else [("ETTR", "- (no events)")]
    rows.append(("mtbf", mtbf.describe()))
    return rows


def figures_json(figures: RunFigures | None, mtbf: MtbfEstimate,
                 series: MetricSeries | None = None) -> str:
    """The embedded JSON data block (safe inside a ``<script>`` element)."""
    body = {"figures": figures.to_dict() if figures is not None else None,
            "metrics": series.to_dict() if series is not None else None,
            "mtbf": {"mtbf_s": mtbf.mtbf_s, "prior_s": mtbf.prior_s,
                     "interruptions": mtbf.history.interruptions,
                     "exposure_s": mtbf.history.exposure_s}}
    return json.dumps(body, sort_keys=True).replace("</", "<\\/")


def render_html(plots: Sequence[Plot], rows: Sequence[tuple[str, str]], *, title: str,
                data: str = "{}") -> str:
    """The page: a summary table and one section per plot, images inline as data URIs."""
    esc = html.escape
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    sections = "".join(
        f'<section><h2>{esc(p.title)}</h2><img alt="{esc(p.title)}" '
        f'src="data:image/png;base64,{base64.b64encode(p.png).decode()}">'
        f"<p>{esc(p.caption)}</p></section>" for p in plots)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;max-width:1000px;"
            "margin:2em auto}img{max-width:100%}th{text-align:left;padding-right:1em}</style>"
            f"</head><body><h1>{esc(title)}</h1><table>{table}</table>{sections}"
            f'<script type="application/json" id="hpcrun-figures">{data}</script>'
            "</body></html>\n")


def build_report(events: Sequence[Event], *, facts: RecordFacts | None = None,
                 node_hour_price: float | None = None,
                 mtbf: MtbfEstimate | None = None, markers: Sequence[RunMarker] = (),
                 now: float | None = None) -> str:
    """The whole report page for a run's events (and record facts when known).

    ``mtbf``: the site's prior combined with the run's interruptions (what ``hpcrun report``
    passes); without it the default prior, the record's faults and the events' allocated time.
    ``markers``: the run log's requeues, restarts and restores
    (:func:`hpcrun.observe.metrics.markers_from_log`). ``now``: where an allocation still
    held is counted to (default: the last event).
    """
    summary = summarize_events(events)
    at = now if now is not None else max((e.ts for e in events), default=0.0)
    allocs = allocations_at(facts.allocations, at) if facts is not None else []
    figures = run_figures(summary, allocations=allocs, node_hour_price=node_hour_price)
    mtbf = mtbf if mtbf is not None else fallback_mtbf(facts, figures)
    plots = build_plots(events, summary, figures, mtbf, facts, markers)
    title = f"hpcrun report: {facts.run_id}" if facts else "hpcrun report"
    return render_html(plots, _summary_rows(facts, figures, mtbf), title=title,
                       data=figures_json(figures, mtbf, summary.metric_series()))


def write_report(path: Path, page: str) -> Path:
    """Write the page (replacing an older one atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
