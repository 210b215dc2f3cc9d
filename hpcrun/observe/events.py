"""Typed per-rank event logs (JSON Lines) written without ever blocking training.

A rank's :class:`EventWriter` writes into a node-local directory; its node's agent forwards those
lines into ONE stream per node on the shared filesystem, ``<run_dir>/events/<node>.jsonl``
(:mod:`hpcrun.runtime.node.observations`), so the shared tier sees one file per node, not per rank.
Every event line is one :class:`hpcrun.protocols.Event` carrying run ID, generation, global step,
dataset ID, node, rank and versions; a node stream also carries the agent's heartbeat records
(:mod:`hpcrun.observe.runsummary`), which are not events and which event readers skip. Runs written
before node streams (``events/<node>/rank-00003.jsonl``, ``events/<node>/agent.jsonl``) are read the
same way.

:meth:`EventWriter.emit` only puts the event on a bounded queue; a background thread writes
batches. When the queue is full the event is dropped and counted: a slow shared filesystem may
lose telemetry but must never stall an optimizer step.

Readers treat the files as untrusted: a torn last line (a writer killed mid-write) or any
malformed line is skipped, never guessed at.

Span convention: a span event's ``ts`` is its end; ``data["start_ts"]`` its start and
``data["dur_s"]`` its duration.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ArgumentError
from hpcrun.protocols import Event

EVENTS_DIR = "events"
AGENT_FILE = "agent.jsonl"
NODE_STREAM_SUFFIX = ".jsonl"
_RANK_FILE_RE = re.compile(r"^rank-(\d+)\.jsonl$")
_BATCH = 512


class EventKind(StrEnum):
    """Event kinds the runtime and agents write (``kind`` stays a str for forward compatibility)."""

    STEP = "step"                # data: dur_s, tokens, loss, input_wait_s
    ADMISSION = "admission"      # span: from process start to the first step
    INPUT_WAIT = "input_wait"    # span: waiting for the next batch
    COMPUTE = "compute"          # span: forward/backward/optimizer
    COLLECTIVE = "collective"    # span: the stop agreement at a step boundary
    CKPT_STAGE = "ckpt_stage"    # span: host copy of state (the exposed cost C)
    CKPT_WRITE = "ckpt_write"    # span: shard writes (exposed only when data["blocking"])
    CKPT_COMMIT = "ckpt_commit"  # span: manifest + log commit (exposed only when blocking)
    DRAIN = "drain"              # span: tier-0 → tier-1 copy by the agent (data: ckpt_id, lag_s)
    RECOVERY = "recovery"        # span: in-allocation repair (kill, respawn)
    RESTORE = "restore"          # span: loading a checkpoint
    FAULT = "fault"              # data: fault, signature, detail
    STRAGGLER = "straggler"      # data: score, straggler_rank, straggler_node
    HANG = "hang"                # data: stalled_s, hang_rank, hang_node
    STATE = "state"              # data: state, nodes (STARTING marks an allocation's start)
    RANK_START = "rank_start"    # data: backend, launcher, device, cpus (binding), timeouts,
    #                              image_root, image_root_id (in an image: what / is)
    REGISTERED = "registered"    # data: families (preflight's probe: ctx.restore accepted them)


SPAN_KINDS = frozenset({
    EventKind.ADMISSION, EventKind.INPUT_WAIT, EventKind.COMPUTE, EventKind.COLLECTIVE,
    EventKind.CKPT_STAGE, EventKind.CKPT_WRITE, EventKind.CKPT_COMMIT, EventKind.DRAIN,
    EventKind.RECOVERY, EventKind.RESTORE,
})


def event_path(run_dir: Path, *, node: str, rank: int) -> Path:
    """Where the writer of ``rank`` on ``node`` keeps its events (rank -1: the node agent)."""
    name = AGENT_FILE if rank < 0 else f"rank-{rank:05d}.jsonl"
    return Path(run_dir) / EVENTS_DIR / node / name


def node_stream_path(run_dir: Path, node: str) -> Path:
    """The one event stream of ``node`` on the shared filesystem (its agent writes it)."""
    return Path(run_dir) / EVENTS_DIR / f"{node}{NODE_STREAM_SUFFIX}"


def span_bounds(event: Event) -> tuple[float, float]:
    """(start, end) of an event: a span's recorded interval, or an instant at ``ts``."""
    dur = event.data.get("dur_s")
    if isinstance(dur, int | float) and dur >= 0:
        start = event.data.get("start_ts")
        begin = float(start) if isinstance(start, int | float) else event.ts - float(dur)
        return begin, begin + float(dur)
    return event.ts, event.ts


_STOP = object()


class EventObserver(Protocol):
    """Sees every event the writer thread wrote (rank 0's tracker feed,
    :class:`hpcrun.observe.tracker.StepLogger`), and is closed after the last one."""

    def __call__(self, event: Event) -> None: ...

    def close(self) -> None: ...


class EventWriter:
    """Writes one rank's (or agent's) events from a background thread; ``emit`` never blocks."""

    def __init__(self, path: Path, *, run_id: str, generation: int, rank: int, node: str,
                 dataset_id: str = "", versions: Mapping[str, str] | None = None,
                 clock: Clock = SYSTEM_CLOCK, max_queue: int = 10000,
                 observer: EventObserver | None = None) -> None:
        if max_queue < 1:
            raise ArgumentError(f"max_queue must be >= 1 event, got {max_queue}")
        self.path = Path(path)
        self._base: dict[str, Any] = {
            "run_id": run_id, "generation": generation, "rank": rank, "node": node,
            "dataset_id": dataset_id, "versions": dict(versions or {})}
        self._clock = clock
        self._observer = observer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._dropped = 0
        self._closed = False
        self.error: OSError | None = None
        """Why the writer stopped early (the filesystem refused), None while healthy."""
        self._thread = threading.Thread(target=self._run, name=f"hpcrun-events-{rank}",
                                        daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full (or emitted after close)."""
        return self._dropped

    def emit(self, kind: str, step: int, **data: Any) -> None:
        """Queue one event stamped now; drop and count it when the queue is full."""
        if self._closed:
            self._dropped += 1
            return
        event = Event(kind=str(kind), ts=self._clock.now(), step=step, data=data, **self._base)
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._dropped += 1

    @contextlib.contextmanager
    def span(self, kind: str, step: int, **data: Any) -> Iterator[None]:
        """Time the block and emit ``kind`` with ``start_ts`` and ``dur_s`` when it exits."""
        start_wall, start_mono = self._clock.now(), self._clock.monotonic()
        try:
            yield
        finally:
            dur = max(0.0, self._clock.monotonic() - start_mono)
            self.emit(kind, step, start_ts=start_wall, dur_s=dur, **data)

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued and stop the writer thread."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Full):  # a dead writer thread must not hang close
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)
        if self._observer is not None and not self._thread.is_alive():
            self._observer.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as out:
                while True:
                    batch, stop = self._take_batch()
                    if batch:
                        out.write("".join(self._serialise(e) for e in batch))
                        out.flush()
                        self._observe(batch)
                    if stop:
                        return
        except OSError as exc:
            # Telemetry must never take training down: stop writing, let emit count drops.
            self.error = exc

    def _observe(self, batch: list[Event]) -> None:
        """Hand the written events to the observer, off the training thread (it guards its
        own errors: a tracker never stops the event log)."""
        if self._observer is not None:
            for e in batch:
                self._observer(e)

    def _serialise(self, event: Event) -> str:
        try:
            return event.to_json() + "\n"
        except (TypeError, ValueError):  # a payload that is not JSON is dropped, not fatal
            self._dropped += 1
            return ""

    def _take_batch(self) -> tuple[list[Event], bool]:
        item = self._queue.get()
        batch: list[Event] = []
        while True:
            if item is _STOP:
                return batch, True
            batch.append(item)
            if len(batch) >= _BATCH:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False


@dataclass(frozen=True, kw_only=True, slots=True)
class EventFile:
    """One event file found under a run directory."""

    path: Path
    """The file."""
    node: str
    """Node directory it lives in."""
    rank: int | None
    """Writer's rank (-1 for an agent); None for a node stream, which holds many ranks."""


def list_event_files(run_dir: Path) -> list[EventFile]:
    """Every event file of a run: node streams, and rank and agent files of older runs.

    Sorted by node, then a node's stream before its rank files, then rank.
    """
    root = Path(run_dir) / EVENTS_DIR
    out: list[EventFile] = []
    for entry in sorted(os.listdir(root)) if root.is_dir() else []:
        if entry.endswith(NODE_STREAM_SUFFIX) and not entry.startswith("."):
            out.append(EventFile(path=root / entry, node=entry[:-len(NODE_STREAM_SUFFIX)],
                                 rank=None))
            continue
        node = entry
        for name in sorted(os.listdir(root / node)) if (root / node).is_dir() else []:
            m = _RANK_FILE_RE.match(name)
            if m or name == AGENT_FILE:
                rank = int(m.group(1)) if m else -1
                out.append(EventFile(path=root / node / name, node=node, rank=rank))
    return out


def parse_event_line(line: str) -> Event | None:
    """One line as an Event, or None when it is torn or malformed."""
    try:
        event = Event.from_json(line)
    except (ValueError, TypeError):
        return None
    ok = (isinstance(event.kind, str) and isinstance(event.ts, int | float)
          and isinstance(event.step, int) and isinstance(event.generation, int)
          and isinstance(event.data, dict))
    return event if ok else None


def read_event_file(path: Path) -> Iterator[Event]:
    """Events of one file in write order; torn or malformed lines are skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            event = parse_event_line(line)
            if event is not None:
                yield event


def read_events(run_dir: Path, *, ranks: Iterable[int] | None = None) -> Iterator[Event]:
    """Events of a run, file by file (per file in write order); ``ranks`` filters writers.

    Pass ``ranks=[-1]`` for agents only. Use :func:`sorted_events` for one time-ordered list.
    """
    wanted = None if ranks is None else set(ranks)
    for ef in list_event_files(run_dir):
        if wanted is None or ef.rank in wanted:
            yield from read_event_file(ef.path)
        elif ef.rank is None:  # a node stream: its lines name their ranks
            yield from (e for e in read_event_file(ef.path) if e.rank in wanted)


def sorted_events(run_dir: Path, *, ranks: Iterable[int] | None = None) -> list[Event]:
    """All events of a run ordered by (ts, rank)."""
    return sorted(read_events(run_dir, ranks=ranks), key=lambda e: (e.ts, e.rank))


def event_counts(events: Iterable[Event]) -> dict[str, int]:
    """How many events of each kind (a cheap summary for status)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind] = counts.get(e.kind, 0) + 1
    return dict(sorted(counts.items()))


def dumps_data(data: Mapping[str, Any]) -> str:
    """Compact JSON of an event payload (for one-line rendering)."""
    return json.dumps(dict(data), sort_keys=True, separators=(",", ":"), default=str)
