"""Stragglers: per-rank step-time distributions and scores (pure).

A synchronous gang runs at the pace of its slowest rank, and a cluster average hides that rank.
The straggler score of a rank is its median step time over the window divided by the gang's
median of those medians; a rank whose score stays above the threshold over a full window is a
straggler. Nodes that straggle repeatedly are quarantine candidates.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hpcrun.errors import ArgumentError
from hpcrun.protocols import Event


@dataclass(frozen=True, kw_only=True, slots=True)
class Straggler:
    """A rank that stayed slow over a window."""

    rank: int
    """Global rank."""
    node: str
    """Its node ("" when unknown)."""
    score: float
    """Rank median / gang median over the window (1.0 = typical)."""

    def __post_init__(self) -> None:
        if self.score < 0:
            raise ArgumentError(f"straggler score must be >= 0, got {self.score}")


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of non-empty ``values`` (q in [0, 1])."""
    if not values:
        raise ArgumentError(f"quantile {q} of an empty sequence; expected at least one value")
    ordered = sorted(values)
    idx = math.ceil(round(q * len(ordered), 9)) - 1  # round: 0.95 × 20 must be 19, not 19.0000001
    return ordered[max(0, min(len(ordered) - 1, idx))]


def straggler_scores(step_times_by_rank: Mapping[int, Sequence[float]], *,
                     window: int) -> dict[int, float]:
    """Each rank's score over its last ``window`` steps (ranks with fewer steps are omitted)."""
    if window < 1:
        raise ArgumentError(f"straggler window must be >= 1 step, got {window}")
    # a window of one is its own median (the run summary keeps each rank's window median)
    medians = {r: ts[-1] if window == 1 else statistics.median(ts[-window:])
               for r, ts in step_times_by_rank.items() if len(ts) >= window}
    if not medians:
        return {}
    gang = statistics.median(medians.values())
    if gang <= 0:
        return {r: 1.0 for r in medians}
    return {r: m / gang for r, m in sorted(medians.items())}


def check_straggler_threshold(threshold: float) -> None:
    """Refuse a threshold that would name typical ranks (a score is a ratio to the median)."""
    if threshold <= 1.0:
        raise ArgumentError(f"straggler threshold must be > 1.0 (a ratio to the gang "
                            f"median), got {threshold}")


def find_stragglers(step_times_by_rank: Mapping[int, Sequence[float]], threshold: float,
                    window: int, *, nodes: Mapping[int, str] | None = None) -> list[Straggler]:
    """Ranks whose score over the last ``window`` steps exceeds ``threshold``, slowest first."""
    check_straggler_threshold(threshold)
    return stragglers_of(straggler_scores(step_times_by_rank, window=window), threshold,
                         nodes=nodes)


def stragglers_of(scores: Mapping[int, float], threshold: float, *,
                  nodes: Mapping[int, str] | None = None) -> list[Straggler]:
    """The ranks of ``scores`` above ``threshold``, slowest first (ties: lowest rank)."""
    check_straggler_threshold(threshold)
    nodes = nodes or {}
    found = [Straggler(rank=r, node=nodes.get(r, ""), score=s) for r, s in scores.items()
             if s > threshold]
    return sorted(found, key=lambda s: (-s.score, s.rank))


def quarantine_candidates(history: Iterable[Straggler], *, min_count: int) -> list[str]:
    """Nodes named in at least ``min_count`` straggler findings, most frequent first."""
    counts = Counter(s.node for s in history if s.node)
    return [n for n, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            if c >= min_count]


def step_times_from_events(events: Iterable[Event], *,
                           generation: int | None = None) -> tuple[dict[int, list[float]],
                                                                   dict[int, str]]:
    """Per-rank step durations (in event order) and each rank's node, from ``step`` events.

    ``generation`` restricts to one incarnation (a restart changes nodes and pace).
    """
    times: dict[int, list[float]] = {}
    nodes: dict[int, str] = {}
    for e in events:
        if e.kind != "step" or e.rank < 0:
            continue
        if generation is not None and e.generation != generation:
            continue
        dur = e.data.get("dur_s")
        if isinstance(dur, int | float) and dur >= 0:
            times.setdefault(e.rank, []).append(float(dur))
            nodes[e.rank] = e.node
    return times, nodes
