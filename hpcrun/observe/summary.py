"""An incremental summary of a run's events, so ``hpcrun status`` reads only new bytes.

Status needs gang steps, allocations, charged spans, recent per-rank step times and the last
step events, not the events themselves. :class:`EventSummary` folds events into exactly those
(a pure fold: gang steps merge by min start / max end / max wait / summed tokens, which is
associative, so files can be folded in any order). :func:`cached_summary` keeps the fold in a
cache file together with how many bytes of each event file it covers, and on the next call
parses only what was appended since. The cache lives outside the run directory
(``$XDG_CACHE_HOME/hpcrun/status``, status never writes into a run), is canonical JSON with a
``schema_version``, and is untrusted: if it does not parse, or an event file shrank or was
replaced, the summary is rebuilt from scratch.

Bounded memory: per rank only the newest :data:`KEEP_STEP_TIMES` step durations of each
generation and per file the newest :data:`KEEP_RECENT` step events (by time, then rank: a node
stream interleaves its ranks) are kept (status uses windows of 20 and 200).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrun.observe.ettr import Allocation, GangStep, Interval, span_bucket
from hpcrun.observe.events import list_event_files, parse_event_line, span_bounds
from hpcrun.observe.metrics import (
    MetricRows,
    MetricSeries,
    fold_step_metrics,
    metric_series,
    rows_from_json,
    rows_to_json,
)
from hpcrun.protocols import Event

SUMMARY_SCHEMA_VERSION = 3
KEEP_STEP_TIMES = 256
"""Newest step durations kept per (generation, rank): straggler windows up to this are exact."""
KEEP_RECENT = 200
"""Newest step events kept per file: the input-wait fraction uses the last 200 overall."""


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def _opt(value: Any) -> float | None:
    """A number, or None when the event did not measure it."""
    return None if value is None else _num(value)


@dataclass(kw_only=True, slots=True)
class EventSummary:
    """The reduced form of a run's events that the status view is computed from."""

    steps: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    """(generation, step) → [start, end, input wait max (None: none recorded), tokens]."""
    allocs: dict[int, list[Any]] = field(default_factory=dict)
    """generation → [start, end, size or None, sorted node names]."""
    spans: list[list[Any]] = field(default_factory=list)
    """Charged spans: [generation, start, end, bucket]."""
    step_times: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    """(generation, rank) → newest step durations, in file order."""
    rank_nodes: dict[tuple[int, int], str] = field(default_factory=dict)
    """(generation, rank) → node of its last step event."""
    rank_last: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    """(generation, rank) → [newest step index, node]."""
    recent: dict[str, list[list[float | None]]] = field(default_factory=dict)
    """file → newest step events as [ts, rank, dur_s, input_wait_s (None: not measured)]."""
    last_step_ts: float | None = None
    """Wall time of the newest step event."""
    metrics: MetricRows = field(default_factory=dict)
    """The training metrics the steps reported (:mod:`hpcrun.observe.metrics`)."""
    events: int = 0
    """Events folded."""
    keep_step_times: int = KEEP_STEP_TIMES
    """Newest step durations kept per (generation, rank) (not persisted)."""

    def add(self, e: Event, source: str = "") -> None:
        """Fold one event (from the file named ``source``)."""
        self.events += 1
        b0, b1 = span_bounds(e)
        self._add_alloc(e, b0, b1)
        if e.kind == "step":
            self._add_step(e, b0, b1, source)
        elif (bucket := span_bucket(e)) is not None:
            self.spans.append([e.generation, b0, b1, str(bucket)])

    def _add_alloc(self, e: Event, b0: float, b1: float) -> None:
        a = self.allocs.setdefault(e.generation, [b0, b1, None, []])
        a[0], a[1] = min(a[0], b0), max(a[1], b1)
        if e.node and e.node not in a[3]:
            a[3] = sorted([*a[3], e.node])
        if e.kind == "state" and e.data.get("state") == "STARTING":
            a[0] = min(a[0], e.ts)
            n = e.data.get("nodes")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                a[2] = n

    def _add_step(self, e: Event, b0: float, b1: float, source: str) -> None:
        wait, toks = e.data.get("input_wait_s", 0.0), e.data.get("tokens", 0)
        s = self.steps.setdefault((e.generation, e.step), [b0, b1, None, 0])
        s[0], s[1] = min(s[0], b0), max(s[1], b1)
        s[3] += int(toks) if isinstance(toks, int | float) else 0
        if isinstance(wait, int | float):
            s[2] = float(wait) if s[2] is None else max(s[2], float(wait))
        self.last_step_ts = e.ts if self.last_step_ts is None else max(self.last_step_ts, e.ts)
        dur = e.data.get("dur_s")
        if e.rank >= 0 and isinstance(dur, int | float) and dur >= 0:
            times = self.step_times.setdefault((e.generation, e.rank), [])
            times.append(float(dur))
            del times[:-self.keep_step_times]
            self.rank_nodes[(e.generation, e.rank)] = e.node
        if e.rank >= 0:
            last = self.rank_last.setdefault((e.generation, e.rank), [e.step, e.node])
            if e.step >= last[0]:
                last[:] = [e.step, e.node]
        fold_step_metrics(self.metrics, e)
        tail = self.recent.setdefault(source, [])
        tail.append([e.ts, float(e.rank), _num(e.data.get("dur_s")),
                     _opt(e.data.get("input_wait_s"))])
        if len(tail) >= 2 * KEEP_RECENT:
            tail[:] = newest_rows(tail)

    # -- what status computes from ---------------------------------------------------------

    def gang_steps(self) -> list[GangStep]:
        """As :func:`hpcrun.observe.ettr.gang_steps` of the folded events."""
        return [GangStep(generation=g, step=k, start=v[0], end=v[1],
                         input_wait_s=0.0 if v[2] is None else v[2], tokens=int(v[3]))
                for (g, k), v in sorted(self.steps.items())]

    def allocations(self) -> list[Allocation]:
        """As :func:`hpcrun.observe.ettr.allocations_from_events` of the folded events."""
        return [Allocation(generation=g, start=a[0], end=a[1],
                           nodes=a[2] if a[2] is not None else max(1, len(a[3])))
                for g, a in sorted(self.allocs.items())]

    def span_intervals(self) -> dict[int, list[Interval]]:
        """As :func:`hpcrun.observe.ettr.span_intervals` of the folded events."""
        from hpcrun.observe.ettr import Bucket

        out: dict[int, list[Interval]] = {}
        for g, a, b, bucket in self.spans:
            out.setdefault(g, []).append(Interval(start=a, end=b, bucket=Bucket(bucket)))
        return out

    def rank_step_times(self, generation: int | None) -> tuple[dict[int, list[float]],
                                                               dict[int, str]]:
        """As :func:`hpcrun.observe.stragglers.step_times_from_events` (newest times only)."""
        times: dict[int, list[float]] = {}
        nodes: dict[int, str] = {}
        for (g, r), ts in sorted(self.step_times.items()):
            if generation is None or g == generation:
                times.setdefault(r, []).extend(ts)
                nodes[r] = self.rank_nodes[(g, r)]
        return times, nodes

    def input_wait_fraction(self, window: int = KEEP_RECENT) -> float | None:
        """Input wait / step time over the newest ``window`` step events of all ranks.

        None when none of them measured its input wait (nothing to say, not zero).
        """
        rows = newest_rows((r for tail in self.recent.values() for r in tail), keep=window)
        return wait_fraction([(r[2] or 0.0, r[3]) for r in rows])

    def input_wait_measured(self) -> bool:
        """Whether any step event carried a measured input wait."""
        return any(v[2] is not None for v in self.steps.values())

    def metric_series(self) -> MetricSeries:
        """The training metrics of the folded steps, each step once."""
        return metric_series(self.metrics)

    def last_steps(self, generation: int) -> dict[int, tuple[int, str]]:
        """rank → (newest step index it reported, its node) in ``generation``."""
        return {r: (int(v[0]), str(v[1])) for (g, r), v in sorted(self.rank_last.items())
                if g == generation}

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"steps": [[g, k, *v] for (g, k), v in self.steps.items()],
                "allocs": [[g, *a] for g, a in self.allocs.items()], "spans": self.spans,
                "step_times": [[g, r, self.rank_nodes[(g, r)], t]
                               for (g, r), t in self.step_times.items()],
                "rank_last": [[g, r, *v] for (g, r), v in self.rank_last.items()],
                "recent": self.recent, "last_step_ts": self.last_step_ts,
                "metrics": rows_to_json(self.metrics), "events": self.events}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> EventSummary:
        """Inverse of :meth:`to_json`; raises ValueError/TypeError/KeyError when malformed."""
        out = cls(steps={(int(g), int(k)): [float(a), float(b), None if w is None else float(w),
                                            int(t)] for g, k, a, b, w, t in raw["steps"]},
                  allocs={int(g): [float(a), float(b), n if isinstance(n, int) else None,
                                   [str(x) for x in nodes]] for g, a, b, n, nodes in raw["allocs"]},
                  spans=[[int(g), float(a), float(b), str(k)] for g, a, b, k in raw["spans"]],
                  rank_last={(int(g), int(r)): [int(k), str(n)]
                             for g, r, k, n in raw["rank_last"]},
                  recent={str(f): [[float(a), float(b), float(c), _opt(w)]
                                   for a, b, c, w in rows]
                          for f, rows in raw["recent"].items()},
                  last_step_ts=None if raw["last_step_ts"] is None
                  else float(raw["last_step_ts"]),
                  metrics=rows_from_json(raw.get("metrics", ())), events=int(raw["events"]))
        for g, r, node, times in raw["step_times"]:
            out.step_times[(int(g), int(r))] = [float(t) for t in times]
            out.rank_nodes[(int(g), int(r))] = str(node)
        return out


def newest_rows(rows: Iterable[list[float | None]], *,
                keep: int = KEEP_RECENT) -> list[list[float | None]]:
    """The newest ``keep`` recent-step rows by (time, rank), oldest first.

    Exact for the input-wait window whatever the order rows were folded in: the newest rows
    of a union are among the newest rows of its parts.
    """
    return sorted(rows, key=lambda r: (r[0] or 0.0, r[1] or 0.0))[-keep:] if keep > 0 else []


def wait_fraction(rows: Iterable[tuple[float, float | None]]) -> float | None:
    """Sum of input waits / sum of step times over (dur_s, input_wait_s) rows.

    None when no row measured its wait or the steps took no time.
    """
    rows = list(rows)
    total = sum(d for d, _ in rows)
    if total <= 0 or all(w is None for _, w in rows):
        return None
    return sum(w or 0.0 for _, w in rows) / total


def summarize_events(events: Iterable[Event]) -> EventSummary:
    """Fold events (pure); per-file tails keyed by rank when the source file is unknown."""
    s = EventSummary()
    for e in events:
        s.add(e, source=f"rank-{e.rank}")
    return s


# -- the cache ---------------------------------------------------------------------------------

def cache_path(run_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Where the summary of ``run_dir`` is cached (per user, outside the run directory)."""
    env = os.environ if environ is None else environ
    root = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcrun" / "status"
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:24]
    return root / f"{key}.json"


def _fold_new(summary: EventSummary, path: Path, start: int, name: str) -> int:
    """Fold the complete lines of ``path`` after byte ``start``; the new offset."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a line still being written is read next time, whole
    for line in data[:end].decode("utf-8", "replace").splitlines():
        event = parse_event_line(line)
        if event is not None:
            summary.add(event, source=name)
    return start + end


_HEAD = 256


def _head(path: Path, upto: int) -> int:
    """A checksum of the first bytes of a file (tells a replaced file from an appended one)."""
    with open(path, "rb") as f:
        return zlib.crc32(f.read(min(upto, _HEAD)))


def _same_file(path: Path, st: os.stat_result, seen: list[int]) -> bool:
    dev, ino, done, head = seen
    return [st.st_dev, st.st_ino] == [dev, ino] and st.st_size >= done and \
        _head(path, done) == head


def _load(path: Path, run_dir: Path) -> tuple[EventSummary, dict[str, list[int]]] | None:
    try:
        raw = json.loads(path.read_bytes())
        if raw.get("schema_version") != SUMMARY_SCHEMA_VERSION or \
                raw.get("run_dir") != str(Path(run_dir).resolve()):
            return None
        files = {str(k): [int(x) for x in v] for k, v in raw["files"].items()}
        return EventSummary.from_json(raw["summary"]), files
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _save(path: Path, run_dir: Path, summary: EventSummary, files: dict[str, list[int]]) -> None:
    body = {"schema_version": SUMMARY_SCHEMA_VERSION, "run_dir": str(Path(run_dir).resolve()),
            "files": files, "summary": summary.to_json()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written only costs the next status a full read
        tmp.unlink(missing_ok=True)


def cached_summary(run_dir: Path, *, cache: Path | None = None) -> EventSummary:
    """The summary of every event of ``run_dir``, reading only bytes appended since last time.

    Each event file is identified by (device, inode, checksum of its first bytes) and its
    folded byte count; a file that shrank, was replaced or vanished makes the whole summary
    rebuild (a fold cannot subtract).
    """
    cache = cache or cache_path(run_dir)
    found = {str(ef.path.relative_to(run_dir)): ef.path for ef in list_event_files(run_dir)}
    loaded = _load(cache, run_dir)
    summary, files = loaded if loaded is not None else (EventSummary(), {})
    stats = {name: os.stat(p) for name, p in found.items()}
    if not all(name in stats and _same_file(found[name], stats[name], v)
               for name, v in files.items()):
        summary, files = EventSummary(), {}
    changed = False
    for name, path in sorted(found.items()):
        st = stats[name]
        done = files[name][2] if name in files else 0
        if st.st_size > done:
            end = _fold_new(summary, path, done, name)
            files[name] = [st.st_dev, st.st_ino, end, _head(path, end)]
            changed = True
    if changed or loaded is None:
        _save(cache, run_dir, summary, files)
    return summary
