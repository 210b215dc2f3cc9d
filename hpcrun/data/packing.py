"""The global packer: documents (in draw order) → fixed-length sequences, as pure values.

``concat`` concatenates the document stream and splits it every ``seq_len`` tokens; a document
that crosses a boundary continues at the start of the next sequence. Each sequence is described
by *segments* ``(row, doc, offset, length)``: ``length`` tokens of the ``doc``-th fetched
document starting at token ``offset``, so document boundaries are known to the model (attention
masks, position IDs). ``none`` gives each document its own row, truncated to ``seq_len``.

The only state between sequences is :class:`PackState`: the draw of the *residual document*
(the one the next sequence starts in) and how many of its tokens are already packed. The
partially filled sequence is always empty at a sequence boundary, so this is the whole residual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from hpcrun.errors import ArgumentError, DataError

__all__ = ["SEGMENT_DTYPE", "PackState", "PackingPolicy", "pack"]

SEGMENT_DTYPE = np.dtype([("row", np.int64), ("doc", np.int64), ("offset", np.int64),
                          ("length", np.int64)])
"""One piece of one document inside one packed row."""

Fetch = Callable[[int, int], np.ndarray]
"""``fetch(start_draw, count)`` → a struct array with at least a ``length`` field, one entry
per draw; shorter when the stream ends."""


class PackingPolicy(StrEnum):
    """How documents become fixed-length rows."""

    CONCAT = "concat"
    NONE = "none"


@dataclass(frozen=True, kw_only=True, slots=True)
class PackState:
    """The packer's residual at a sequence boundary."""

    draw: int
    """Draw index of the residual document (the next sequence starts in it)."""
    offset: int
    """Tokens of that document already packed into earlier sequences."""

    def __post_init__(self) -> None:
        if not (isinstance(self.draw, int) and isinstance(self.offset, int)
                and self.draw >= 0 and self.offset >= 0):
            raise DataError(f"packer state must be two ints >= 0, found draw={self.draw!r} "
                            f"offset={self.offset!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"draw": self.draw, "offset": self.offset}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PackState:
        try:
            return cls(draw=raw["draw"], offset=raw["offset"])
        except (KeyError, TypeError) as exc:
            raise DataError(f"packer state is malformed, expected draw and offset, found "
                            f"{raw!r}") from exc


def pack(fetch: Fetch, state: PackState, rows: int, seq_len: int,
         policy: PackingPolicy = PackingPolicy.CONCAT
         ) -> tuple[np.ndarray, np.ndarray, PackState] | None:
    """Fill ``rows`` sequences of ``seq_len`` tokens starting at ``state``.

    Args:
        fetch: Document lookup by draw (see :data:`Fetch`).
        state: Where the previous sequence ended.
        rows: Sequences to fill.
        seq_len: Tokens per sequence.
        policy: ``concat`` or ``none``.

    Returns:
        ``(segments, docs, next_state)``, where ``segments['doc']`` indexes ``docs`` (the
        fetched documents starting at ``state.draw``), or ``None`` when the stream ends first
        (a partial final batch is never emitted).

    Raises:
        DataError: ``state.offset`` is not inside its document.
    """
    if rows < 1 or seq_len < 1:
        raise ArgumentError(f"rows and seq_len must be >= 1, found rows {rows}, seq_len "
                            f"{seq_len}")
    if policy is PackingPolicy.NONE:
        return _pack_none(fetch, state, rows, seq_len)
    docs = _fetch_tokens(fetch, state, rows * seq_len)
    if docs is None:
        return None
    return _split(docs, state, rows, seq_len)


def _pack_none(fetch: Fetch, state: PackState, rows: int,
               seq_len: int) -> tuple[np.ndarray, np.ndarray, PackState] | None:
    if state.offset:
        raise DataError(f"packing 'none' resumes at a document start, found offset "
                        f"{state.offset}; the cursor was written with packing 'concat'")
    docs = fetch(state.draw, rows)
    if docs.size < rows:
        return None
    seg = np.zeros(rows, dtype=SEGMENT_DTYPE)
    seg["row"] = seg["doc"] = np.arange(rows)
    seg["length"] = np.minimum(docs["length"], seq_len)
    return seg, docs, PackState(draw=state.draw + rows, offset=0)


def _fetch_tokens(fetch: Fetch, state: PackState, need: int) -> np.ndarray | None:
    """Fetch documents from ``state.draw`` until they hold ``need`` unpacked tokens."""
    parts: list[np.ndarray] = []
    have, nxt, chunk = -state.offset, state.draw, 64
    while have < need:
        part = fetch(nxt, chunk)
        if part.size:
            parts.append(part)
            have += int(part["length"].sum())
            nxt += part.size
        if part.size < chunk:
            break
        chunk = min(chunk * 2, 1 << 16)
    if not parts:
        return None
    docs = np.concatenate(parts)
    if state.offset >= max(int(docs["length"][0]), 1):
        raise DataError(f"packer residual offset {state.offset} is not inside document "
                        f"{state.draw} of {int(docs['length'][0])} tokens; the cursor does not "
                        "belong to this data")
    return docs if have >= need else None


def _split(docs: np.ndarray, state: PackState, rows: int,
           seq_len: int) -> tuple[np.ndarray, np.ndarray, PackState]:
    """Cut the concatenated stream (first document minus its packed prefix) into rows.

    The segments are the intervals between the cut points: every row start and every
    document end inside the batch (an empty document makes no segment).
    """
    need = rows * seq_len
    eff = docs["length"].astype(np.int64)
    eff[0] -= state.offset
    end = np.cumsum(eff)
    used = int(np.searchsorted(end, need, side="left")) + 1
    lo = np.union1d(end[:used - 1], np.arange(0, need, seq_len))
    doc = np.searchsorted(end, lo, side="right")
    seg = np.zeros(lo.size, dtype=SEGMENT_DTYPE)
    seg["row"], seg["doc"] = lo // seq_len, doc
    seg["length"] = np.diff(lo, append=need)
    seg["offset"] = lo - (end[doc] - eff[doc])
    if doc.size and doc[0] == 0:
        seg["offset"][doc == 0] += state.offset
    tail = int(used - 1)
    consumed = int(min(end[tail], need) - (end[tail] - eff[tail]))
    if tail == 0:
        consumed += state.offset
    if consumed >= int(docs["length"][tail]):
        return seg, docs[:used], PackState(draw=state.draw + used, offset=0)
    return seg, docs[:used], PackState(draw=state.draw + tail, offset=consumed)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """``[0..c0-1, 0..c1-1, ...]`` for ``counts = [c0, c1, ...]``, vectorized."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts
