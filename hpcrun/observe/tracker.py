"""One experiment-tracker run per hpcrun run, across requeues, restarts and spare swaps.

With ``observe.tracker: tensorboard|wandb|mlflow`` in the spec, rank 0 logs every step's
metrics (the ones :mod:`hpcrun.observe.metrics` shows) to the tracker, from the rank's event
writer thread, so a slow tracker never stalls a step and ``ctx.step_done`` and
``hpcrun.lite.report`` both reach it. Each incarnation:

1. derives the tracker run from the hpcrun run (:func:`tracker_run_id`): wandb's run id
   (``WANDB_RUN_ID`` + ``WANDB_RESUME=allow``), MLflow's run (tagged ``hpcrun.run_id``; its id
   is the store's, found again by the tag or the run log's ``tracker`` note), one TensorBoard
   log dir ``<run_dir>/tracker/tensorboard``;
2. reads the watermark back from the tracker itself: the newest step it holds (TensorBoard's
   event files, MLflow's metric histories, wandb's resumed step), so an incarnation that died
   before its tracker flushed loses nothing and one that flushed logs nothing twice;
3. records the tracker run in the run log (a ``tracker`` note: kind, id, where);
4. logs only steps greater than the watermark: the steps a restore replays are skipped.

The tracker packages are optional; admission refuses a spec naming one that is not installed
(:mod:`hpcrun.launch.admit`). A tracker that fails while logging is reported once on stderr
and then left alone: telemetry never ends training.
"""

from __future__ import annotations

import math
import os
import re
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hpcrun.observe.metrics import step_metrics
from hpcrun.protocols import Event
from hpcrun.vocab import Tracker

TRACKER_DIR = "tracker"
"""Under the run directory: TensorBoard's log dir, MLflow's default file store, wandb's dir."""
RUN_ID_TAG = "hpcrun.run_id"
"""The MLflow tag naming the hpcrun run."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def tracker_run_id(run_id: str) -> str:
    """The tracker's run id (wandb) or name (MLflow) of an hpcrun run: the run id with every
    character outside ``[A-Za-z0-9_.-]`` replaced by ``-`` (wandb refuses ``/``, ``:``...)."""
    return _UNSAFE.sub("-", run_id)[:128]


class TrackerSink(Protocol):
    """One tracker run, opened for this incarnation."""

    kind: Tracker
    run_ref: str
    """The tracker's id of the run."""
    location: str
    """Where its data lives (a directory or a tracking URI)."""
    watermark: int
    """Newest step the tracker already holds (0: none)."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


@dataclass(kw_only=True, slots=True)
class StepLogger:
    """Feeds step events to a tracker: rank 0's, each step once, only past the watermark."""

    sink: TrackerSink
    """The tracker run."""
    watermark: int
    """Newest step logged (or held by the tracker when it opened)."""
    failed: str = ""
    """Why the tracker stopped being fed (empty while healthy)."""
    on_close: Callable[[int], None] | None = None
    """Called with the watermark once the tracker closed (records it in the run log)."""

    def __call__(self, event: Event) -> None:
        """Log ``event`` when it is a step past the watermark with a metric."""
        if self.failed or event.kind != "step" or event.step <= self.watermark:
            return
        metrics = step_metrics(event.data)
        if not metrics:
            return
        try:
            self.sink.log(event.step, metrics)
        except Exception as exc:  # a tracker must never end training
            self.failed = f"{type(exc).__name__}: {exc}"
            print(f"hpcrun: {self.sink.kind} tracker stopped logging at step {event.step}: "
                  f"{self.failed}", file=sys.stderr)
            return
        self.watermark = event.step

    def close(self) -> None:
        """Flush and close the tracker run (its errors are reported, not raised)."""
        try:
            self.sink.close()
            if self.on_close is not None:
                self.on_close(self.watermark)
        except Exception as exc:
            print(f"hpcrun: closing the {self.sink.kind} tracker failed: {exc}", file=sys.stderr)


# -- TensorBoard -------------------------------------------------------------------------------

class TensorBoardSink:
    """One log dir under the run directory; each incarnation appends an event file to it."""

    kind = Tracker.TENSORBOARD

    def __init__(self, run_dir: Path, run_id: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        logdir = Path(run_dir) / TRACKER_DIR / "tensorboard"
        self.run_ref, self.location = tracker_run_id(run_id), str(logdir)
        self.watermark = tensorboard_last_step(logdir)
        self._writer = SummaryWriter(str(logdir), flush_secs=5)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


def tensorboard_last_step(logdir: Path) -> int:
    """Newest scalar step in the event files of ``logdir`` (0 when none)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    last = 0
    for path in sorted(logdir.glob("events.out.tfevents.*")) if logdir.is_dir() else []:
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("summary") and event.summary.value:
                last = max(last, int(event.step))
    return last


# -- MLflow ------------------------------------------------------------------------------------

class MlflowSink:
    """The MLflow run tagged with the hpcrun run: ``$MLFLOW_TRACKING_URI``, else a file store
    under the run directory; experiment ``observe.project``."""

    kind = Tracker.MLFLOW

    def __init__(self, run_dir: Path, run_id: str, *, project: str, known_ref: str,
                 environ: Mapping[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        uri = environ.get("MLFLOW_TRACKING_URI") or \
            (Path(run_dir) / TRACKER_DIR / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in
        self._client = MlflowClient(tracking_uri=uri)
        self.location = uri
        self.run_ref = known_ref or self._find_or_create(tracker_run_id(run_id), project)
        self.watermark = self._last_step()

    def _find_or_create(self, name: str, project: str) -> str:
        exp = self._client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(project)
        found = self._client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{name}'",
                                         max_results=1)
        if found:
            return str(found[0].info.run_id)
        run = self._client.create_run(exp_id, run_name=name, tags={RUN_ID_TAG: name})
        return str(run.info.run_id)

    def _last_step(self) -> int:
        keys = self._client.get_run(self.run_ref).data.metrics
        return max((m.step for k in keys for m in self._client.get_metric_history(
            self.run_ref, k)), default=0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_ref, metrics=[
            Metric(key=k, value=v, timestamp=now, step=step) for k, v in metrics.items()])

    def close(self) -> None:
        return None  # every log_batch is already in the store


def mlflow_environ(run_dir: Path, run_id: str, *, project: str,
                   environ: Mapping[str, str]) -> dict[str, str]:
    """What a script's own ``mlflow.start_run()`` on rank 0 needs to log into the hpcrun run's
    one MLflow run (found by its ``hpcrun.run_id`` tag, else created): MLflow resumes the run
    ``MLFLOW_RUN_ID`` names in the store ``MLFLOW_TRACKING_URI`` names."""
    sink = MlflowSink(run_dir, run_id, project=project, known_ref="", environ=environ)
    out = {"MLFLOW_TRACKING_URI": sink.location, "MLFLOW_RUN_ID": sink.run_ref,
           "MLFLOW_EXPERIMENT_NAME": project}
    if sink.location.startswith("file:"):
        out["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow's opt-in for its file store
    return out


# -- Weights & Biases --------------------------------------------------------------------------

class WandbSink:
    """The wandb run whose id is :func:`tracker_run_id` (``WANDB_RUN_ID``, resumed with
    ``WANDB_RESUME=allow``); ``WANDB_MODE=offline`` keeps it under the run directory."""

    kind = Tracker.WANDB

    def __init__(self, run_dir: Path, run_id: str, *, project: str) -> None:
        import wandb

        self.run_ref = tracker_run_id(run_id)
        os.environ["WANDB_RUN_ID"], os.environ["WANDB_RESUME"] = self.run_ref, "allow"
        wdir = Path(run_dir) / TRACKER_DIR
        wdir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(id=self.run_ref, resume="allow", project=project,
                               dir=str(wdir), name=run_id)
        self.location = str(wdir / "wandb")
        # an online resume's step counter is one past the newest step the server holds; the
        # local transaction logs of every earlier incarnation (offline or not) say the same
        # of what they wrote
        resumed = int(getattr(self._run, "starting_step", 0) or 0) - 1
        self.watermark = max(0, resumed, *(int(row.get("_step", 0)) for row in
                                           wandb_history(wdir / "wandb", self.run_ref)))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


_WANDB_BLOCK = 32768
_WANDB_HEADER = 7  # b":W&B", magic (2 bytes), version (1 byte)


def wandb_history(wandb_dir: Path, run_ref: str) -> list[dict[str, float]]:
    """Every history row (``_step`` and the metrics) in the local transaction logs of run
    ``run_ref`` (``<wandb_dir>/*-<id>/run-<id>.wandb``, one per incarnation, oldest first).

    The file is a LevelDB-style log (32 KiB blocks of records: crc32c, length, type) of wandb
    ``Record`` protobufs; a torn tail is where the writer died, and reading stops there.
    """
    rows: list[dict[str, float]] = []
    for path in sorted(Path(wandb_dir).glob(f"*-{run_ref}/run-{run_ref}.wandb")):
        for record in _wandb_records(path.read_bytes()):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): _json_number(item.value_json)
                             for item in record.history.item})
    return rows


def _json_number(text: str) -> float:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return math.nan
    return float(value) if isinstance(value, int | float) else math.nan


def _wandb_records(data: bytes) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    if data[:4] != b":W&B":
        return
    pos, buf = _WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + size > len(data):
            return  # torn
        buf += data[pos + 7:pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            try:
                record.ParseFromString(buf)
            except Exception:  # a torn or foreign record ends what can be read
                return
            buf = b""
            yield record


# -- opening -----------------------------------------------------------------------------------

def open_tracker(kind: Tracker, *, run_dir: Path, run_id: str, project: str,
                 known_ref: str = "", environ: Mapping[str, str] | None = None) -> TrackerSink:
    """Open this incarnation's handle on the run's tracker run (see module, steps 1-2)."""
    env = os.environ if environ is None else environ
    if kind == Tracker.TENSORBOARD:
        return TensorBoardSink(run_dir, run_id)
    if kind == Tracker.MLFLOW:
        return MlflowSink(run_dir, run_id, project=project, known_ref=known_ref, environ=env)
    return WandbSink(run_dir, run_id, project=project)


def tracker_notes(entries: Iterable[Any], kind: Tracker) -> list[Any]:
    """The run log's ``tracker`` notes of ``kind``, oldest first (pure)."""
    from hpcrun.control.entries import decode
    from hpcrun.control.notes import TrackerNote
    from hpcrun.control.payload import EntryKind

    out = []
    for e in entries:
        if e.kind == EntryKind.NOTE:
            try:
                note = decode(e)
            except ValueError:
                continue
            if isinstance(note, TrackerNote) and note.tracker == kind.value:
                out.append(note)
    return out


def rank_tracker(kind: Tracker | None, *, rank: int, run_dir: Path, run_id: str, project: str,
                 log: Any, generation: int, holder: str) -> StepLogger | None:
    """Rank 0's tracker feed for this incarnation (None on other ranks or without a tracker):
    open the tracker run, take the watermark (the tracker's own, at least what the run log
    says an earlier incarnation closed it at), record the run in the run log (module, 1-4)."""
    if kind is None or rank != 0:
        return None
    from hpcrun.control.fencing import fold_fences
    from hpcrun.control.notes import TrackerNote

    notes = tracker_notes(fold_fences(log.read())[1], kind)
    try:
        sink = open_tracker(kind, run_dir=run_dir, run_id=run_id, project=project,
                            known_ref=notes[-1].run_ref if notes else "")
    except Exception as exc:  # telemetry never ends training: run on without the tracker
        print(f"hpcrun: the {kind} tracker did not open, steps are not logged to it: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    closed = max((n.watermark for n in notes if n.closed), default=0)

    def note(watermark: int, *, done: bool) -> None:
        log.publish_entry(TrackerNote(tracker=kind.value, run_ref=sink.run_ref,
                                      location=sink.location, watermark=watermark,
                                      closed=done), generation=generation, holder=holder)

    start = max(sink.watermark, closed)
    note(start, done=False)
    return StepLogger(sink=sink, watermark=start,
                      on_close=lambda w: note(w, done=True))
