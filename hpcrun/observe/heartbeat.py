"""Heartbeats: ranks → their node agent (node-local files) → one file per node (shared tier).

A rank writes ``<hb_dir>/rank-00003.json`` in a node-local directory at each step boundary
(rate-limited); these files never touch the parallel filesystem. The node's agent reads them with
a :class:`HeartbeatAggregator` and writes ONE file per node, ``<run_dir>/heartbeat/<node>.json``,
at a bounded rate: per-rank files on Lustre/GPFS would be a metadata storm at scale.

Heartbeat files are untrusted when read back: a malformed one is skipped, never guessed at.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ArgumentError
from hpcrun.storage import LOCAL_STORAGE, Storage

HEARTBEAT_SCHEMA_VERSION = 1
HEARTBEAT_DIR = "heartbeat"
_RANK_RE = re.compile(r"^rank-(\d+)\.json$")


@dataclass(frozen=True, kw_only=True, slots=True)
class RankBeat:
    """The latest progress report of one rank."""

    rank: int
    """Global rank."""
    step: int
    """Last completed global step."""
    ts: float
    """Wall time the step completed (the last progress)."""
    step_time_s: float | None
    """Duration of that step, when known."""
    pid: int
    """Process id of the rank on its node (for stack capture and kill)."""
    seq: int | None = None
    """Collectives the rank has issued on its world group (None: not known); refreshed while
    the rank is blocked, so the ranks that did not arrive at a collective show one lower."""

    def __post_init__(self) -> None:
        if self.rank < 0 or self.pid < 0:
            raise ArgumentError(f"rank and pid must be >= 0, got rank={self.rank} "
                                f"pid={self.pid}")


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeHeartbeat:
    """One node's heartbeat as the agent publishes it."""

    node: str
    """Hostname."""
    ts: float
    """When the agent wrote it (the agent is alive at this time)."""
    ranks: Mapping[int, RankBeat] = field(default_factory=dict)
    """Latest beat of each rank of the node."""
    generation: int = 0
    """Generation of the writing agent."""
    schema_version: int = HEARTBEAT_SCHEMA_VERSION

    @property
    def min_step(self) -> int | None:
        """The slowest rank's step (the node's progress), None before any beat."""
        return min((b.step for b in self.ranks.values()), default=None)

    def to_json(self) -> str:
        body = asdict(self)
        body["ranks"] = [asdict(b) for b in sorted(self.ranks.values(), key=lambda b: b.rank)]
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _rank_beat_from(raw: Any) -> RankBeat | None:
    if not isinstance(raw, dict):
        return None
    try:
        rank, step, ts, pid = raw["rank"], raw["step"], raw["ts"], raw["pid"]
        st, seq = raw.get("step_time_s"), raw.get("seq")
    except KeyError:
        return None
    if not (isinstance(rank, int) and isinstance(step, int) and isinstance(pid, int)
            and isinstance(ts, int | float) and (st is None or isinstance(st, int | float))
            and (seq is None or isinstance(seq, int))):
        return None
    if rank < 0 or pid < 0:
        return None
    return RankBeat(rank=rank, step=step, ts=float(ts), pid=pid, seq=seq,
                    step_time_s=None if st is None else float(st))


def parse_node_heartbeat(raw_bytes: bytes) -> NodeHeartbeat | None:
    """Parse a node heartbeat file; None when it is malformed or of an unknown schema."""
    try:
        raw = json.loads(raw_bytes)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("schema_version") != HEARTBEAT_SCHEMA_VERSION:
        return None
    node, ts, gen, ranks = raw.get("node"), raw.get("ts"), raw.get("generation", 0), raw.get(
        "ranks")
    if not (isinstance(node, str) and isinstance(ts, int | float) and isinstance(gen, int)
            and isinstance(ranks, list)):
        return None
    beats = [b for b in map(_rank_beat_from, ranks) if b is not None]
    return NodeHeartbeat(node=node, ts=float(ts), generation=gen,
                         ranks={b.rank: b for b in beats})


def write_rank_heartbeat(hb_dir: Path, *, rank: int, step: int, ts: float,
                         step_time_s: float | None, pid: int, seq: int | None = None) -> None:
    """Report a rank's progress to its node agent (node-local file, atomic replace).

    No fsync: the file is node-local and only needs to be whole, not durable.
    """
    beat = RankBeat(rank=rank, step=step, ts=ts, step_time_s=step_time_s, pid=pid, seq=seq)
    hb_dir = Path(hb_dir)
    hb_dir.mkdir(parents=True, exist_ok=True)
    target = hb_dir / f"rank-{rank:05d}.json"
    tmp = hb_dir / f".rank-{rank:05d}.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(asdict(beat), separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, target)


class RankHeartbeat:
    """A rank's rate-limited heartbeat: call :meth:`beat` at every step boundary.

    With ``seq`` (the world group's collective sequence number), every beat carries it, and
    :meth:`tick` (from :class:`SeqTicker`'s thread) rewrites the last beat when the number moved
    while no step finished: the rank entered a collective and is blocked in it.
    """

    def __init__(self, hb_dir: Path, *, rank: int, pid: int | None = None,
                 clock: Clock = SYSTEM_CLOCK, min_interval_s: float = 1.0,
                 seq: Callable[[], int | None] | None = None) -> None:
        self._hb_dir, self._rank = Path(hb_dir), rank
        self._pid = os.getpid() if pid is None else pid
        self._clock, self._min_interval = clock, min_interval_s
        self._seq = seq
        self._last: float | None = None
        self._called: float | None = None  # monotonic time of the last beat() call
        self._lock = threading.Lock()
        self._state: tuple[int, float, float | None] | None = None  # step, ts, step time
        self._written_seq: int | None = None
        self.ticks_written = 0
        """Beats :meth:`tick` rewrote (the ticker's file writes)."""

    def beat(self, step: int, step_time_s: float | None = None, *, force: bool = False) -> bool:
        """Write the beat unless one was written less than ``min_interval_s`` ago."""
        mono = self._clock.monotonic()
        with self._lock:
            self._state, self._called = (step, self._clock.now(), step_time_s), mono
            if not force and self._last is not None and mono - self._last < self._min_interval:
                return False
            self._write()
            self._last = mono
        return True

    def tick(self, *, quiet_s: float) -> bool:
        """Rewrite the last beat with the current sequence number when it moved and no beat
        was written for ``quiet_s`` (the main thread is blocked); whether it wrote."""
        if self._seq is None:
            return False
        with self._lock:
            if self._called is None or self._clock.monotonic() - self._called < quiet_s:
                return False
            if self._current_seq() == self._written_seq:
                return False
            self._write()
            self.ticks_written += 1
        return True

    def _current_seq(self) -> int | None:
        try:
            return self._seq() if self._seq is not None else None
        except Exception:
            return None

    def _write(self) -> None:
        assert self._state is not None
        step, ts, step_time_s = self._state
        seq = self._current_seq()
        write_rank_heartbeat(self._hb_dir, rank=self._rank, step=step, ts=ts,
                             step_time_s=step_time_s, pid=self._pid, seq=seq)
        self._written_seq = seq


class SeqTicker:
    """A daemon thread that calls :meth:`RankHeartbeat.tick` every ``interval_s`` (a counter
    read, and a node-local file write only when the number moved while the rank is blocked)."""

    def __init__(self, heartbeat: RankHeartbeat, *, interval_s: float = 1.0) -> None:
        self._hb, self._interval = heartbeat, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcrun-seq-ticker", daemon=True)

    def start(self) -> SeqTicker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._hb.tick(quiet_s=self._interval)
            except OSError:
                continue  # a full or vanished node-local dir: the next tick tries again


def read_rank_beats(hb_dir: Path) -> dict[int, RankBeat]:
    """The latest beat of every rank that reported into ``hb_dir``."""
    out: dict[int, RankBeat] = {}
    names = sorted(os.listdir(hb_dir)) if Path(hb_dir).is_dir() else []
    for name in names:
        if not _RANK_RE.match(name):
            continue
        try:
            raw = json.loads((Path(hb_dir) / name).read_bytes())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        beat = _rank_beat_from(raw)
        if beat is not None:
            out[beat.rank] = beat
    return out


STEADY_PUBLISH_S = 30.0
"""How often a node whose ranks all progress replaces its heartbeat file (the shared-tier
copy of what the node stream already carries): one file per node every 5 s was, at 2,048
nodes, most of a run's steady metadata load (``docs/performance.md``)."""


def stalled(before: Mapping[int, RankBeat], now: Mapping[int, RankBeat]) -> bool:
    """Whether the node's ranks changed, or one made no progress between two collections
    (its beat, step and collective count alike): the hang watch then wants fresh beats."""
    return before.keys() != now.keys() or any(before[r] == b for r, b in now.items())


class HeartbeatAggregator:
    """The agent's side: fold the node's rank beats into one node file at a bounded rate.

    The node's rank beats are collected every ``min_interval_s``; the file is replaced then
    while a rank is stalled (:func:`stalled`: a hang's evidence is other nodes' fresh beats),
    and every ``steady_interval_s`` while every rank progresses.
    """

    def __init__(self, run_dir: Path, *, node: str, hb_dir: Path, generation: int = 0,
                 clock: Clock = SYSTEM_CLOCK, min_interval_s: float = 5.0,
                 steady_interval_s: float = STEADY_PUBLISH_S,
                 storage: Storage = LOCAL_STORAGE) -> None:
        self.path = Path(run_dir) / HEARTBEAT_DIR / f"{node}.json"
        self._node, self._hb_dir, self._generation = node, Path(hb_dir), generation
        self._clock, self._min_interval, self._storage = clock, min_interval_s, storage
        self._steady_interval = steady_interval_s
        self._last: float | None = None  # the last collection
        self._published: float | None = None
        self._beats: Mapping[int, RankBeat] = {}

    def collect(self) -> NodeHeartbeat:
        """The node's heartbeat as of now, without writing it."""
        return NodeHeartbeat(node=self._node, ts=self._clock.now(), generation=self._generation,
                             ranks=read_rank_beats(self._hb_dir))

    def poll(self, *, force: bool = False) -> NodeHeartbeat | None:
        """Collect the node's beats if ``min_interval_s`` has passed (else None) and publish
        them when due."""
        mono = self._clock.monotonic()
        if not force and self._last is not None and mono - self._last < self._min_interval:
            return None
        hb = self.collect()
        due = force or self._published is None or stalled(self._beats, hb.ranks) or \
            mono - self._published >= self._steady_interval
        self._last, self._beats = mono, hb.ranks
        if due:
            self._publish(hb)
            self._published = mono
        return hb

    def _publish(self, hb: NodeHeartbeat) -> None:
        if self._published is None:  # once: a mkdir every beat on every node is metadata load
            self._storage.makedirs(self.path.parent)
        # whole, not durable: a beat lost in a crash is replaced at the next, and three fsyncs
        # fewer per beat on every node is most of a run's steady metadata load
        self._storage.replace_bytes(self.path, hb.to_json().encode())


def read_heartbeats(run_dir: Path) -> dict[str, NodeHeartbeat]:
    """Every node's published heartbeat, by node; malformed files are skipped."""
    root = Path(run_dir) / HEARTBEAT_DIR
    out: dict[str, NodeHeartbeat] = {}
    for name in sorted(os.listdir(root)) if root.is_dir() else []:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            hb = parse_node_heartbeat((root / name).read_bytes())
        except OSError:
            continue
        if hb is not None:
            out[hb.node] = hb
    return out
