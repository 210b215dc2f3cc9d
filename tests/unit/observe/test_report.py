"""The HTML report: parses, and every plot is an embedded PNG of real content."""

from __future__ import annotations

import base64
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from hpcrun.observe.figures import run_figures, run_timeline
from hpcrun.observe.metrics import RunMarker, place_markers
from hpcrun.observe.report import (
    build_report,
    commit_times,
    draw_checkpoints,
    draw_heatmap,
    draw_input_wait,
    draw_metric,
    draw_timeline,
    draw_waste,
    draw_young,
    write_report,
)
from hpcrun.observe.status import FaultFact, RecordFacts
from hpcrun.observe.summary import summarize_events
from hpcrun.protocols import Event
from tests.unit.observe.builders import ev, span, step, two_generation_log
from tests.unit.observe.test_metrics import series_of_events

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.srcs.append(dict(attrs)["src"] or "")


def _rich_log() -> list:  # type: ignore[type-arg]
    events = two_generation_log()
    for rank in (1, 2, 3):  # more ranks so the heatmap has rows; rank 3 is slow
        events += [step(s, 10.0 * s, 10.0 * s + (9 if rank == 3 else 5), rank=rank,
                        node=f"n{rank // 2}", gen=1) for s in range(1, 6)]
    events += [span("drain", 45.0, 60.0, 3, gen=1, lag_s=15.0), ev("straggler", 50.0, 4)]
    return events


def test_report_has_seven_embedded_pngs_that_decode(tmp_path: Path) -> None:
    facts = RecordFacts(run_id="demo-1", state="SUCCEEDED", generation=2, step=6, rpo_s=600.0)
    page = build_report(_rich_log(), facts=facts, node_hour_price=2.0)
    out = write_report(tmp_path / "report.html", page)
    parser = _Images()
    parser.feed(out.read_text())
    assert parser.tags[:1] == ["html"] and "h1" in parser.tags
    assert len(parser.srcs) == 7  # the loss curve and six operational plots
    for src in parser.srcs:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        png = base64.b64decode(src[len(prefix):], validate=True)
        assert png[:8] == PNG_MAGIC
        width, height = struct.unpack(">II", png[16:24])  # IHDR
        assert width > 300 and height > 100
        assert len(png) > 5000  # a real plot, not a blank placeholder
    assert "demo-1" in page and "ETTR" in page
    # Self-contained and inert: the only script element is the JSON data block.
    assert page.count("<script") == 1 and '<script type="application/json"' in page


def test_report_of_an_empty_run_still_renders(tmp_path: Path) -> None:
    page = build_report([])
    parser = _Images()
    parser.feed(page)
    assert len(parser.srcs) == 7


# -- every chart draws what its caption says (issue 36) ----------------------------------------

def _drawn(fig: Figure) -> int:
    """Data points a figure draws: line vertices, bars, and image cells."""
    ax = fig.axes[0]
    points = sum(len(line.get_xdata()) for line in ax.lines)
    bars = sum(1 for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0)
    cells = sum(im.get_array().size for im in ax.images)
    return points + bars + cells


def _lines(fig: Figure) -> list[Line2D]:
    return [ln for ln in fig.axes[0].lines if len(ln.get_xdata()) > 1]


def _ckpt_log() -> list[Event]:
    """Two saves: stage at steps 3 and 6, each committed a few seconds later (as the runtime
    emits them: a ``ckpt_stage`` span, then a ``checkpoint`` event at commit)."""
    events = two_generation_log()
    events += [span("ckpt_stage", 100.0, 101.0, 6, gen=2),
               ev("checkpoint", 49.0, 3, gen=1, ckpt_id="c3"),
               ev("checkpoint", 104.0, 6, gen=2, ckpt_id="c6")]
    return events


def test_timeline_marks_the_records_faults() -> None:
    events = [e for e in two_generation_log() if e.kind != "fault"]  # the runtime writes none
    facts = RecordFacts(run_id="r", state="SUCCEEDED", generation=2, faults=(
        FaultFact(fault="node_loss", ts=70.0, generation=1),))
    summary = summarize_events(events)
    fig = draw_timeline(events, run_timeline(summary), facts)
    marks = [ln for ln in fig.axes[0].lines if ln.get_marker() == "v"]
    assert len(marks) == 1 and marks[0].get_xdata()[0] == 70.0  # origin is ts 0
    assert [t.get_text() for t in fig.axes[0].texts] == ["node_loss"]
    assert _drawn(draw_timeline(events, run_timeline(summary))) > 0


def test_checkpoint_chart_draws_its_time_to_commit_line() -> None:
    events = _ckpt_log()
    assert commit_times(events) == [(3, 9.0), (6, 4.0)]
    lines = _lines(draw_checkpoints(events))
    assert len(lines) == 1 and list(lines[0].get_ydata()) == [9.0, 4.0]
    assert _drawn(draw_checkpoints([])) == 0


def test_heatmap_input_wait_waste_and_young_draw_their_data() -> None:
    events = _rich_log()
    summary = summarize_events(events)
    assert _drawn(draw_heatmap(events)) >= 4 * 5  # four ranks x five steps
    waits = _lines(draw_input_wait(summary))
    assert len(waits) == 1 and max(waits[0].get_ydata()) == 2.0  # step 6 waited 2 s
    assert _drawn(draw_waste(run_figures(summary))) > 0
    assert 200 in [len(ln.get_xdata()) for ln in _lines(draw_young(30.0, 3600.0, None))]
    assert _drawn(draw_input_wait(summarize_events([]))) == 0


def test_metric_plots_draw_every_step_once_and_mark_restores() -> None:
    events = [step(k, k, k + 0.5, gen=1, loss=10.0 - k, lr=0.1) for k in range(1, 6)]
    events += [step(k, 20 + k, 20.5 + k, gen=2, loss=5.0 - k / 10) for k in range(4, 8)]
    series = series_of_events(events)
    markers = (RunMarker(kind="requeue", ts=10.0, generation=1),
               RunMarker(kind="restore", ts=21.0, generation=2, step=3))
    placed = place_markers(markers, [(k, k + 0.5) for k in range(1, 6)])
    assert [m.step for m in placed] == [5, 3]
    fig = draw_metric("loss", series, placed)
    curve = _lines(fig)[0]
    assert list(curve.get_xdata()) == [1, 2, 3, 4, 5, 6, 7]
    assert list(curve.get_ydata())[3:] == [4.6, 4.5, 4.4, 4.3]  # generation 2 wins 4 and 5
    vlines = [ln for ln in fig.axes[0].lines if ln.get_linestyle() in ("--", ":")]
    assert sorted(ln.get_xdata()[0] for ln in vlines) == [3, 5]
    assert len(_lines(draw_metric("lr", series, ()))) == 1
    assert _drawn(draw_metric("loss", series_of_events([]), ())) == 0


def test_report_embeds_the_metrics_and_keeps_the_image_width_rule() -> None:
    events = [step(k, k, k + 0.5, gen=1, loss=1.0 / k) for k in range(1, 5)]
    page = build_report(events)
    assert "img{max-width:100%}" in page and "}}" not in page.split("</style>")[0]
    data = json.loads(page.split('id="hpcrun-figures">')[1].split("</script>")[0])
    assert data["metrics"]["stats"]["loss"]["last"] == 0.25
    assert "<h2>Loss</h2>" in page
