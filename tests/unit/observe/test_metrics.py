"""The training-metric series: each step once, the last incarnation wins, junk skipped; and the
same figures in status, its JSON, the Prometheus export and ``hpcrun metrics``."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from hpcrun.control.entries import StatePayload
from hpcrun.control.log import LogEntry
from hpcrun.control.states import RunState
from hpcrun.observe.export import metric_name, metrics_from_status, render_textfile
from hpcrun.observe.metrics import (
    MetricRows,
    MetricSeries,
    fitted_change,
    fold_step_metrics,
    markers_from_log,
    metric_series,
    render_csv,
    rows_from_json,
    rows_to_json,
    status_lines,
    step_metrics,
)
from hpcrun.observe.status import RecordFacts, build_status, render_text, status_json
from hpcrun.observe.summary import EventSummary, summarize_events
from hpcrun.protocols import Event
from tests.unit.observe.builders import step


def series_of_events(events: Iterable[Event]) -> MetricSeries:
    """The series the run summary folds from these step events (as status and the report)."""
    rows: MetricRows = {}
    for e in events:
        if e.kind == "step":
            fold_step_metrics(rows, e)
    return metric_series(rows)

def _run_with_a_restore() -> list:  # type: ignore[type-arg]
    """Generation 1 reaches step 6, generation 2 restores step 3 and replays 4..6 to 8."""
    g1 = [step(k, k, k + 0.5, gen=1, loss=10.0 - k, acc=k / 10) for k in range(1, 7)]
    g2 = [step(k, 100 + k, 100.5 + k, gen=2, loss=5.0 - k / 10) for k in range(4, 9)]
    return g1 + g2


def test_replayed_steps_are_shown_once_with_the_last_incarnations_value() -> None:
    series = series_of_events(_run_with_a_restore())
    assert series.names == ("loss", "acc")
    assert [k for k, _ in series.values["loss"]] == list(range(1, 9))
    assert dict(series.values["loss"])[5] == 4.5  # generation 2's value, not 5.0
    assert series.replayed_steps == 3
    # acc was reported only by generation 1 before the restore: steps 4..6 lose it
    assert [k for k, _ in series.values["acc"]] == [1, 2, 3]
    text = status_lines(series)
    assert text[0].startswith("metric      loss 4.2 at step 8 (min 4.2 at step 8; falling")
    assert "3 step(s) replayed after a restore are shown once" in text[-1]


def test_non_numeric_and_non_finite_values_are_skipped() -> None:
    data = {"loss": 1.5, "lr": float("nan"), "gn": float("inf"), "tag": "warm", "ok": True,
            "dur_s": 0.2, "tokens": 100, "input_wait_s": 0.1, "n": 3}
    assert step_metrics(data) == {"loss": 1.5, "n": 3.0}
    series = series_of_events([step(1, 0, 1, loss=None), step(2, 1, 2, loss=2.0, x="y")])
    assert series.names == ("loss",) and series.values["loss"] == ((2, 2.0),)


def test_the_lowest_rank_is_the_steps_value_whatever_the_file_order() -> None:
    events = [step(1, 0, 1, rank=r, loss=float(r)) for r in (3, 0, 1)]
    assert series_of_events(events).values["loss"] == ((1, 0.0),)
    assert series_of_events(events[::-1]).values["loss"] == ((1, 0.0),)


@given(st.permutations(range(11)))
def test_the_fold_gives_the_same_series_in_any_event_order(order: list[int]) -> None:
    events = _run_with_a_restore()
    shuffled = [events[i] for i in order]
    assert series_of_events(shuffled) == series_of_events(events)


def test_trend_is_the_fitted_change_over_the_window() -> None:
    assert fitted_change([(k, 2.0 * k) for k in range(10, 20)]) == 18.0
    assert fitted_change([(1, 1.0)]) is None
    stats = metric_series({k: [1, 0, {"loss": 100.0 - k}, [1]] for k in range(1, 101)}).stats()
    assert math.isclose(stats[0].trend or 0.0, -19.0)  # 20 steps, slope -1
    assert stats[0].min == 0.0 and stats[0].min_step == 100


def test_rows_round_trip_through_json() -> None:
    s = summarize_events(_run_with_a_restore())
    assert rows_from_json(rows_to_json(s.metrics)) == s.metrics
    back = EventSummary.from_json(s.to_json())
    assert back.metric_series() == s.metric_series()


def test_status_json_export_and_csv_show_the_same_last_loss() -> None:
    facts = RecordFacts(run_id="r-1", state="SUCCEEDED", generation=2, step=8)
    view = build_status(facts, events=_run_with_a_restore(), heartbeats={}, tails=[], now=200.0)
    assert "metric      loss 4.2 at step 8" in render_text(view)
    body = status_json(view)
    assert body["metrics"]["stats"]["loss"]["last"] == 4.2
    assert body["metrics"]["replayed_steps"] == 3
    prom = render_textfile(metrics_from_status(view), labels={"run_id": "r-1"})
    samples = {s.name: s.value for f in text_string_to_metric_families(prom) for s in f.samples}
    assert samples["hpcrun_metric_loss"] == 4.2 and samples["hpcrun_metric_acc"] == 0.3
    rows = list(csv.reader(io.StringIO(render_csv(view.metrics))))  # type: ignore[arg-type]
    assert rows[0] == ["step", "loss", "acc"] and rows[-1] == ["8", "4.2", ""]
    assert len(rows) == 9  # header + steps 1..8, each once


def test_prometheus_names_are_sanitised_and_unique() -> None:
    assert metric_name("val/loss-ema") == "hpcrun_metric_val_loss_ema"
    events = [step(1, 0, 1, **{"a.b": 1.0, "a_b": 2.0})]
    view = build_status(RecordFacts(run_id="r", state="RUNNING"), events=events,
                        heartbeats={}, tails=[], now=2.0)
    names = [m.name for m in metrics_from_status(view) if m.name.startswith("hpcrun_metric_")]
    assert names == ["hpcrun_metric_a_b", "hpcrun_metric_a_b_2"]


def _state(slot: int, gen: int, state: RunState, **kw: object) -> LogEntry:
    payload = StatePayload(state=state, **kw).to_payload()  # type: ignore[arg-type]
    return LogEntry(slot=slot, kind="state", generation=gen, holder="h", ts=float(slot), writer="w",
                    payload=payload)


def test_markers_from_the_run_log_count_as_the_record_does() -> None:
    entries = [_state(0, 1, RunState.STARTING), _state(1, 1, RunState.RUNNING),
               _state(2, 1, RunState.RECOVERING), _state(3, 2, RunState.STARTING),
               _state(4, 2, RunState.RUNNING, restored_step=40),
               _state(5, 2, RunState.PREEMPTED), _state(6, 3, RunState.STARTING),
               _state(7, 3, RunState.RUNNING, restored_step=80)]
    marks = markers_from_log(entries)
    assert [(m.kind, m.step) for m in marks] == [
        ("restart", None), ("restore", 40), ("requeue", None), ("restore", 80)]
