"""The status head: what a large gang's default status needs of its per-rank data, reduced once.

The default ``hpcrun status`` of a gang over 16 ranks prints a gang line, the nodes' progress
and the ranks worth naming: hung, straggling, failed, and the three furthest behind. Each of
these is decided by a few ranks at an edge of the gang: the oldest beats (a hang is a beat older
than the threshold), the highest straggler scores, the lowest last steps. The node-0 agent finds
that edge when it writes the run summary (:func:`status_head`), so status reads a few
kilobytes, not every rank's row:

1. every node's row: its heartbeat time (an age needs the reader's clock, and a node silent
   past the hang threshold is a hang), its progress (the slowest rank's step) and rank count;
2. the :data:`EDGE` oldest rank beats of the generation and the oldest beat left out, the
   *beat horizon*: when the reader's hang threshold leaves that beat in the clear, it leaves
   every beat left out in the clear, and the listed beats decide every hang;
3. the :data:`EDGE` highest straggler scores and the highest score left out, the *score
   horizon*: a straggler threshold at or above it is decided by the listed scores;
4. the ranks furthest behind, the slowest rank's step and the number of rank lines.

:func:`head_findings` gives what :func:`rank_findings` gives from every rank's data, or None
when the reader's thresholds reach past a horizon: status then reads every rank's row.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hpcrun.errors import ArgumentError, FormatError
from hpcrun.observe.hang import Hang, detect_hangs
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat
from hpcrun.observe.stragglers import (
    Straggler,
    check_straggler_threshold,
    straggler_scores,
    stragglers_of,
)

STATUS_HEAD_SCHEMA_VERSION = 1
EDGE = 64
"""How many of the oldest beats and of the highest straggler scores the head lists."""
SLOWEST_K = 3
"""The ranks furthest behind that a large gang's status names beside the incidents."""

NodeRow = tuple[str, float | None, int, int, int | None]
"""One node: name, heartbeat time (None: no heartbeat), its progress (the slowest rank's step,
the newer of the heartbeat's and the step events'), rank count, and the heartbeat's slowest
rank's step (None: no heartbeat, or one without ranks)."""
Beat = tuple[str, int, int, float, int]
"""A rank beat: node, rank, step, time, pid."""
Score = tuple[int, str, float]
"""A straggler score: rank, node ("" when unknown), score."""
StepTimes = tuple[dict[int, list[float]], dict[int, str]]
"""Per-rank step durations and each rank's node."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankFindings:
    """What the per-rank data says at a time: the gang's incidents and its nodes' progress."""

    hangs: tuple[Hang, ...]
    """Live hangs (none unless the run is active), by node then rank."""
    stragglers: tuple[Straggler, ...]
    """Stragglers of the generation, slowest first."""
    worst_score: float | None
    """The highest straggler score (None: no rank has a full window)."""
    nodes: dict[str, dict[str, Any]]
    """Per node, by name: heartbeat age, the slowest rank's step, rank count."""
    slowest: frozenset[int]
    """The :data:`SLOWEST_K` ranks furthest behind the newest step."""
    reported_step: int
    """The slowest rank's newest step (0: none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRow:
    """What status shows of one rank beside the head: its output line and its last step."""

    rank: int
    """Global rank."""
    tail: tuple[str, str] | None
    """(node, last output line); None when it has none."""
    last: tuple[int, str] | None
    """(newest step, node) in the head's generation; None when it reported none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusHead:
    """The edge of a gang's per-rank data, as the run summary's head keeps it."""

    generation: int
    """The generation whose ranks it describes."""
    nodes: tuple[NodeRow, ...]
    """Every node, by name."""
    live: bool
    """Whether the nodes' heartbeats are of ``generation`` (False: none of its nodes has
    reported yet; the rows show the last known progress, and no hang is looked for)."""
    beats: tuple[Beat, ...]
    """The :data:`EDGE` oldest rank beats of the ``live`` heartbeats, oldest first."""
    beat_horizon: float | None
    """The time of the oldest beat left out of ``beats`` (None: none left out)."""
    scores: tuple[Score, ...]
    """The :data:`EDGE` highest straggler scores, highest first (ties: lowest rank)."""
    score_horizon: float | None
    """The highest score left out of ``scores`` (None: none left out)."""
    slowest: tuple[int, ...]
    """The ranks furthest behind the newest step."""
    reported_step: int
    """The slowest rank's newest step."""
    rank_lines: int
    """How many ranks have an output line."""

    def to_json(self) -> dict[str, Any]:
        return {"head_schema_version": STATUS_HEAD_SCHEMA_VERSION,
                "generation": self.generation, "nodes": self.nodes, "live": self.live,
                "beats": self.beats, "beat_horizon": self.beat_horizon, "scores": self.scores,
                "score_horizon": self.score_horizon, "slowest": self.slowest,
                "reported_step": self.reported_step, "rank_lines": self.rank_lines}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StatusHead:
        """Inverse of :meth:`to_json`; raises FormatError (a ValueError), TypeError or
        KeyError when malformed (the file is untrusted: every field is checked before status
        computes with it)."""
        if raw["head_schema_version"] != STATUS_HEAD_SCHEMA_VERSION:
            raise FormatError(f"a status head of schema {raw['head_schema_version']!r}; this "
                              f"hpcrun reads schema {STATUS_HEAD_SCHEMA_VERSION} (status then "
                              "reads every rank's line)")
        return cls(generation=_int(raw["generation"]),
                   nodes=tuple(_node_row(r) for r in raw["nodes"]),
                   live=_bool(raw["live"]),
                   beats=tuple(_beat(r) for r in raw["beats"]),
                   beat_horizon=_opt_num(raw["beat_horizon"]),
                   scores=tuple(_score(r) for r in raw["scores"]),
                   score_horizon=_opt_num(raw["score_horizon"]),
                   slowest=tuple(_int(r) for r in raw["slowest"]),
                   reported_step=_int(raw["reported_step"]),
                   rank_lines=_count(raw["rank_lines"]))


# -- computed from every rank (the node-0 agent at publish, and status without a head) --------

def current_heartbeats(heartbeats: Mapping[str, NodeHeartbeat],
                       generation: int) -> dict[str, NodeHeartbeat]:
    """Heartbeats of the incarnation in force; a node of an earlier allocation is history.

    Falls back to every node when none has reported under ``generation`` yet (a gang that is
    still starting), so status still shows the last known progress.
    """
    current = {n: hb for n, hb in heartbeats.items() if hb.generation == generation}
    return current or dict(heartbeats)


def node_rows(heartbeats: Mapping[str, NodeHeartbeat],
              last_steps: Mapping[int, tuple[int, str]]) -> list[NodeRow]:
    """Every node's row, by name (pure).

    Heartbeats are rate-limited, so the last steps of a run may never reach one; the step
    events (``last_steps``: rank → (step, node) of the generation in force) fill that in.
    """
    from_events: dict[str, list[int]] = {}
    for step, node in last_steps.values():
        from_events.setdefault(node, []).append(step)
    rows: list[NodeRow] = []
    for n in sorted(set(heartbeats) | set(from_events)):
        hb = heartbeats.get(n)
        hb_step = hb.min_step if hb else None
        steps = [x for x in (hb_step, min(from_events[n]) if n in from_events else None)
                 if x is not None]
        rows.append((n, hb.ts if hb else None, max(steps, default=0),
                     len(hb.ranks) if hb and hb.ranks else len(from_events.get(n, ())),
                     hb_step))
    return rows


def node_progress_of(rows: Sequence[NodeRow], now: float) -> dict[str, dict[str, Any]]:
    """Per node: heartbeat age at ``now`` (None without a heartbeat), step and rank count."""
    return {n: {"age_s": None if ts is None else now - ts, "step": step, "ranks": ranks}
            for n, ts, step, ranks, _ in rows}


def slowest_ranks(last_steps: Mapping[int, tuple[int, str]], k: int = SLOWEST_K) -> set[int]:
    """The ``k`` ranks whose last step is furthest behind the gang's newest (ties: the lowest
    ranks); none when every rank is at the same step."""
    newest = max((st for st, _ in last_steps.values()), default=0)
    behind = sorted((st, r) for r, (st, _) in last_steps.items() if st < newest)
    return {r for _, r in behind[:k]}


def rank_findings(heartbeats: Mapping[str, NodeHeartbeat],
                  last_steps: Mapping[int, tuple[int, str]], step_times: StepTimes, *,
                  generation: int, active: bool, now: float, hang_threshold_s: float,
                  straggler_threshold: float, window: int) -> RankFindings:
    """The findings from every rank's data (pure). Hangs only while ``active``, among the
    heartbeats of ``generation``."""
    live = {n: hb for n, hb in heartbeats.items() if hb.generation == generation}
    hangs = detect_hangs(live, now, threshold_s=hang_threshold_s) if active else []
    times, nodes = step_times
    scores = straggler_scores(times, window=window) if times else {}
    return RankFindings(
        hangs=tuple(hangs),
        stragglers=tuple(stragglers_of(scores, straggler_threshold, nodes=nodes)),
        worst_score=max(scores.values(), default=None),
        nodes=node_progress_of(node_rows(heartbeats, last_steps), now),
        slowest=frozenset(slowest_ranks(last_steps)),
        reported_step=min((st for st, _ in last_steps.values()), default=0))


def status_head(heartbeats: Mapping[str, NodeHeartbeat],
                last_steps: Mapping[int, tuple[int, str]], step_times: StepTimes, *,
                generation: int, rank_lines: int, edge: int = EDGE) -> StatusHead:
    """The head of a gang's per-rank data (pure): ``heartbeats`` as status shows them
    (:func:`current_heartbeats`), the rest of ``generation``, straggler scores over a window
    of one (``step_times`` holds each rank's window median)."""
    live = {n: hb for n, hb in heartbeats.items() if hb.generation == generation}
    if live and len(live) < len(heartbeats):
        raise ArgumentError(f"the status head takes the heartbeats status shows "
                            f"(current_heartbeats): {len(heartbeats) - len(live)} of "
                            f"{len(heartbeats)} are of another generation than {generation}")
    # the edge and the first left out (its horizon) of each
    beats = heapq.nsmallest(edge + 1, ((b.ts, b.rank, n, b.step, b.pid) for n, hb in live.items()
                                       for b in hb.ranks.values()))
    times, rank_nodes = step_times
    scores = heapq.nsmallest(edge + 1, ((-s, r) for r, s in straggler_scores(
        times, window=1).items())) if times else []
    return StatusHead(
        generation=generation, nodes=tuple(node_rows(heartbeats, last_steps)),
        live=bool(live),
        beats=tuple((n, r, st, ts, pid) for ts, r, n, st, pid in beats[:edge]),
        beat_horizon=beats[edge][0] if len(beats) > edge else None,
        scores=tuple((r, rank_nodes.get(r, ""), -s) for s, r in scores[:edge]),
        score_horizon=-scores[edge][0] if len(scores) > edge else None,
        slowest=tuple(sorted(slowest_ranks(last_steps))),
        reported_step=min((st for st, _ in last_steps.values()), default=0),
        rank_lines=rank_lines)


# -- read from the head -----------------------------------------------------------------------

def head_findings(head: StatusHead, *, active: bool, now: float, hang_threshold_s: float,
                  straggler_threshold: float) -> RankFindings | None:
    """What :func:`rank_findings` gives from every rank of ``head.generation`` (straggler
    window one), or None when a threshold reaches past a horizon (pure)."""
    check_straggler_threshold(straggler_threshold)
    if head.score_horizon is not None and head.score_horizon > straggler_threshold:
        return None  # a rank left out may straggle
    if active and head.beat_horizon is not None and now - head.beat_horizon > hang_threshold_s:
        return None  # a beat left out may be a hang
    return RankFindings(
        hangs=tuple(_head_hangs(head, now, hang_threshold_s)) if active else (),
        stragglers=tuple(stragglers_of({r: s for r, _, s in head.scores},
                                       straggler_threshold,
                                       nodes={r: n for r, n, _ in head.scores})),
        # the highest listed score, or the highest left out when none is listed
        worst_score=head.scores[0][2] if head.scores else head.score_horizon,
        nodes=node_progress_of(head.nodes, now), slowest=frozenset(head.slowest),
        reported_step=head.reported_step)


def _head_hangs(head: StatusHead, now: float, threshold_s: float) -> list[Hang]:
    """:func:`detect_hangs` over the nodes that can hold a hang: the silent ones and those
    with a listed beat. A silent node's step is its slowest rank's, which the listed beats
    alone may not hold."""
    if not head.live:
        return []
    ranks: dict[str, dict[int, RankBeat]] = {}
    for n, r, st, ts, pid in head.beats:
        ranks.setdefault(n, {})[r] = RankBeat(rank=r, step=st, ts=ts, step_time_s=None, pid=pid)
    rows = {row[0]: row for row in head.nodes if row[1] is not None and (
        row[0] in ranks or now - row[1] > threshold_s)}
    live = {n: NodeHeartbeat(node=n, ts=ts, generation=head.generation, ranks=ranks.get(n, {}))
            for n, ts, _, _, _ in rows.values() if ts is not None}
    silent = {n: -1 if hb_step is None else hb_step for n, _, _, _, hb_step in rows.values()}
    return [replace(h, step=silent[h.node]) if h.rank < 0 else h
            for h in detect_hangs(live, now, threshold_s=threshold_s)]


# -- checked parsing (exact types: this runs once per node of the gang on every status) ------

_NUM = (int, float)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise FormatError(f"expected an integer, found {v!r}")
    return v


def _count(v: Any) -> int:
    if _int(v) < 0:
        raise FormatError(f"expected a count, found {v!r}")
    return int(v)


def _num(v: Any) -> float:
    if type(v) not in _NUM or not math.isfinite(v):
        raise FormatError(f"expected a finite number, found {v!r}")
    return float(v)


def _opt_num(v: Any) -> float | None:
    return None if v is None else _num(v)


def _str(v: Any) -> str:
    if type(v) is not str:
        raise FormatError(f"expected a string, found {v!r}")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise FormatError(f"expected true or false, found {v!r}")
    return v


def _node_row(r: Any) -> NodeRow:
    n, ts, step, ranks, hb_step = r
    return (_str(n), _opt_num(ts), _int(step), _count(ranks),
            None if hb_step is None else _int(hb_step))


def _beat(r: Any) -> Beat:
    n, rank, step, ts, pid = r
    return (_str(n), _count(rank), _int(step), _num(ts), _count(pid))


def _score(r: Any) -> Score:
    rank, n, score = r
    if _num(score) < 0:
        raise FormatError(f"a straggler score is >= 0, found {score!r}")
    return (_count(rank), _str(n), float(score))
