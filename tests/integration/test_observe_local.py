"""What the operator sees is true, on whole local runs through the real CLI: input wait is
measured on the real data path, and `hpcrun status` and `hpcrun report` agree on every figure
they share."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.record import read_record
from hpcrun.observe.events import sorted_events
from tests.integration.local_helpers import cli, local_spec, submit
from tests.pages import read_figures_json

DELAY_S = 0.03
"""Seconds added to every document read of the slowed loader (examples/tiny_lm read_delay_s)."""
STEPS = 40


def _run(root: Path, delay_s: float, inject: str | None = None) -> Path:
    spec = local_spec(steps=STEPS, every_steps=20, config={"read_delay_s": delay_s})
    run = submit(root, spec, inject=inject)
    assert str(read_record(run).state) == "SUCCEEDED"
    return run


def _waits(run: Path) -> list[Any]:
    return [e.data.get("input_wait_s") for e in sorted_events(run) if e.kind == "step"]


def _status(root: Path, run: Path, *extra: str) -> Any:
    out = cli(root, "status", run.name, "--no-reconcile", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if "--json" in extra else out.stdout


def _report(root: Path, run: Path) -> str:
    out = cli(root, "report", run.name, "-o", str(root / "report.html"))
    assert out.returncode == 0, out.stderr
    return (root / "report.html").read_text()


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("slow")
    return root, _run(root, DELAY_S, inject="preempt@step=20")


def test_a_slowed_loader_shows_its_wait_in_events_ettr_and_report(
        slow_run: tuple[Path, Path]) -> None:
    root, run = slow_run
    waits = _waits(run)
    assert len(waits) == 2 * STEPS and all(isinstance(w, float) for w in waits)
    # Each step's batch needs at least one slowed read that no compute overlaps.
    assert statistics.median(waits) >= DELAY_S
    figures = read_figures_json(_report(root, run))["figures"]
    assert figures["input_wait_measured"] is True
    assert figures["seconds"]["input_wait"] >= 0.5 * DELAY_S * 2 * STEPS / 2
    assert figures["seconds"]["input_wait"] > figures["seconds"]["productive"]


def test_a_fast_loader_shows_about_no_input_wait(tmp_path: Path,
                                                 slow_run: tuple[Path, Path]) -> None:
    run = _run(tmp_path, 0.0)
    waits = _waits(run)
    assert all(isinstance(w, float) for w in waits)
    assert statistics.median(waits) < DELAY_S / 4
    fast = _status(tmp_path, run, "--json")["figures"]
    slow = _status(*slow_run, "--json")["figures"]
    assert fast["input_wait_s"] / fast["allocated_s"] < slow["input_wait_s"] / slow[
        "allocated_s"] / 3


def test_status_and_report_agree_on_every_shared_figure(slow_run: tuple[Path, Path]) -> None:
    root, run = slow_run
    status = _status(root, run, "--json")
    report = read_figures_json(_report(root, run))["figures"]
    assert set(status["figures"]) == set(report)
    for key, value in report.items():
        if isinstance(value, dict | float):
            assert status["figures"][key] == pytest.approx(value), key
        else:
            assert status["figures"][key] == value, key
    assert status["ettr"] == pytest.approx(report["ettr"])
    assert status["figures"]["accepted_tokens"] == status["facts"]["tokens"]
    # allocated time and node-hours are the record's allocations (one figure everywhere): the
    # preemption's requeue is two allocations, the wait between them queue, not allocated
    rec = read_record(run)
    assert len(rec.allocations) == 2 and rec.requeues == 1
    assert status["figures"]["allocated_s"] == pytest.approx(rec.wall_s)
    assert status["figures"]["node_hours"] == pytest.approx(
        sum(a.seconds(0.0) * a.nodes for a in rec.allocations) / 3600.0)
    assert status["figures"]["queue_s"] == pytest.approx(sum(a.queued_s for a in rec.allocations))
    text = _status(root, run)
    page = _report(root, run)
    for label in ("throughput", "end to end", "ETTR", "input wait", "accepted"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{label:<11} "))
        assert line[12:] in page, label  # the report prints the very same figure text


def test_status_of_the_finished_run_tells_what_is_known(slow_run: tuple[Path, Path]) -> None:
    root, run = slow_run
    text = _status(root, run)
    body = _status(root, run, "--json")
    # the preemption stop committed progress: a segment of the run, not a fault
    assert "segments    1 (no limit)" in text and "fault: preemption" not in text
    for placeholder in ("node ?", "rank -1", "step -1", "{", "|\n"):
        assert placeholder not in text + "\n", placeholder
    assert {d["step"] for d in body["nodes"].values()} == {STEPS}
    assert all(t["line"] for t in body["tails"])
    data = next(ln for ln in text.splitlines() if ln.startswith("data "))
    assert f"at step {STEPS}: next global batch {STEPS};" in data
    assert "exposure    none: the final step is committed" in text


def test_status_reads_one_summary_that_shows_what_every_event_shows(
        slow_run: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    from hpcrun.observe.collect import collect_status
    from hpcrun.observe.runsummary import read_run_summary
    from hpcrun.observe.status import status_json

    _root, run = slow_run
    nodes = set(read_record(run).membership)
    # one stream per node on the shared filesystem, no per-rank event files
    assert sorted(p.name for p in (run / "events").iterdir()) == sorted(
        f"{n}.jsonl" for n in nodes)
    summary = read_run_summary(run)
    assert summary is not None and summary.final and summary.generation == 2
    now = summary.ts + 30.0
    from_summary = status_json(collect_status(run, now=now).view)
    from_events = status_json(collect_status(run, now=now, use_run_summary=False).view)
    assert from_summary == from_events
    assert from_summary["figures"]["accepted_tokens"] == from_summary["facts"]["tokens"] > 0
    # status needs nothing but the record and the summary: without the streams, heartbeats
    # and rank output it shows the same
    bare = tmp_path / run.name
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("events", "heartbeat", "logs"))
    assert status_json(collect_status(bare, now=now).view) == from_events
