"""Per-node event aggregation: ranks → their node's agent → one stream per node, one run summary.

A rank's :class:`~hpcrun.observe.events.EventWriter` writes into a node-local directory
(:func:`~hpcrun.runtime.incarnation.rank_events_path`, beside the rank heartbeats): an append to
local disk from the writer's background thread, so ``emit`` stays a queue put and training never
waits on the shared filesystem. The node's agent drives a :class:`NodeObserver` from its rank watch
(``node/rankwatch.py``):

- :class:`NodeStream` forwards the complete lines its ranks appended (bytes, not parsed; each
  line names its rank) into ``<run_dir>/events/<node>.jsonl`` with one append per round;
- each heartbeat the node's :class:`~hpcrun.observe.heartbeat.HeartbeatAggregator` publishes
  is also appended to the stream as a heartbeat record, with each rank's last output line
  (:class:`RankTails` keeps the node's rank output files open and reads their ends);
- on node 0, :class:`RunSummaryPublisher` folds every node's stream in a background thread
  and replaces ``<run_dir>/run-summary.json`` every 5 s (or every ten times what one round
  costs, whichever is longer: at most a tenth of a core), and once more, final, after the
  incarnation ended, so ``hpcrun status`` reads O(1) files.

Node-local rank files are per generation (``.../ev/<node>/g0003/``), so a later incarnation on
the same node never forwards an earlier one's lines twice.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.observe.collect import tail_line, tail_lines_of
from hpcrun.observe.events import node_stream_path
from hpcrun.observe.heartbeat import HeartbeatAggregator, NodeHeartbeat
from hpcrun.observe.runsummary import (
    StreamFold,
    heartbeat_record,
    read_run_summary,
    run_summary_path,
)
from hpcrun.runtime.incarnation import RANK_EVENTS_NAME, Incarnation, rank_events_dir
from hpcrun.storage import LOCAL_STORAGE, Storage

FORWARD_INTERVAL_S = 1.0
"""How often an agent forwards its ranks' new event lines to the node stream."""
RECORD_INTERVAL_S = 15.0
"""How often a heartbeat record (with the ranks' last output lines) goes into the node stream;
the node's heartbeat file has the aggregator's beat (every 5 s while a rank is stalled, for the
hang watch's evidence; every 30 s while all progress) for the hang watch and ``watch``."""
SUMMARY_INTERVAL_S = 5.0
"""How often the node-0 agent replaces the run summary while the gang runs."""


class NodeStream:
    """Forwards the complete lines of the node's rank event files into the node's stream."""

    def __init__(self, source_dir: Path, target: Path, *, ranks: Sequence[int]) -> None:
        self.source_dir, self.target = Path(source_dir), Path(target)
        self._ranks = list(ranks)
        self._files: dict[int, BinaryIO] = {}
        self._done: dict[int, int] = {}
        self._out: int | None = None
        self.forwarded = 0
        """Bytes forwarded so far."""
        self.error: OSError | None = None
        """Why the stream stopped (the shared filesystem refused), None while healthy."""

    def forward(self, extra: str = "") -> int:
        """Append every new complete rank line (then ``extra``) in one write; bytes written."""
        chunks = [c for r in self._ranks if (c := self._new_lines(r))]
        if extra:
            chunks.append(extra.encode())
        if not chunks or self.error is not None:
            return 0
        data = b"".join(chunks)
        try:
            if self._out is None:
                self.target.parent.mkdir(parents=True, exist_ok=True)
                self._out = os.open(self.target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            os.write(self._out, data)
        except OSError as exc:
            # Telemetry must never take the node down: stop forwarding, keep supervising.
            self.error = exc
            return 0
        self.forwarded += len(data)
        return len(data)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._out is not None:
            os.close(self._out)
            self._out = None

    def _new_lines(self, rank: int) -> bytes:
        f = self._files.get(rank)
        if f is None:
            try:
                f = open(self.source_dir / RANK_EVENTS_NAME.format(rank=rank), "rb")  # noqa: SIM115
            except OSError:
                return b""  # the rank has written nothing yet
            self._files[rank] = f
        done = self._done.get(rank, 0)
        f.seek(done)
        data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written goes next round, whole
        self._done[rank] = done + end
        return data[:end]


class RankTails:
    """The last output line of each of the node's ranks, from files kept open."""

    def __init__(self, logs_dir: Path, ranks: Iterable[int]) -> None:
        self._logs_dir, self._ranks = Path(logs_dir), list(ranks)
        self._files: dict[int, BinaryIO] = {}

    def read(self) -> dict[int, str]:
        """rank → last non-empty output line (ranks whose output file is missing left out)."""
        out: dict[int, str] = {}
        for rank in self._ranks:
            try:
                f = self._files.get(rank)
                if f is None:
                    f = open(self._logs_dir / f"rank-{rank:05d}.out", "rb")  # noqa: SIM115
                    self._files[rank] = f
                out[rank] = tail_line(tail_lines_of(f, 1))
            except OSError:
                continue
        return out

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class RunSummaryPublisher:
    """Node 0's side: fold every node's stream and keep ``run-summary.json`` current."""

    def __init__(self, run_dir: Path, *, run_id: str, generation: int, nodes: Sequence[str],
                 clock: Clock = SYSTEM_CLOCK, interval_s: float = SUMMARY_INTERVAL_S,
                 storage: Storage = LOCAL_STORAGE) -> None:
        self.run_dir, self.run_id, self.generation = Path(run_dir), run_id, generation
        self._nodes = list(nodes)
        self._clock, self._interval, self._storage = clock, interval_s, storage
        self._fold = StreamFold(self.run_dir)
        self._paths: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: Exception | None = None
        """The last failure to publish (the summary is then older), None while healthy."""

    def start(self) -> None:
        """Seed from the previous summary, then publish every ``interval_s`` in a thread."""
        previous = read_run_summary(self.run_dir)
        if previous is not None:
            self._fold.seed(previous)
        self._paths = {*self._fold.files(),
                       *(node_stream_path(self.run_dir, n) for n in self._nodes)}
        self._thread = threading.Thread(target=self._loop, name="hpcrun-run-summary",
                                        daemon=True)
        self._thread.start()

    def publish(self, *, final: bool = False) -> None:
        """Fold what the streams gained and replace the summary (atomic)."""
        with self._lock:
            try:
                self._fold.refresh(self._paths)
                body = self._fold.snapshot(run_id=self.run_id, generation=self.generation,
                                           now=self._clock.now(), final=final).to_bytes()
                self._storage.write_atomic(run_summary_path(self.run_dir), body)
                self.error = None
            except Exception as exc:  # status falls back to the streams; never fatal here
                self.error = exc

    def finish(self) -> None:
        """Stop the thread and publish the final summary of the incarnation."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.publish(final=True)
        self._fold.close()

    def _loop(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            t0 = self._clock.monotonic()
            self.publish()
            # at most a tenth of a core on node 0, however large the gang
            wait = max(self._interval, 10.0 * (self._clock.monotonic() - t0))


class NodeObserver:
    """What an agent runs for observability: heartbeats, the node stream, (node 0) the summary.

    :meth:`poll` has :class:`~hpcrun.observe.heartbeat.HeartbeatAggregator`'s interface, so
    the rank watch calls it as it did the aggregator.
    """

    def __init__(self, run_dir: Path, *, inc: Incarnation, ranks: Sequence[int],
                 nodes: Sequence[str], supervisor: bool, clock: Clock = SYSTEM_CLOCK,
                 forward_interval_s: float = FORWARD_INTERVAL_S) -> None:
        self._agg = HeartbeatAggregator(run_dir, node=inc.node, hb_dir=inc.heartbeat_dir(),
                                        generation=inc.generation, clock=clock)
        self._stream = NodeStream(rank_events_dir(inc), node_stream_path(run_dir, inc.node),
                                  ranks=ranks)
        self._tails = RankTails(inc.logs_dir(), ranks)
        self._clock, self._interval = clock, forward_interval_s
        self._last: float | None = None
        self._last_record: float | None = None
        self.summary = RunSummaryPublisher(run_dir, run_id=inc.run_id,
                                           generation=inc.generation, nodes=nodes,
                                           clock=clock) if supervisor else None
        if self.summary is not None:
            self.summary.start()

    def poll(self, *, force: bool = False) -> NodeHeartbeat | None:
        """Forward new rank lines (at most every second), publish a due heartbeat, and put
        one into the node stream every :data:`RECORD_INTERVAL_S` (and when forced)."""
        hb = self._agg.poll(force=force)
        mono = self._clock.monotonic()
        record = ""
        if hb is not None and (force or self._last_record is None
                               or mono - self._last_record >= RECORD_INTERVAL_S):
            record = heartbeat_record(hb, self._tails.read())
            self._last_record = mono
        if record or force or self._last is None or mono - self._last >= self._interval:
            self._stream.forward(record)
            self._last = mono
        return hb

    def close(self) -> None:
        """Forward the last lines and heartbeat, once the node's ranks are gone."""
        self.poll(force=True)
        self._stream.close()
        self._tails.close()

    def finish(self) -> None:
        """Node 0, after the incarnation ended: publish the final run summary."""
        if self.summary is not None:
            self.summary.finish()


__all__ = ["NodeObserver", "NodeStream", "RankTails", "RunSummaryPublisher"]
