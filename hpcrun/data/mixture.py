"""Mixtures: which source each logical draw ``t`` comes from, as a pure function of ``t``.

Two modes:

- ``categorical``: draw ``t`` picks source ``i`` with probability ``w_i``, independently, from a
  counter-based hash of ``(seed, t)``: proportions hold in expectation only.
- ``exact``: Tijdeman's earliest-deadline rule (the chairman assignment). With ``k`` sources,
  source ``i`` is *eligible* at draw ``t`` (1-based) when its deficit ``w_i·t − c_i ≥ σ`` with
  ``σ = 1/(2k−2)``; among eligible sources the one whose deficit would reach ``1 − σ`` first
  (smallest ``(c_i + 1 − σ) / w_i``) is drawn. Every prefix then satisfies
  ``|c_i − w_i·t| ≤ 1 − σ < 1``. The simpler "furthest below target" rule exceeds 1.

Exhaustion (per source, needs the source sizes): ``repeat`` continues into the source's next
epoch; ``stop`` ends the stream at the first draw that would take a record the source no longer
has; ``fail`` raises :class:`~hpcrun.errors.DataError` there instead; ``renormalize`` drops the
source when its last record is drawn and starts a new *segment*: the weights of the remaining
sources are renormalized and counted from that draw on, so the exact bound holds per segment.

The state after any number of draws is a :class:`MixState` (draw index, realized counts, active
set, segment start); it is what the data cursor stores.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np

from hpcrun.errors import ArgumentError, DataError

__all__ = ["MIXTURE_VERSION", "Exhaustion", "MixMode", "MixState", "MixUnit", "Mixture"]

MIXTURE_VERSION = 1
"""Version of the draw rules; part of the categorical hash key and of the data cursor."""

_BLOCK = 8192
"""Draws computed per vectorized categorical pass."""

_MEMO = 64
"""States remembered for random access (most recent first to be evicted last)."""


class MixMode(StrEnum):
    """How draws are assigned to sources."""

    CATEGORICAL = "categorical"
    EXACT = "exact"


class Exhaustion(StrEnum):
    """What happens when a source runs out of records."""

    STOP = "stop"
    REPEAT = "repeat"
    RENORMALIZE = "renormalize"
    FAIL = "fail"


class MixUnit(StrEnum):
    """What the weights are proportions of."""

    SAMPLES = "samples"
    TOKENS = "tokens"


@dataclass(frozen=True, kw_only=True, slots=True)
class MixState:
    """Where a mixture stands after ``draw`` draws."""

    draw: int
    """Draws made so far (the next draw has this index)."""
    counts: tuple[int, ...]
    """Records taken from each source so far (its next position)."""
    active: tuple[bool, ...]
    """Sources still drawn from (a ``renormalize`` source leaves when exhausted)."""
    segment_draw: int
    """Draw index at which the current (renormalized) weights took effect."""
    segment_counts: tuple[int, ...]
    """``counts`` at ``segment_draw``; the exact bound is measured from there."""
    ended: bool = False
    """The stream is over (a ``stop`` source ran out, or no source is active)."""

    def __post_init__(self) -> None:
        k = len(self.counts)
        if not (len(self.active) == len(self.segment_counts) == k and k > 0):
            raise DataError(f"mixture state has inconsistent source counts: {self}")
        if min(self.counts) < 0 or sum(self.counts) != self.draw:
            raise DataError(f"mixture state counts {self.counts} do not sum to draw {self.draw}")
        if (sum(self.segment_counts) != self.segment_draw or self.segment_draw > self.draw
                or any(s > c for s, c in zip(self.segment_counts, self.counts, strict=True))):
            raise DataError(f"mixture state segment {self.segment_draw}/{self.segment_counts} "
                            f"is inconsistent with draw {self.draw}/{self.counts}")

    @classmethod
    def initial(cls, k: int) -> MixState:
        """The state before any draw, with ``k`` sources."""
        zeros = (0,) * k
        return cls(draw=0, counts=zeros, active=(True,) * k, segment_draw=0,
                   segment_counts=zeros)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for the cursor)."""
        return {"draw": self.draw, "counts": list(self.counts), "active": list(self.active),
                "segment_draw": self.segment_draw,
                "segment_counts": list(self.segment_counts), "ended": self.ended}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> MixState:
        """Parse and validate an untrusted dict written by :meth:`to_dict`."""
        try:
            return cls(draw=_int(raw["draw"]), counts=tuple(_int(c) for c in raw["counts"]),
                       active=tuple(bool(a) for a in raw["active"]),
                       segment_draw=_int(raw["segment_draw"]),
                       segment_counts=tuple(_int(c) for c in raw["segment_counts"]),
                       ended=bool(raw["ended"]))
        except (KeyError, TypeError) as exc:
            raise DataError(f"mixture state is malformed ({exc!r}): expected the fields of "
                            f"MixState.to_dict(), found {dict(raw)!r}") from exc


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(f"mixture state is malformed: expected an int, found {value!r}; the "
                        "checkpoint's cursor was edited or damaged")
    return value


@dataclass(frozen=True, slots=True)
class _Draws:
    """Output of one advance: source and source position of each draw made."""

    sources: np.ndarray
    positions: np.ndarray


class Mixture:
    """Assigns logical draws to sources; pure in ``t`` (memoized for sequential access).

    Args:
        weights: Target proportion of each source (positive; normalized here).
        mode: ``categorical`` or ``exact``.
        seed: Seed of the categorical draws (unused by ``exact``, still recorded).
        sizes: Records per source; required unless every source's exhaustion is ``repeat``.
        exhaustion: One policy for all sources or one per source.
        unit: ``samples`` (weights are shares of draws) or ``tokens`` (shares of tokens: each
            source's draw weight is ``w_i / mean_tokens_i``, so token shares match on average).
        mean_tokens: Mean record length per source in tokens; required for ``unit=tokens``.
    """

    def __init__(self, weights: Sequence[float], *, mode: MixMode | str, seed: int,
                 sizes: Sequence[int] | None = None,
                 exhaustion: Exhaustion | str | Sequence[Exhaustion | str] = Exhaustion.REPEAT,
                 unit: MixUnit | str = MixUnit.SAMPLES,
                 mean_tokens: Sequence[float] | None = None) -> None:
        self.mode, self.unit, self.seed = MixMode(mode), MixUnit(unit), seed
        self.weights = _normalize(weights)
        k = len(self.weights)
        self.exhaustion = _policies(exhaustion, k)
        self.sizes = _sizes(sizes, self.exhaustion, k)
        self.draw_weights = _draw_weights(self.weights, self.unit, mean_tokens)
        self._key = _categorical_key(seed)
        self._memo: collections.OrderedDict[int, MixState] = collections.OrderedDict()
        self._remember(MixState.initial(k))

    @property
    def num_sources(self) -> int:
        return len(self.weights)

    def describe(self) -> dict[str, Any]:
        """The configuration, JSON-serialisable (stored in the cursor, compared on restore)."""
        return {"weights": list(self.weights), "mode": str(self.mode), "unit": str(self.unit),
                "seed": self.seed, "exhaustion": [str(e) for e in self.exhaustion],
                "sizes": list(self.sizes) if self.sizes else None, "version": MIXTURE_VERSION}

    def sources(self, start: int, count: int) -> np.ndarray:
        """Source index of draws ``start .. start+count-1`` (shorter if the stream ends)."""
        return self.draws(start, count)[0]

    def draws(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Source index and that source's position for each draw in ``[start, start+count)``.

        The position is the number of records taken from the source before this draw; the
        source's permutation maps it to a record (``position // size`` is the source epoch).
        Fewer than ``count`` are returned when the stream ends (``stop``).

        Raises:
            DataError: a ``fail`` source ran out.
        """
        if start < 0 or count < 0:
            raise ArgumentError(f"start and count must be >= 0, found start {start}, "
                                f"count {count}")
        state = self.state_at(start)
        out, state = self._advance(state, count)
        self._remember(state)
        return out.sources, out.positions

    def state_at(self, draw: int) -> MixState:
        """The :class:`MixState` after ``draw`` draws (or at the stream's end if earlier)."""
        state = self._memo.get(draw)
        if state is None:
            state = self._memo[max((d for d in self._memo if d <= draw), default=0)]
        if state.draw < draw and not state.ended:
            _, state = self._advance(state, draw - state.draw)
            self._remember(state)
        return state

    def counts_at(self, draw: int) -> np.ndarray:
        """Per-source running counts after ``draw`` draws."""
        return np.asarray(self.state_at(draw).counts, dtype=np.int64)

    def remember(self, state: MixState) -> None:
        """Seed the memo with a state read from a cursor (after checking it fits)."""
        if len(state.counts) != self.num_sources:
            raise DataError(f"cursor mixture has {len(state.counts)} sources, this mixture has "
                            f"{self.num_sources}; resume with the same mixture")
        self._remember(state)

    def _remember(self, state: MixState) -> None:
        self._memo[state.draw] = state
        self._memo.move_to_end(state.draw)
        while len(self._memo) > _MEMO:
            oldest = next(iter(self._memo))
            if oldest == 0:  # the origin is always kept
                self._memo.move_to_end(0)
                oldest = next(iter(self._memo))
            del self._memo[oldest]

    def _advance(self, state: MixState, count: int) -> tuple[_Draws, MixState]:
        srcs: list[np.ndarray] = []
        poss: list[np.ndarray] = []
        target = state.draw + count
        while state.draw < target and not state.ended:
            step = self._step_exact if self.mode is MixMode.EXACT else self._step_categorical
            part, state = step(state, target - state.draw)
            srcs.append(part.sources)
            poss.append(part.positions)
        empty = np.empty(0, dtype=np.int64)
        return _Draws(np.concatenate(srcs) if srcs else empty,
                      np.concatenate(poss) if poss else empty), state

    def _segment_weights(self, state: MixState) -> np.ndarray:
        w = np.where(state.active, self.draw_weights, 0.0)
        return w / w.sum()

    def _step_exact(self, state: MixState, count: int) -> tuple[_Draws, MixState]:
        """Tijdeman draws until ``count`` are made or the segment changes."""
        w = self._segment_weights(state).tolist()
        counts = list(state.counts)
        rel = [c - s for c, s in zip(counts, state.segment_counts, strict=True)]
        live = [i for i, a in enumerate(state.active) if a]
        if len(live) == 1:
            return self._step_single(state, live[0], count)
        sigma = 1.0 / (2 * len(live) - 2) if len(live) > 1 else 0.0
        srcs: list[int] = []
        poss: list[int] = []
        for _ in range(count):
            t = state.draw + len(srcs) - state.segment_draw + 1
            i = _tijdeman_pick(live, w, rel, t, sigma)
            event = self._exhaustion_event(i, counts[i])
            if event is not None:
                return self._finish(state, counts, srcs, poss, event, i)
            srcs.append(i)
            poss.append(counts[i])
            counts[i] += 1
            rel[i] += 1
            if self._drops(i, counts[i]):
                return self._finish(state, counts, srcs, poss, "drop", i)
        return self._finish(state, counts, srcs, poss, None, -1)

    def _step_single(self, state: MixState, i: int, count: int) -> tuple[_Draws, MixState]:
        """One live source: every draw is its next record (the loop's result, vectorized).

        The events fall where the per-draw loop finds them: ``stop``/``fail`` before the draw
        that would pass the end, ``drop`` right after the draw that reaches it.
        """
        counts = list(state.counts)
        n, event = count, None
        if self.sizes:
            left, policy = self.sizes[i] - counts[i], self.exhaustion[i]
            if policy in (Exhaustion.STOP, Exhaustion.FAIL) and left < count:
                n, event = max(left, 0), str(policy)
            elif policy is Exhaustion.RENORMALIZE and 1 <= left <= count:
                n, event = left, "drop"
        poss = np.arange(counts[i], counts[i] + n, dtype=np.int64)
        counts[i] += n
        return self._finish(state, counts, np.full(n, i, dtype=np.int64), poss, event, i)

    def _step_categorical(self, state: MixState, count: int) -> tuple[_Draws, MixState]:
        """Vectorized independent draws, cut at the first exhaustion event."""
        n = min(count, _BLOCK)
        t = np.arange(state.draw, state.draw + n, dtype=np.uint64)
        cdf = np.cumsum(self._segment_weights(state))
        src = np.minimum(np.searchsorted(cdf, _uniform(self._key, t), side="right"),
                         len(cdf) - 1)
        src = _skip_inactive(src, state.active)
        pos = _running_positions(src, state.counts)
        cut, event, who = self._first_event(src, pos)
        src, pos = src[:cut], pos[:cut]
        counts = list(state.counts)
        for i, c in zip(*np.unique(src, return_counts=True), strict=True):
            counts[int(i)] += int(c)
        return self._finish(state, counts, src.tolist(), pos.tolist(), event, who)

    def _first_event(self, src: np.ndarray, pos: np.ndarray) -> tuple[int, str | None, int]:
        """Index to cut the block at, the event there (``drop``, ``stop``, ``fail``) and source."""
        best: tuple[int, str | None, int] = (src.size, None, -1)
        if not self.sizes:
            return best
        for i, policy in enumerate(self.exhaustion):
            size = self.sizes[i]
            if policy is Exhaustion.RENORMALIZE:
                hit = np.flatnonzero((src == i) & (pos == size - 1))
                cand = (int(hit[0]) + 1, "drop", i) if hit.size else best
            elif policy is not Exhaustion.REPEAT:
                hit = np.flatnonzero((src == i) & (pos >= size))
                cand = (int(hit[0]), str(policy), i) if hit.size else best
            else:
                continue
            best = min(best, cand, key=lambda c: c[0])
        return best

    def _exhaustion_event(self, i: int, count: int) -> str | None:
        if self.sizes and count >= self.sizes[i]:
            policy = self.exhaustion[i]
            if policy in (Exhaustion.STOP, Exhaustion.FAIL):
                return str(policy)
        return None

    def _drops(self, i: int, count: int) -> bool:
        return bool(self.sizes) and self.exhaustion[i] is Exhaustion.RENORMALIZE \
            and count >= self.sizes[i]

    def _finish(self, state: MixState, counts: list[int], srcs: Sequence[int] | np.ndarray,
                poss: Sequence[int] | np.ndarray, event: str | None,
                who: int) -> tuple[_Draws, MixState]:
        """Build the next state from the draws made and the event that ended them, if any."""
        draw = state.draw + len(srcs)
        new = replace(state, draw=draw, counts=tuple(counts))
        if event == "fail":
            raise DataError(f"source {who} ran out of records at draw {draw} (its {counts[who]} "
                            "records are used up) and its exhaustion policy is 'fail'; choose "
                            "'repeat', 'renormalize' or 'stop', or give it more data")
        if event == "stop":
            new = replace(new, ended=True)
        elif event == "drop":
            active = tuple(a and j != who for j, a in enumerate(state.active))
            new = replace(new, active=active, segment_draw=draw, segment_counts=tuple(counts),
                          ended=not any(active))
        out = _Draws(np.asarray(srcs, dtype=np.int64), np.asarray(poss, dtype=np.int64))
        return out, new


def _tijdeman_pick(live: list[int], w: list[float], rel: list[int], t: int,
                   sigma: float) -> int:
    """Earliest deadline among eligible sources (deficit ``w_i·t − c_i ≥ σ``)."""
    if len(live) == 1:
        return live[0]
    best, best_deadline = -1, math.inf
    for i in live:
        if w[i] * t - rel[i] >= sigma - 1e-9:
            deadline = (rel[i] + 1 - sigma) / w[i]
            if deadline < best_deadline:
                best, best_deadline = i, deadline
    if best < 0:  # unreachable by Tijdeman's theorem; keep a total rule for float edge cases
        best = max(live, key=lambda j: w[j] * t - rel[j])
    return best


def _uniform(key: np.uint64, t: np.ndarray) -> np.ndarray:
    """Counter-based uniforms in [0, 1) from splitmix64(key ^ t)."""
    z = np.bitwise_xor(t, key)
    z += np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _skip_inactive(src: np.ndarray, active: tuple[bool, ...]) -> np.ndarray:
    """Zero-weight sources can still be hit at CDF plateaus' edges; move them to the next one."""
    if all(active):
        return src.astype(np.int64)
    live = np.flatnonzero(active)
    nxt = live[np.minimum(np.searchsorted(live, src), live.size - 1)]
    return nxt.astype(np.int64)


def _running_positions(src: np.ndarray, counts: tuple[int, ...]) -> np.ndarray:
    """For each draw, how many records its source had given before it."""
    pos = np.empty(src.size, dtype=np.int64)
    for i, base in enumerate(counts):
        mask = src == i
        pos[mask] = base + np.arange(int(mask.sum()), dtype=np.int64)
    return pos


def _categorical_key(seed: int) -> np.uint64:
    material = json.dumps(["hpcrun.mixture", MIXTURE_VERSION, seed]).encode()
    return np.frombuffer(hashlib.blake2b(material, digest_size=8).digest(), dtype="<u8")[0]


def _normalize(weights: Sequence[float]) -> tuple[float, ...]:
    w = [float(x) for x in weights]
    if not w or any(not math.isfinite(x) or x <= 0 for x in w):
        raise ArgumentError(f"mixture weights must be finite and > 0, found "
                            f"{list(weights)!r}; drop a source rather than give it weight 0")
    total = math.fsum(w)
    return tuple(x / total for x in w)


def _policies(exhaustion: Exhaustion | str | Sequence[Exhaustion | str],
              k: int) -> tuple[Exhaustion, ...]:
    if isinstance(exhaustion, str):
        return (Exhaustion(exhaustion),) * k
    out = tuple(Exhaustion(e) for e in exhaustion)
    if len(out) != k:
        raise ArgumentError(f"expected {k} exhaustion policies (one per source), found "
                            f"{len(out)}; pass one policy for all sources or one per source")
    return out


def _sizes(sizes: Sequence[int] | None, policies: tuple[Exhaustion, ...],
           k: int) -> tuple[int, ...]:
    if sizes is None:
        if any(p is not Exhaustion.REPEAT for p in policies):
            raise ArgumentError("mixture sizes are required unless every exhaustion policy is "
                                "'repeat'; pass sizes=[records of each source]")
        return ()
    out = tuple(int(s) for s in sizes)
    if len(out) != k or min(out) < 1:
        raise ArgumentError(f"expected {k} source sizes >= 1 (one per weight), found "
                            f"{list(sizes)!r}")
    return out


def _draw_weights(weights: tuple[float, ...], unit: MixUnit,
                  mean_tokens: Sequence[float] | None) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if unit is MixUnit.SAMPLES:
        return w
    if mean_tokens is None or len(mean_tokens) != w.size or min(mean_tokens) <= 0:
        raise ArgumentError("unit='tokens' needs mean_tokens > 0 for every source, found "
                            f"{mean_tokens!r}; pass each source's mean tokens per record, or "
                            "use unit='samples'")
    per_draw = w / np.asarray(mean_tokens, dtype=np.float64)
    return per_draw / per_draw.sum()
