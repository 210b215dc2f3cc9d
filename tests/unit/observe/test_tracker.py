"""The tracker feed: each step once past the watermark, read back from the tracker's own files;
a tracker failure never reaches training; the spec section, the run-log note and admission."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from hpcrun.control.log import RunLog
from hpcrun.control.notes import TrackerNote, decode_note
from hpcrun.control.spec import RunSpec
from hpcrun.errors import SpecError
from hpcrun.launch.admission import Passed, ProbeTarget, Problem
from hpcrun.launch.admit import probe_tracker
from hpcrun.observe.events import EventWriter, read_event_file
from hpcrun.observe.tracker import (
    StepLogger,
    TensorBoardSink,
    rank_tracker,
    tensorboard_last_step,
    tracker_notes,
    tracker_run_id,
)
from hpcrun.runner import CommandResult, SubprocessRunner
from hpcrun.testing.fakes import FakeRunner
from hpcrun.vocab import Tracker
from tests.unit.observe.builders import step


class _Sink:
    kind = Tracker.TENSORBOARD
    run_ref = "r"
    location = "/nowhere"
    watermark = 0

    def __init__(self, fail_at: int | None = None) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.fail_at = fail_at
        self.closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == self.fail_at:
            raise ConnectionError("tracker server went away")
        self.logged.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


def test_steps_at_or_below_the_watermark_are_not_logged_again() -> None:
    sink = _Sink()
    feed = StepLogger(sink=sink, watermark=3)
    for k in (2, 3, 4, 5, 4, 6):  # a replay of 4 after 5 is skipped too
        feed(step(k, k, k + 1, loss=float(k), tag="x"))
    feed(step(7, 7, 8))  # no metric: nothing to log, the watermark stays
    assert [k for k, _ in sink.logged] == [4, 5, 6] and feed.watermark == 6
    assert sink.logged[0][1] == {"loss": 4.0}


def test_a_failing_tracker_stops_being_fed_without_raising(
        capsys: pytest.CaptureFixture[str]) -> None:
    sink = _Sink(fail_at=2)
    closed: list[int] = []
    feed = StepLogger(sink=sink, watermark=0, on_close=closed.append)
    for k in (1, 2, 3):
        feed(step(k, k, k + 1, loss=1.0))
    feed.close()
    assert [k for k, _ in sink.logged] == [1] and "went away" in feed.failed
    assert "stopped logging at step 2" in capsys.readouterr().err
    assert sink.closed and closed == [1]


def test_the_event_writer_feeds_what_it_wrote_and_closes_the_feed(tmp_path: Path) -> None:
    sink = _Sink()
    feed = StepLogger(sink=sink, watermark=0)
    with EventWriter(tmp_path / "ev.jsonl", run_id="r", generation=1, rank=0, node="n0",
                     observer=feed) as w:
        for k in (1, 2):
            w.emit("step", k, dur_s=0.1, tokens=4, loss=1.0 / k)
        w.emit("ckpt_stage", 2, dur_s=0.1)
    assert [k for k, _ in sink.logged] == [1, 2] and sink.closed
    assert len(list(read_event_file(tmp_path / "ev.jsonl"))) == 3


def test_tensorboard_watermark_is_read_back_from_its_event_files(tmp_path: Path) -> None:
    first = TensorBoardSink(tmp_path, "run/1")
    assert first.watermark == 0 and first.run_ref == tracker_run_id("run/1") == "run-1"
    for k in (1, 2, 3):
        first.log(k, {"loss": 1.0 / k})
    first.close()
    again = TensorBoardSink(tmp_path, "run/1")  # the next incarnation, same log dir
    assert again.watermark == 3 == tensorboard_last_step(Path(again.location))
    again.close()


def test_rank_zero_records_one_tracker_run_in_the_run_log(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    gen = log.claim("h").generation
    assert rank_tracker(Tracker.TENSORBOARD, rank=1, run_dir=tmp_path, run_id="r", project="p",
                        log=log, generation=gen, holder="h") is None
    feed = rank_tracker(Tracker.TENSORBOARD, rank=0, run_dir=tmp_path, run_id="r",
                        project="p", log=log, generation=gen, holder="h")
    assert feed is not None
    feed(step(1, 0, 1, loss=2.0))
    feed(step(2, 1, 2, loss=1.5))
    feed.close()
    notes = tracker_notes(log.read(), Tracker.TENSORBOARD)
    assert [(n.watermark, n.closed) for n in notes] == [(0, False), (2, True)]
    assert notes[0].location.endswith("tracker/tensorboard")


def test_the_tracker_note_round_trips() -> None:
    note = TrackerNote(tracker="mlflow", run_ref="abc", location="file:///x", watermark=7,
                       closed=True)
    assert decode_note(note.to_payload()) == note


def test_the_observe_section_is_validated_and_leaves_other_specs_ids_alone() -> None:
    base = {"name": "a", "entrypoint": "m:f"}
    spec = RunSpec.from_dict({**base, "observe": {"tracker": "wandb", "project": "lm"}})
    assert spec.observe.tracker is Tracker.WANDB and spec.observe.project == "lm"
    assert RunSpec.from_dict(base).spec_id == RunSpec.from_dict(
        {**base, "observe": {}}).spec_id
    with pytest.raises(SpecError, match=r"observe.tracker: expected one of"):
        RunSpec.from_dict({**base, "observe": {"tracker": "comet"}})


def test_admission_refuses_a_tracker_the_jobs_python_cannot_import() -> None:
    spec = RunSpec.from_dict({"name": "a", "entrypoint": "m:f",
                              "observe": {"tracker": "mlflow"}})
    target = ProbeTarget(python=sys.executable, code_path=".")
    (ok,) = probe_tracker(spec, target, runner=SubprocessRunner(), env={})
    assert isinstance(ok, Passed)
    missing = FakeRunner({sys.executable: CommandResult(argv=(), returncode=3, stdout="",
                                                         stderr="")})
    (bad,) = probe_tracker(spec, target, runner=missing, env={})
    assert isinstance(bad, Problem)
    assert "pip install mlflow-skinny" in bad.line() and "observe.tracker" in bad.line()
    assert probe_tracker(RunSpec.from_dict({"name": "a", "entrypoint": "m:f"}), target,
                         runner=missing, env={}) == []
