"""Honest figures for a script that never reports a step: no "step 0", no "ETTR 0.0%"."""

from __future__ import annotations

from hpcrun.observe.export import metrics_from_status
from hpcrun.observe.figures import STEPS_NOT_REPORTED
from hpcrun.observe.heartbeat import NodeHeartbeat
from hpcrun.observe.status import RecordFacts, build_status, render_text, status_json
from tests.unit.observe.builders import ev, step


def _silent_events() -> list:
    """Two allocations of a script run (a preemption between them), no step event."""
    return [ev("state", 0.0, gen=1, state="STARTING", nodes=2),
            ev("rank_start", 2.0, gen=1, rank=0), ev("rank_start", 2.0, gen=1, rank=1),
            ev("state", 40.0, gen=1, state="PREEMPTED"),
            ev("state", 100.0, gen=2, state="STARTING", nodes=2),
            ev("rank_start", 102.0, gen=2, rank=0), ev("rank_start", 140.0, gen=2, rank=1)]


def _view(state: str, events: list, *, script_mode: bool = True, step_no: int = 0):
    facts = RecordFacts(run_id="r1", state=state, generation=2, requeues=1, step=step_no,
                        script_mode=script_mode)
    hb = {"n0": NodeHeartbeat(node="n0", ts=139.0, generation=2, ranks={})}
    return build_status(facts, events=events, heartbeats=hb, tails=[], now=150.0)


def test_a_silent_script_says_steps_are_not_reported_with_its_time_and_requeues() -> None:
    view = _view("SUCCEEDED", _silent_events())
    text = render_text(view)
    assert f"progress    {STEPS_NOT_REPORTED} (state SUCCEEDED, requeues 1" in text
    assert "step 0" not in text and "ETTR 0" not in text and "0.0%" not in text
    assert "node-hours" in text and "allocated" in text and "wall" in text
    body = status_json(view)
    assert body["steps_reported"] is False and body["ettr"] is None
    assert body["figures"]["ettr"] is None and body["figures"]["node_hours"] > 0


def test_the_export_leaves_out_step_tokens_and_ettr_of_a_silent_script() -> None:
    names = {m.name: m.value for m in metrics_from_status(_view("RUNNING", _silent_events()))}
    assert names["hpcrun_steps_reported"] == 0
    assert not {"hpcrun_step", "hpcrun_tokens_total", "hpcrun_ettr_ratio",
                "hpcrun_productive_seconds"} & set(names)


def test_a_script_that_reports_steps_gets_the_usual_figures() -> None:
    events = [*_silent_events(), step(1, 105.0, 106.0, gen=2), step(2, 106.0, 107.0, gen=2)]
    view = _view("RUNNING", events, step_no=2)
    assert view.steps_reported and view.ettr is not None
    assert "progress    step 2" in render_text(view)
    names = {m.name for m in metrics_from_status(view)}
    assert {"hpcrun_step", "hpcrun_ettr_ratio"} <= names


def test_an_entrypoint_run_before_its_first_step_is_not_called_a_silent_script() -> None:
    text = render_text(_view("STARTING", _silent_events()[:3], script_mode=False))
    assert "progress    no step reported yet" in text and STEPS_NOT_REPORTED not in text


def test_status_warns_when_steps_ran_with_no_state_registered(tmp_path) -> None:
    from hpcrun.control.log import RunLog
    from hpcrun.control.notes import NoRestoreNote
    from hpcrun.observe.collect import collect_status
    from tests.unit.observe.builders import make_run

    run = make_run(tmp_path)
    assert "no checkpoint will be committed" not in render_text(collect_status(run).view)
    log = RunLog(run)
    fence = log.read()[-1]
    log.publish_entry(NoRestoreNote(step=1), generation=fence.generation, holder=fence.holder)
    text = render_text(collect_status(run).view)
    assert ("warning     no checkpoint will be committed; a preemption will lose all progress "
            "(step 1 ran with no state registered") in text
