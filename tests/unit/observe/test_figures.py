"""One function computes the figures status, report and export share; the timeline paints
exactly the charge the breakdown reports."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings

from hpcrun.observe.ettr import Bucket, bin_segments
from hpcrun.observe.figures import figure_rows, run_figures, run_timeline
from hpcrun.observe.report import build_report
from hpcrun.observe.status import RecordFacts, build_status, render_text, status_json
from hpcrun.observe.summary import summarize_events
from hpcrun.protocols import Event
from tests.pages import read_figures_json
from tests.unit.observe.builders import span, step, two_generation_log
from tests.unit.observe.test_summary import events as event_lists


def _painted(evs: list[Event], bins: int) -> dict[str, float]:
    segments = run_timeline(summarize_events(evs))
    origin = min(a.start for a, _ in segments)
    width = max(a.end for a, _ in segments) - origin
    out: dict[str, float] = defaultdict(float)
    for _, segs in segments:
        for b in bin_segments(segs, start=origin, width=width, bins=bins) if width > 0 else []:
            for bucket, seconds in b.items():
                out[bucket.value] += seconds
    return out


@settings(max_examples=60, deadline=None)
@given(event_lists())
def test_the_timeline_paints_every_bucket_with_its_charged_seconds(evs: list[Event]) -> None:
    fig = run_figures(summarize_events(evs))
    assert fig is not None
    painted = _painted(evs, bins=97)
    for bucket in Bucket:
        assert painted.get(bucket.value, 0.0) == pytest.approx(fig.seconds[bucket.value],
                                                               abs=1e-6)


def test_many_short_stalls_do_not_hide_the_productive_time() -> None:
    """300 steps of 1 s with 0.01 s collectives between them: the old plot drew sub-pixel
    stall bars over the productive ones and showed mostly stall."""
    evs = []
    for k in range(1, 301):
        evs += [step(k, k * 1.01, k * 1.01 + 1.0), span("collective", k * 1.01 + 1.0,
                                                        k * 1.01 + 1.01, k)]
    painted = _painted(evs, bins=400)
    total = sum(painted.values())
    assert painted[Bucket.PRODUCTIVE] / total > 0.98 > 0.02 > painted[Bucket.STALL] / total


def test_status_and_report_show_the_same_figures_with_their_divisors() -> None:
    evs = two_generation_log()
    facts = RecordFacts(run_id="demo-1", state="SUCCEEDED", generation=2, step=6)
    view = build_status(facts, events=evs, heartbeats={}, tails=[], now=2000.0)
    page = build_report(evs, facts=facts)
    assert status_json(view)["figures"] == read_figures_json(page)["figures"]
    text = render_text(view)
    assert view.figures is not None
    for label, line in figure_rows(view.figures):
        assert f"{label:<11} {line}" in text
        assert line.replace("&", "&amp;") in page
    rows = dict(figure_rows(view.figures))
    assert "tok/s per allocated second" in rows["throughput"]
    assert "tok/s per productive second" in rows["throughput"]
    assert view.token_rate is None  # a finished run shows whole-run figures, no recent rate
