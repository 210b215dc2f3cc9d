"""Global order: draw t → source and position → permutation → sample ID → packer → batch k.

Everything here is global and pure: batch ``k`` is the ``k``-th group of ``global_batch`` packed
rows of one logical stream, whatever the number of replicas or loader workers. Data-parallel
replica ``r`` of ``R`` takes the fixed contiguous rows ``[r·G/R, (r+1)·G/R)``; ranks that cooperate
on one sample (tensor/pipeline peers) use the same replica index and so receive the same rows.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcrun.data.dataset import SourceView
from hpcrun.data.mixture import MixState, Mixture
from hpcrun.data.packing import PackingPolicy, PackState, pack
from hpcrun.data.permutation import Permutation
from hpcrun.errors import ArgumentError, DataError

__all__ = ["DOC_DTYPE", "LEDGER_DTYPE", "BatchPlan", "DocStream", "GlobalOrder", "OrderState",
           "replica_for_rank", "replica_rows"]

DOC_DTYPE = np.dtype([("draw", np.int64), ("source", np.int64), ("epoch", np.int64),
                      ("record", np.int64), ("sample_id", np.int64), ("length", np.int64)])
"""One logical draw: which record of which source, in which source epoch, and its length."""

LEDGER_DTYPE = np.dtype([("row", np.int64), ("sample_id", np.int64), ("source", np.int64),
                         ("epoch", np.int64), ("offset", np.int64), ("length", np.int64)])
"""One segment of a global batch: ``length`` tokens of ``sample_id`` from token ``offset``."""

_MEMO = 64
_CHUNK = 8
"""Global batches packed at once: one packer call cuts ``C·G`` rows, the same rows as ``C``
calls of ``G`` (the concatenated stream is one), and spreads the packer's fixed cost."""
_BLOCK = 512
"""Draws resolved at once by :meth:`DocStream.docs` and kept for the next calls: the packer
asks for overlapping runs of a few dozen draws per batch, and each call has a fixed cost of
a few dozen numpy calls (mixture, permutation, fields)."""
_TABLE_MAX = 1 << 15
"""Sources up to this many records keep each epoch's permutation as a table (at most 256 KiB,
built with the permutation itself, so the values are the same): a lookup is one gather
instead of two Feistel passes of a few dozen numpy calls."""


def replica_rows(global_batch: int, replica: int, num_replicas: int) -> range:
    """Rows of a global batch that data-parallel replica ``replica`` of ``num_replicas`` takes.

    Raises:
        DataError: ``global_batch`` is not divisible by ``num_replicas`` or ``replica`` is out
            of range.
    """
    if num_replicas < 1 or global_batch % num_replicas:
        raise DataError(f"global batch {global_batch} must be divisible by the number of "
                        f"replicas {num_replicas}; change one of them")
    if not 0 <= replica < num_replicas:
        raise DataError(f"replica {replica} is outside [0, {num_replicas})")
    per = global_batch // num_replicas
    return range(replica * per, (replica + 1) * per)


def replica_for_rank(rank: int, *, model_parallel_size: int = 1) -> int:
    """Data-parallel replica of a global rank when consecutive ranks form one model replica."""
    if model_parallel_size < 1 or rank < 0:
        raise ArgumentError(f"need rank >= 0 and model_parallel_size >= 1, found rank {rank}, "
                            f"model_parallel_size {model_parallel_size}")
    return rank // model_parallel_size


class DocStream:
    """Logical draw ``t`` → :data:`DOC_DTYPE`, pure in ``t`` (the mixture memoizes).

    Args:
        sources: Sizes, sample-ID bases and token lengths of the sources.
        mixture: Assigns draws to sources.
        seed: Seed of every source permutation.
        salt: Domain separation of the permutations (the dataset ID).
    """

    def __init__(self, sources: Sequence[SourceView], mixture: Mixture, *, seed: int,
                 salt: str) -> None:
        if mixture.num_sources != len(sources):
            raise DataError(f"mixture has {mixture.num_sources} weights but the dataset has "
                            f"{len(sources)} sources ({[s.name for s in sources]}); give one "
                            "weight per source")
        self.sources, self.mixture, self.seed, self.salt = tuple(sources), mixture, seed, salt
        self._perms: collections.OrderedDict[tuple[int, int],
                                             Callable[[np.ndarray], np.ndarray]] = \
            collections.OrderedDict()
        self._block: tuple[int, np.ndarray, bool] = (0, np.zeros(0, dtype=DOC_DTYPE), False)

    def docs(self, start: int, count: int) -> np.ndarray:
        """The documents of draws ``[start, start+count)`` (fewer when the stream ends)."""
        first, block, ends = self._block
        lo = start - first
        if lo >= 0 and (lo + count <= block.size or ends):
            return block[lo:lo + count].copy()
        if count > _BLOCK:  # a long run (a restore's check): not kept
            return self._resolve(start, count)
        want = _BLOCK
        try:
            block = self._resolve(start, want)
        except DataError:  # a 'fail' source runs out ahead: fail only where the caller asks
            block, want = self._resolve(start, count), count
        self._block = (start, block, block.size < want)  # short: the stream ends there
        return block[:count].copy()

    def _resolve(self, start: int, count: int) -> np.ndarray:
        src, pos = self.mixture.draws(start, count)
        out = np.zeros(src.size, dtype=DOC_DTYPE)
        out["draw"] = np.arange(start, start + src.size)
        out["source"] = src
        for i, view in enumerate(self.sources):
            mask = src == i
            if mask.any():
                self._fill(out, mask, pos[mask], i, view)
        return out

    def _fill(self, out: np.ndarray, mask: np.ndarray, pos: np.ndarray, i: int,
              view: SourceView) -> None:
        epoch, within = np.divmod(pos, view.size)
        record = np.empty_like(within)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            record[sel] = self._perm(i, int(e))(within[sel])
        out["epoch"][mask] = epoch
        out["record"][mask] = record
        out["sample_id"][mask] = view.base + record
        out["length"][mask] = view.lengths[record]

    def _perm(self, source: int, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        """Positions → records of ``source`` in ``epoch`` (a table for small sources)."""
        key = (source, epoch)
        perm = self._perms.get(key)
        if perm is None:
            view = self.sources[source]
            full = Permutation(view.size, seed=self.seed, epoch=epoch,
                               salt=f"{self.salt}/{view.name}")
            perm = (full.take(np.arange(view.size, dtype=np.int64)).take
                    if view.size <= _TABLE_MAX else full.take)
            self._perms[key] = perm
            if len(self._perms) > 4 * len(self.sources):
                self._perms.popitem(last=False)
        return perm


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderState:
    """Where the global order stands before global batch ``batch``."""

    batch: int
    """Index of the next global batch."""
    pack: PackState
    """Packer residual at the start of that batch."""
    mix: MixState
    """Mixture state after ``pack.draw`` draws (realized counts, active set, segment)."""

    def __post_init__(self) -> None:
        if self.batch < 0 or self.mix.draw != self.pack.draw:
            raise DataError(f"order state is inconsistent: batch {self.batch}, packer at draw "
                            f"{self.pack.draw}, mixture at draw {self.mix.draw}")

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "pack": self.pack.to_dict(), "mixture": self.mix.to_dict()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OrderState:
        try:
            batch = raw["batch"]
            if not isinstance(batch, int) or isinstance(batch, bool):
                raise DataError(f"data cursor position is malformed: batch must be an int, "
                                f"found {batch!r}; the checkpoint's cursor was edited or damaged")
            return cls(batch=batch, pack=PackState.from_dict(raw["pack"]),
                       mix=MixState.from_dict(raw["mixture"]))
        except (KeyError, TypeError) as exc:
            raise DataError(f"data cursor position is malformed ({exc}): {dict(raw)!r}") from exc


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The layout of global batch ``batch``: its segments and the documents they come from."""

    batch: int
    segments: np.ndarray
    docs: np.ndarray

    def ledger(self) -> np.ndarray:
        """Segments as :data:`LEDGER_DTYPE` (global sample IDs in global row order)."""
        d = self.docs[self.segments["doc"]]
        out = np.zeros(self.segments.size, dtype=LEDGER_DTYPE)
        out["row"], out["offset"] = self.segments["row"], self.segments["offset"]
        out["length"] = self.segments["length"]
        for name in ("sample_id", "source", "epoch"):
            out[name] = d[name]
        return out


class GlobalOrder:
    """Global batch ``k`` → its :class:`BatchPlan`; memoizes states for sequential access.

    Args:
        stream: The document stream.
        global_batch: Rows per global batch (G).
        seq_len: Tokens per row.
        policy: Packing policy.
    """

    def __init__(self, stream: DocStream, *, global_batch: int, seq_len: int,
                 policy: PackingPolicy | str = PackingPolicy.CONCAT) -> None:
        if global_batch < 1 or seq_len < 1:
            raise ArgumentError(f"global_batch and seq_len must be >= 1, found global_batch "
                                f"{global_batch}, seq_len {seq_len}")
        self.stream, self.global_batch, self.seq_len = stream, global_batch, seq_len
        self.policy = PackingPolicy(policy)
        self._memo: collections.OrderedDict[int, OrderState] = collections.OrderedDict()
        self._memo[0] = OrderState(batch=0, pack=PackState(draw=0, offset=0),
                                   mix=stream.mixture.state_at(0))
        # Packer positions and plans of batches packed ahead in a chunk; the mixture state of
        # a position is computed only when a full state is asked for (a cursor).
        self._packs: collections.OrderedDict[int, PackState] = collections.OrderedDict()
        self._plans: collections.OrderedDict[int, BatchPlan] = collections.OrderedDict()

    def plan(self, k: int) -> BatchPlan | None:
        """Layout of global batch ``k``, or ``None`` when the stream ends before it."""
        cached = self._plans.get(k)
        if cached is not None:
            return cached
        start = self._pack_at(k)
        if start is None:
            return None
        plans = self._plan_chunk(k, start)
        return plans[0] if plans else None

    def state_at(self, k: int) -> OrderState | None:
        """State before global batch ``k`` (``None`` when the stream ends before it)."""
        if k < 0:
            raise ArgumentError(f"global batch index must be >= 0, found {k}")
        state = self._memo.get(k)
        if state is not None:
            return state
        pos = self._pack_at(k)
        if pos is None:
            return None
        state = OrderState(batch=k, pack=pos, mix=self.stream.mixture.state_at(pos.draw))
        self._remember(state)
        return state

    def _known(self, k: int) -> PackState | None:
        state = self._memo.get(k)
        return state.pack if state is not None else self._packs.get(k)

    def _pack_at(self, k: int) -> PackState | None:
        """Packer position before batch ``k``, packing forward from the nearest known one."""
        found = self._known(k)
        if found is not None:
            return found
        b = max(b for b in itertools.chain(self._memo, self._packs) if b <= k)
        while b < k:
            start = self._known(b)
            assert start is not None
            plans = self._plan_chunk(b, start)
            if not plans:
                return None
            b = min(k, b + len(plans))
        return self._known(k)

    def _plan_chunk(self, k: int, start: PackState) -> list[BatchPlan]:
        """Plans of batches ``k, k+1, ...`` packed in one call from ``start`` (one batch when
        the stream ends, or a ``fail`` source runs out, within a chunk); empty at the end."""
        for count in (_CHUNK, 1):
            try:
                out = pack(self.stream.docs, start, count * self.global_batch, self.seq_len,
                           self.policy)
            except DataError:
                if count == 1:
                    raise
                continue
            if out is not None:
                break
        else:
            return []
        cuts = _cut_chunk(*out, start, count=count, global_batch=self.global_batch,
                          policy=self.policy)
        plans = []
        for j, (segments, docs, after) in enumerate(cuts):
            plans.append(BatchPlan(batch=k + j, segments=segments, docs=docs))
            _put(self._plans, k + j, plans[-1], limit=2 * _CHUNK)
            if k + j + 1 not in self._memo:
                _put(self._packs, k + j + 1, after, limit=_MEMO)
        return plans

    def mismatch(self, state: OrderState) -> str | None:
        """Why ``state`` is not this order's state before batch ``state.batch``, or ``None``.

        Checked without planning a batch: the mixture state is recomputed at the packer's draw,
        and the packer's position must be where batch ``k`` starts (token ``k·G·L`` of the
        concatenated stream, or draw ``k·G`` with packing ``none``), as the packer leaves it
        (the offset inside its document, a document boundary right after a non-empty one).
        """
        draw, offset, k = state.pack.draw, state.pack.offset, state.batch
        mix = self.stream.mixture.state_at(draw)
        if mix != state.mix:
            return (f"the mixture state after draw {draw} is {mix.to_dict()}, the cursor has "
                    f"{state.mix.to_dict()}")
        lengths = self.stream.docs(0, draw + 1)["length"]
        if lengths.size < draw or (offset and lengths.size == draw):
            return (f"the stream ends at draw {lengths.size}, before the cursor's draw {draw} "
                    f"(offset {offset})")
        if self.policy is PackingPolicy.NONE:
            if (draw, offset) != (k * self.global_batch, 0):
                return f"batch {k} starts at draw {k * self.global_batch}, offset 0"
            return None
        token, start = int(lengths[:draw].sum()) + offset, k * self.global_batch * self.seq_len
        inside = offset < lengths[draw] if offset else draw == 0 or lengths[draw - 1] > 0
        if token != start or offset < 0 or not inside:
            return (f"batch {k} starts at token {start} of the packed stream, the cursor's "
                    f"draw {draw} and offset {offset} are at token {token}")
        return None

    def remember(self, state: OrderState) -> None:
        """Seed the memo with a restored state (mixture state included)."""
        self.stream.mixture.remember(state.mix)
        self._remember(state)

    def _remember(self, state: OrderState) -> None:
        self._packs.pop(state.batch, None)
        self._memo[state.batch] = state
        self._memo.move_to_end(state.batch)
        while len(self._memo) > _MEMO:
            oldest = next(k for k in self._memo if k != 0)
            del self._memo[oldest]


def _put(cache: collections.OrderedDict[int, Any], key: int, value: Any, *, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


def _cut_chunk(segments: np.ndarray, docs: np.ndarray, last: PackState, start: PackState, *,
               count: int, global_batch: int,
               policy: PackingPolicy) -> list[tuple[np.ndarray, np.ndarray, PackState]]:
    """Split the segments of ``count`` batches packed at once into each batch's segments,
    documents (from the batch's first draw, as the packer of one batch returns them) and the
    packer position after it (``last`` after the final one)."""
    bounds = np.searchsorted(segments["row"], np.arange(count + 1) * global_batch).tolist()
    lengths = docs["length"]
    out, first = [], 0  # ``first``: the batch's first draw, relative to ``start.draw``
    for j in range(count):
        seg = segments[bounds[j]:bounds[j + 1]].copy()
        tail = int(seg["doc"][-1])
        if j == count - 1:
            after = last
        elif policy is PackingPolicy.NONE:
            after = PackState(draw=start.draw + (j + 1) * global_batch, offset=0)
        else:
            end = int(seg["offset"][-1] + seg["length"][-1])
            after = (PackState(draw=start.draw + tail + 1, offset=0) if end >= int(lengths[tail])
                     else PackState(draw=start.draw + tail, offset=end))
        seg["row"] -= j * global_batch
        seg["doc"] -= first
        out.append((seg, docs[first:tail + 1], after))
        first = after.draw - start.draw
    return out
