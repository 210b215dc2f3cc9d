"""The run summary: ONE small file that ``hpcrun status`` reads, whatever the gang size.

Each node's agent writes one event stream on the shared filesystem (``events/<node>.jsonl``:
its ranks' event lines, forwarded verbatim, and its own heartbeat records). The node-0 agent
folds every stream incrementally (:class:`StreamFold`) and keeps ``<run_dir>/run-summary.json``
current by atomic replace (:mod:`hpcrun.runtime.node.observations`). The file holds exactly the
reduced inputs status computes its view from, so status reads O(1) files and shows the numbers it
would compute from every event:

- the event fold of :mod:`hpcrun.observe.summary` (gang steps, allocations, input-wait rows)
  with the charged spans merged per (generation, bucket) (:func:`compact_spans`: the ETTR
  sweep sees the same coverage, so it cuts the same segments), each rank's median step time
  over the straggler window (status scores stragglers from those medians with a window of 1),
  and each rank's last step, both for the generation in force;
- each node's latest heartbeat (hang detection and node progress) and each rank's last output
  line (the agent reads its own ranks' output files).

The file's first line is its head: the gang-level fold and the
:class:`~hpcrun.observe.statushead.StatusHead` (every node's row and the ranks at the edge of
the gang: oldest beats, highest straggler scores, furthest behind), computed as the file is
written. The default status of a large gang reads the head and bisects the one-line-per-rank
section for the few ranks it names (:class:`SummaryHead`); ``--json`` and ``--ranks all`` parse
every line (:meth:`RunSummary.from_bytes`).

A heartbeat record is one stream line ``{"record":"heartbeat",...}``: it is not an event, and
event readers skip it. Readers treat the summary and the records as untrusted: a malformed file
is ignored (status then folds the streams itself), a malformed record skipped.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from hpcrun.errors import HpcrunError
from hpcrun.observe.events import list_event_files, parse_event_line
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat
from hpcrun.observe.statushead import RankRow, StatusHead, current_heartbeats, status_head
from hpcrun.observe.summary import EventSummary, newest_rows

RUN_SUMMARY_FILE = "run-summary.json"
RUN_SUMMARY_SCHEMA_VERSION = 2
HEARTBEAT_RECORD_SCHEMA_VERSION = 1
STATUS_WINDOW = 20
"""The straggler window status uses; the summary keeps each rank's median over it."""
TAIL_CHARS = 200
"""A rank's last output line is cut to this many characters (as status shows it)."""
_HB_PREFIX = '{"record":"heartbeat"'
_ALL = "all"


# -- heartbeat records -------------------------------------------------------------------------

def _record_body(hb: NodeHeartbeat, tails: Mapping[int, str]) -> dict[str, Any]:
    return {"record": "heartbeat", "hb_schema_version": HEARTBEAT_RECORD_SCHEMA_VERSION,
            "node": hb.node, "ts": hb.ts, "generation": hb.generation,
            "ranks": [[b.rank, b.step, b.ts, b.step_time_s, b.pid]
                      for b in sorted(hb.ranks.values(), key=lambda b: b.rank)],
            "tails": [[r, line[:TAIL_CHARS]] for r, line in sorted(tails.items())]}


def heartbeat_record(hb: NodeHeartbeat, tails: Mapping[int, str]) -> str:
    """One stream line carrying a node's heartbeat and its ranks' last output lines."""
    return json.dumps(_record_body(hb, tails), separators=(",", ":")) + "\n"


def is_heartbeat_record(line: str) -> bool:
    """Whether a stream line is a heartbeat record (cheap: no parse)."""
    return line.startswith(_HB_PREFIX)


_NUM = (int, float)


def _beat(row: Any) -> RankBeat | None:
    # exact type checks: this runs once per rank of the gang on every status
    if type(row) is not list or len(row) != 5:
        return None
    rank, step, ts, st, pid = row
    if not (type(rank) is int and type(step) is int and type(pid) is int
            and type(ts) in _NUM and (st is None or type(st) in _NUM)
            and rank >= 0 and pid >= 0):
        return None
    return RankBeat(rank=rank, step=step, ts=float(ts), pid=pid,
                    step_time_s=None if st is None else float(st))


def parse_heartbeat_record(line: str) -> tuple[NodeHeartbeat, dict[int, str]] | None:
    """A heartbeat record as (node heartbeat, rank → last output line); None when malformed."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    return _heartbeat_from(raw)


def _heartbeat_from(raw: Any) -> tuple[NodeHeartbeat, dict[int, str]] | None:
    if not isinstance(raw, dict) or raw.get("hb_schema_version") != \
            HEARTBEAT_RECORD_SCHEMA_VERSION:
        return None
    node, ts, gen = raw.get("node"), raw.get("ts"), raw.get("generation")
    ranks, tails = raw.get("ranks"), raw.get("tails")
    if not (isinstance(node, str) and isinstance(ts, int | float) and isinstance(gen, int)
            and isinstance(ranks, list) and isinstance(tails, list)):
        return None
    beats = [b for b in map(_beat, ranks) if b is not None]
    lines = {r: text for r, text in (t for t in tails if isinstance(t, list) and len(t) == 2)
             if isinstance(r, int) and isinstance(text, str)}
    return (NodeHeartbeat(node=node, ts=float(ts), generation=gen,
                          ranks={b.rank: b for b in beats}), lines)


# -- the reduced fold --------------------------------------------------------------------------

def compact_spans(spans: Iterable[Sequence[Any]]) -> list[list[Any]]:
    """Charged spans merged where they overlap or touch, per (generation, bucket).

    The ETTR sweep charges an instant to the highest-priority bucket covering it, so only each
    bucket's covered set matters; merging keeps that set (and its endpoints) exactly. A gang's
    ranks' per-step spans overlap, so this turns ranks x steps spans into about one per step.
    """
    by_key: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for g, a, b, bucket in spans:
        by_key.setdefault((int(g), str(bucket)), []).append((float(a), float(b)))
    out: list[list[Any]] = []
    for (g, bucket), ivs in sorted(by_key.items()):
        ivs.sort()
        cur_a, cur_b = ivs[0]
        for a, b in ivs[1:]:
            if a <= cur_b:
                cur_b = max(cur_b, b)
            else:
                out.append([g, cur_a, cur_b, bucket])
                cur_a, cur_b = a, b
        out.append([g, cur_a, cur_b, bucket])
    return out


def reduce_for_status(s: EventSummary, *, generation: int,
                      window: int = STATUS_WINDOW) -> EventSummary:
    """The part of a fold status needs, small whatever the gang size (pure).

    Per-rank data is kept for ``generation`` only: each rank's median step time over its last
    ``window`` steps (ranks with fewer are left out, as the straggler score leaves them out) as
    a one-element list, and its last step.
    """
    medians = {k: [statistics.median(t[-window:])] for k, t in s.step_times.items()
               if k[0] == generation and len(t) >= window}
    return EventSummary(
        steps={k: list(v) for k, v in s.steps.items()},
        allocs={g: [a[0], a[1], a[2], list(a[3])] for g, a in s.allocs.items()},
        spans=compact_spans(s.spans) if s.spans else [],
        step_times=medians, rank_nodes={k: s.rank_nodes[k] for k in medians},
        rank_last={k: list(v) for k, v in s.rank_last.items() if k[0] == generation},
        recent={_ALL: newest_rows(r for tail in s.recent.values() for r in tail)},
        last_step_ts=s.last_step_ts, metrics=s.metrics, events=s.events)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    """What ``run-summary.json`` holds: everything status needs, in one small file.

    The file is three parts, one JSON document a line (:meth:`to_bytes`): the head (the
    gang-level fold and the :class:`~hpcrun.observe.statushead.StatusHead`, what the default
    status reads: :class:`SummaryHead`), the nodes' heartbeats and the folded streams, then
    one line per rank in rank order (its output line, last step and window median), which
    only ``--json``, ``--ranks all`` and the named ranks' lookup read.
    """

    run_id: str
    """Run id."""
    generation: int
    """Generation of the incarnation whose node-0 agent wrote it."""
    ts: float
    """When it was written."""
    final: bool
    """Written after the incarnation ended: it covers every event of the run so far."""
    events: EventSummary
    """The reduced event fold (:func:`reduce_for_status`)."""
    window: int = STATUS_WINDOW
    """The straggler window the per-rank medians were taken over."""
    heartbeats: Mapping[str, NodeHeartbeat] = field(default_factory=dict)
    """Each node's latest heartbeat record."""
    tails: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    """rank → (node, last output line)."""
    streams: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Event file (relative to the run directory) → (inode, bytes folded)."""

    def status_head(self) -> StatusHead:
        """The head of its per-rank data for the generation that wrote it."""
        g = self.generation
        return status_head(current_heartbeats(self.heartbeats, g), self.events.last_steps(g),
                           self.events.rank_step_times(g), generation=g,
                           rank_lines=len(self.tails))

    def to_bytes(self) -> bytes:
        g, e = self.generation, self.events
        # the generation's per-rank parts go to the rank lines; another's (none from a
        # fold: reduce_for_status keeps one) stay in the head
        gang = replace(e, step_times={k: v for k, v in e.step_times.items() if k[0] != g},
                       rank_nodes={k: v for k, v in e.rank_nodes.items() if k[0] != g},
                       rank_last={k: v for k, v in e.rank_last.items() if k[0] != g})
        head = {"schema_version": RUN_SUMMARY_SCHEMA_VERSION, "run_id": self.run_id,
                "generation": g, "ts": self.ts, "final": self.final, "window": self.window,
                "events": gang.to_json(), "status": self.status_head().to_json()}
        nodes = {"heartbeats": [_record_body(hb, {}) for _, hb in sorted(self.heartbeats.items())],
                 "streams": {k: list(v) for k, v in sorted(self.streams.items())}}
        return b"".join(_line(x) for x in (head, nodes, *self._rank_lines()))

    def _rank_lines(self) -> list[list[Any]]:
        g, e = self.generation, self.events
        ranks = sorted({*self.tails, *(r for k, r in e.rank_last if k == g),
                        *(r for k, r in e.step_times if k == g)})
        return [[r, list(self.tails[r]) if r in self.tails else None,
                 e.rank_last.get((g, r)),
                 [e.rank_nodes[(g, r)], *e.step_times[(g, r)]] if (g, r) in e.step_times
                 else None] for r in ranks]

    @classmethod
    def from_bytes(cls, raw_bytes: bytes) -> RunSummary | None:
        """Parse a summary, every rank's line included; None when it is malformed or of
        another schema (untrusted). A summary of schema 1 (one document) still reads."""
        try:
            parts = raw_bytes.split(b"\n", 2)
            head = json.loads(parts[0])
            if head.get("schema_version") == 1:
                return cls._from_head(head, head["heartbeats"], head["streams"], head["tails"])
            if head.get("schema_version") != RUN_SUMMARY_SCHEMA_VERSION or len(parts) < 3:
                return None
            nodes = json.loads(parts[1])
            rows = json.loads(b"[" + parts[2].rstrip(b"\n").replace(b"\n", b",") + b"]")
            out = cls._from_head(head, nodes["heartbeats"], nodes["streams"], ())
            return _with_rank_lines(out, rows)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            return None

    @classmethod
    def _from_head(cls, raw: Mapping[str, Any], heartbeats: Any, streams: Any,
                   tails: Any) -> RunSummary:
        beats = [_heartbeat_from(h) for h in heartbeats]
        return cls(run_id=str(raw["run_id"]), generation=int(raw["generation"]),
                   ts=float(raw["ts"]), final=bool(raw["final"]), window=int(raw["window"]),
                   events=EventSummary.from_json(raw["events"]),
                   heartbeats={b[0].node: b[0] for b in beats if b is not None},
                   tails={int(r): (str(n), str(line)) for r, n, line in tails},
                   streams={str(k): (int(v[0]), int(v[1])) for k, v in streams.items()})

    def covers(self, state: str, *, active_states: Iterable[str]) -> bool:
        """Whether status may show this summary for a run in ``state``.

        While the run is active a summary a few seconds old is the live view; once it is not,
        only a summary written after its incarnation ended covers every event.
        """
        return covers(self.final, state, active_states)


def covers(final: bool, state: str, active_states: Iterable[str]) -> bool:
    """Whether a summary (``final`` or not) may be shown for a run in ``state``."""
    return final or state in set(active_states)


_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every line (``json.dumps`` with separators builds one per call, and a
summary has a line per rank); ensure_ascii, its default, escapes every newline in a value."""


def _line(body: Any) -> bytes:
    return _ENCODER.encode(body).encode() + b"\n"


def _with_rank_lines(summary: RunSummary, rows: Sequence[Any]) -> RunSummary:
    """The summary with its rank lines folded back in (they are of its generation)."""
    g, e = summary.generation, summary.events
    rows = [(int(r), tail, last, times) for r, tail, last, times in rows]
    e.rank_last.update({(g, r): [int(last[0]), str(last[1])]
                        for r, _, last, _ in rows if last is not None})
    e.step_times.update({(g, r): [float(t) for t in times[1:]]
                         for r, _, _, times in rows if times is not None})
    e.rank_nodes.update({(g, r): str(times[0]) for r, _, _, times in rows if times is not None})
    tails = {r: (str(tail[0]), str(tail[1])) for r, tail, _, _ in rows if tail is not None}
    return replace(summary, tails={**summary.tails, **tails})


@dataclass(frozen=True, kw_only=True, slots=True)
class SummaryHead:
    """The head of a run summary: what the default status of a large gang reads.

    Holds the gang-level fold and the status head, parsed, and the rank lines unparsed:
    :meth:`rank_rows` finds a rank's line by bisection, parsing a dozen lines.
    """

    run_id: str
    """Run id."""
    generation: int
    """Generation of the incarnation whose node-0 agent wrote it."""
    ts: float
    """When it was written."""
    final: bool
    """Written after the incarnation ended."""
    window: int
    """The straggler window of the per-rank medians."""
    events: EventSummary
    """The gang-level fold (no per-rank part of ``generation``)."""
    status: StatusHead
    """The head of the per-rank data."""
    data: bytes
    """The whole file."""
    ranks_at: int
    """Where the rank lines start in ``data``."""

    @classmethod
    def from_bytes(cls, data: bytes) -> SummaryHead | None:
        """The head of a summary; None when it is malformed or has none (schema 1)."""
        try:
            end = data.index(b"\n")
            raw = json.loads(data[:end])
            if raw.get("schema_version") != RUN_SUMMARY_SCHEMA_VERSION:
                return None
            return cls(run_id=str(raw["run_id"]), generation=int(raw["generation"]),
                       ts=float(raw["ts"]), final=bool(raw["final"]), window=int(raw["window"]),
                       events=EventSummary.from_json(raw["events"]),
                       status=StatusHead.from_json(raw["status"]), data=data,
                       ranks_at=data.index(b"\n", end + 1) + 1)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            return None

    def covers(self, state: str, *, active_states: Iterable[str]) -> bool:
        """As :meth:`RunSummary.covers`."""
        return covers(self.final, state, active_states)

    def rank_rows(self, ranks: Iterable[int]) -> list[RankRow]:
        """The rows of ``ranks`` that have a line, in the order asked."""
        return [row for r in ranks if (row := self._find(r)) is not None]

    def _find(self, rank: int) -> RankRow | None:
        data, lo, hi = self.data, self.ranks_at, len(self.data)
        while lo < hi:  # lo and hi are line starts; each probe parses one line
            mid = (lo + hi) // 2
            start = data.rfind(b"\n", lo, mid) + 1 or lo
            end = data.find(b"\n", mid, hi)
            end = hi if end < 0 else end
            row = _rank_row(data[start:end])
            if row is None:
                return None  # a malformed line: the rank shows no line
            if row.rank == rank:
                return row
            lo, hi = (lo, start) if rank < row.rank else (end + 1, hi)
        return None


def _rank_row(line: bytes) -> RankRow | None:
    """One rank line, checked (untrusted); None when malformed."""
    try:
        r, tail, last, _ = json.loads(line)
        if type(r) is not int or not (tail is None or (
                type(tail[0]) is str and type(tail[1]) is str)) or not (
                last is None or (type(last[0]) is int and type(last[1]) is str)):
            return None
        return RankRow(rank=r, tail=None if tail is None else (tail[0], tail[1]),
                       last=None if last is None else (last[0], last[1]))
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def read_summary_bytes(run_dir: Path) -> bytes | None:
    """The run summary's bytes; None when there is none."""
    try:
        return run_summary_path(run_dir).read_bytes()
    except OSError:
        return None


def run_summary_path(run_dir: Path) -> Path:
    """Where a run's summary lives."""
    return Path(run_dir) / RUN_SUMMARY_FILE


def read_run_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary, every rank's line parsed; None when there is none or it does not
    parse."""
    data = read_summary_bytes(run_dir)
    return None if data is None else RunSummary.from_bytes(data)


# -- the incremental fold over node streams ----------------------------------------------------

class StreamFold:
    """Folds a run's event files incrementally: events, latest heartbeats, rank tails.

    Keeps each file open (no metadata operation per refresh on a parallel filesystem) and
    reads only complete lines appended since the last refresh. A file that shrank or was
    replaced makes the whole fold start again from every file.
    """

    def __init__(self, run_dir: Path, *, window: int = STATUS_WINDOW) -> None:
        self.run_dir = Path(run_dir)
        self.window = window
        self._open: dict[str, BinaryIO] = {}
        self._reset()

    def _reset(self) -> None:
        self.close()
        self.summary = EventSummary(keep_step_times=self.window)
        self.heartbeats: dict[str, NodeHeartbeat] = {}
        self.tails: dict[int, tuple[str, str]] = {}
        self._tail_ts: dict[int, float] = {}
        self.streams: dict[str, tuple[int, int]] = {}

    def seed(self, previous: RunSummary) -> None:
        """Start from an earlier summary: its gang-level fold and the bytes it covers.

        Per-rank step times and last steps are of the earlier generation, which the new one
        does not report; they start empty.
        """
        e = previous.events
        self.summary = EventSummary(
            steps={k: list(v) for k, v in e.steps.items()},
            allocs={g: [a[0], a[1], a[2], list(a[3])] for g, a in e.allocs.items()},
            spans=[list(x) for x in e.spans],
            recent={k: list(v) for k, v in e.recent.items()}, last_step_ts=e.last_step_ts,
            metrics={k: [v[0], v[1], dict(v[2]), list(v[3])] for k, v in e.metrics.items()},
            events=e.events, keep_step_times=self.window)
        self.heartbeats = dict(previous.heartbeats)
        self.tails = dict(previous.tails)
        self.streams = dict(previous.streams)

    def files(self) -> list[Path]:
        """Every event file of the run now (one directory listing)."""
        return [ef.path for ef in list_event_files(self.run_dir)]

    def refresh(self, paths: Iterable[Path]) -> int:
        """Fold what was appended to ``paths`` (missing ones are skipped); bytes folded."""
        paths = sorted(set(paths))
        try:
            return sum(self._fold_file(p) for p in paths)
        except _Restart:
            self._reset()
            return sum(self._fold_file(p) for p in sorted(set(paths) | set(self.files())))

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def snapshot(self, *, run_id: str, generation: int, now: float,
                 final: bool) -> RunSummary:
        """The summary of everything folded so far."""
        s = self.summary
        if s.spans:
            s.spans = compact_spans(s.spans)
        # the newest input-wait rows of the union are among the newest of each part: keep
        # only those (exact), not a tail per stream
        s.recent = {"all": newest_rows(r for tail in s.recent.values() for r in tail)}
        return RunSummary(run_id=run_id, generation=generation, ts=now, final=final,
                          window=self.window,
                          events=reduce_for_status(self.summary, generation=generation,
                                                   window=self.window),
                          heartbeats=dict(self.heartbeats), tails=dict(self.tails),
                          streams=dict(self.streams))

    def _fold_file(self, path: Path) -> int:
        name = str(path.relative_to(self.run_dir))
        f = self._open.get(name)
        if f is None:
            try:
                f = open(path, "rb")  # noqa: SIM115 - kept open across refreshes
            except FileNotFoundError:
                return 0
            self._open[name] = f
        st = os.fstat(f.fileno())
        ino, done = self.streams.get(name, (st.st_ino, 0))
        if ino != st.st_ino or st.st_size < done:
            raise _Restart
        if st.st_size == done:
            return 0
        f.seek(done)
        data = f.read(st.st_size - done)
        end = data.rfind(b"\n") + 1  # a line still being written is read next time, whole
        for line in data[:end].decode("utf-8", "replace").splitlines():
            self._fold_line(line, name)
        self.streams[name] = (st.st_ino, done + end)
        return end

    def _fold_line(self, line: str, source: str) -> None:
        if is_heartbeat_record(line):
            parsed = parse_heartbeat_record(line)
            if parsed is not None:
                self._take_heartbeat(*parsed)
            return
        event = parse_event_line(line)
        if event is not None:
            self.summary.add(event, source=source)

    def _take_heartbeat(self, hb: NodeHeartbeat, tails: Mapping[int, str]) -> None:
        old = self.heartbeats.get(hb.node)
        if old is None or hb.ts >= old.ts:
            self.heartbeats[hb.node] = hb
        for rank, line in tails.items():
            if hb.ts >= self._tail_ts.get(rank, float("-inf")):
                self.tails[rank] = (hb.node, line)
                self._tail_ts[rank] = hb.ts


class _Restart(HpcrunError):
    """An event file shrank or was replaced: the fold cannot subtract, it starts again."""
