"""The numbers researchers look at, on whole local runs through the real CLI: tiny_lm preempted
twice and crashed once (so a restore replays steps) logs every step exactly once to one tracker
run, and status --json, hpcrun metrics --csv, the Prometheus file and the report show the same
last loss as the step events."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcrun.control.notes import TrackerNote
from hpcrun.control.record import read_record
from hpcrun.observe.events import sorted_events
from hpcrun.observe.tracker import TRACKER_DIR, tracker_notes, tracker_run_id, wandb_history
from hpcrun.vocab import Tracker
from tests.integration.local_helpers import cli, local_spec, submit, valid_entries
from tests.pages import read_figures_json

STEPS = 45
INJECT = "preempt@step=12;preempt@step=25,restart=1;crash@step=35,rank=1,restart=2"
"""Two preemptions (each commits its step) and a crash after step 35 (the restore of step 30
replays 31..35)."""


def _tracked_run(root: Path, tracker: Tracker, env: dict[str, str] | None = None) -> Path:
    spec = local_spec(steps=STEPS, every_steps=10, observe={"tracker": tracker.value})
    run = submit(root, spec, inject=INJECT, env=env)
    record = read_record(run)
    assert str(record.state) == "SUCCEEDED" and record.requeues == 2 and record.step == STEPS
    return run


def _notes(run: Path, tracker: Tracker) -> list[TrackerNote]:
    return tracker_notes(valid_entries(run), tracker)


def _one_tracker_run(run: Path, tracker: Tracker) -> str:
    notes = _notes(run, tracker)
    # rank 0 of each of the 4 incarnations opened it; the crashed one never closed it
    assert [n.closed for n in notes].count(False) == 4 and len(notes) == 7
    assert len({n.run_ref for n in notes}) == 1
    return notes[0].run_ref


def _rank0_losses(run: Path) -> dict[int, float]:
    """The loss of each step as rank 0 reported it, the newest generation winning."""
    out: dict[int, tuple[int, float]] = {}
    for e in sorted_events(run):
        ok = e.kind == "step" and e.rank == 0 and isinstance(e.data.get("loss"), float)
        if ok and (e.step not in out or e.generation >= out[e.step][0]):
            out[e.step] = (e.generation, e.data["loss"])
    return {k: v for k, (_, v) in sorted(out.items())}


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tb")
    return root, _tracked_run(root, Tracker.TENSORBOARD)


def test_tensorboard_holds_every_step_exactly_once_in_one_log_dir(
        tb_run: tuple[Path, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run = tb_run
    assert _one_tracker_run(run, Tracker.TENSORBOARD) == tracker_run_id(run.name)
    logdir = run / TRACKER_DIR / "tensorboard"
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalars = acc.Scalars("loss")
    assert [s.step for s in scalars] == list(range(1, STEPS + 1))
    losses = _rank0_losses(run)
    assert [s.value for s in scalars] == pytest.approx([losses[k] for k in sorted(losses)])
    # the crash made the gang replay steps: the tracker still has each once
    replays = [e.step for e in sorted_events(run) if e.kind == "step" and e.rank == 0]
    assert len(replays) > STEPS


def test_status_metrics_export_and_report_show_the_same_last_loss(
        tb_run: tuple[Path, Path]) -> None:
    root, run = tb_run
    last = _rank0_losses(run)[STEPS]
    status = json.loads(cli(root, "status", run.name, "--no-reconcile", "--json").stdout)
    stats = status["metrics"]["stats"]["loss"]
    assert stats["last"] == last and stats["last_step"] == STEPS
    assert status["metrics"]["replayed_steps"] > 0
    text = cli(root, "status", run.name, "--no-reconcile").stdout
    assert f"metric      loss {last:.6g} at step {STEPS}" in text
    out = cli(root, "metrics", run.name, "--csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.reader(io.StringIO(out.stdout)))
    assert rows[0][:2] == ["step", "loss"] and [r[0] for r in rows[1:]] == [
        str(k) for k in range(1, STEPS + 1)]
    assert float(rows[-1][1]) == last
    prom_dir = root / "prom"
    assert cli(root, "export", run.name, "--prometheus", str(prom_dir)).returncode == 0
    (prom,) = prom_dir.glob("*.prom")
    samples = {s.name: s.value for f in text_string_to_metric_families(prom.read_text())
               for s in f.samples}
    assert samples["hpcrun_metric_loss"] == last
    page_path = root / "report.html"
    assert cli(root, "report", run.name, "-o", str(page_path)).returncode == 0
    page = page_path.read_text()
    assert read_figures_json(page)["metrics"]["stats"]["loss"]["last"] == last
    assert "<h2>Loss</h2>" in page and "restores (green dotted" in page


@pytest.mark.slow
def test_mlflow_file_store_holds_every_step_exactly_once_in_one_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = _tracked_run(tmp_path, Tracker.MLFLOW)
    ref = _one_tracker_run(run, Tracker.MLFLOW)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=_notes(run, Tracker.MLFLOW)[0].location)
    history = client.get_metric_history(ref, "loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
    losses = _rank0_losses(run)
    assert {m.step: m.value for m in history} == pytest.approx(losses)
    assert len(client.search_runs([client.get_run(ref).info.experiment_id])) == 1


@pytest.mark.slow
def test_wandb_offline_holds_every_step_exactly_once_in_one_run(tmp_path: Path) -> None:
    env: dict[str, Any] = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    run = _tracked_run(tmp_path, Tracker.WANDB, env=env)
    ref = _one_tracker_run(run, Tracker.WANDB)
    assert ref == tracker_run_id(run.name)
    rows = wandb_history(run / TRACKER_DIR / "wandb", ref)
    assert sorted(int(r["_step"]) for r in rows) == list(range(1, STEPS + 1))
    losses = _rank0_losses(run)
    assert {int(r["_step"]): r["loss"] for r in rows} == pytest.approx(losses)
