"""Batch assembly on whole batches: this replica's segments → token, document, position arrays.

A global batch's layout (:class:`~hpcrun.data.batches.BatchPlan`) says which ``length`` tokens
of which document, from which ``offset``, fill which row. Here the replica's share of it becomes
arrays with a handful of numpy calls per batch, not Python per token or per row:

- :func:`slice_segments` cuts this replica's rows out of the plan (rows renumbered from 0);
- :func:`place_segments` computes where each segment lands and its document number in its row;
- :func:`assemble` fills ``document`` and ``position`` in one vectorized pass each and gathers
  the tokens from the objects' memory maps, one gather per object (a 2-D ``.npy`` or HDF5 shard
  holding many documents costs one fancy-index read; an object per document costs one slice).

Objects without a flat token map (JSON Lines, chunked HDF5) and documents with a stochastic
transform are read document by document: decoding JSON and calling the transform are per
document by nature. The output is identical on every path.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hpcrun.data.batches import BatchPlan
from hpcrun.data.dataset import Dataset
from hpcrun.errors import DataError

__all__ = ["SLICE_DTYPE", "assemble", "place_segments", "slice_segments"]

SLICE_DTYPE = np.dtype([("row", np.int64), ("sample_id", np.int64), ("source", np.int64),
                        ("record", np.int64), ("epoch", np.int64), ("offset", np.int64),
                        ("length", np.int64)])
"""One segment of a replica's slice: ``length`` tokens of ``record`` from ``offset`` into
local row ``row``."""

_SLICE_MIN = 64
"""Mean segment length (tokens) from which an object's segments are copied slice by slice."""

DocumentFn = Callable[[Dataset, np.void], np.ndarray]
"""Reads (and transforms) one whole document for a segment; the record-by-record path."""


def slice_segments(plan: BatchPlan, rows: range) -> np.ndarray:
    """The segments of ``rows`` of ``plan`` as :data:`SLICE_DTYPE`, rows renumbered from 0."""
    seg = plan.segments
    lo, hi = (int(v) for v in np.searchsorted(seg["row"], [rows.start, rows.stop]))
    mine = seg[lo:hi]
    docs = plan.docs[mine["doc"]]
    out = np.zeros(mine.size, dtype=SLICE_DTYPE)
    out["row"] = mine["row"] - rows.start
    for name in ("sample_id", "source", "record", "epoch"):
        out[name] = docs[name]
    out["offset"], out["length"] = mine["offset"], mine["length"]
    return out


def place_segments(table: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat output index of each segment's first token, and its document number in its row.

    Segments are in row order and fill each row from its start, in order (the packer's
    layout), so a segment starts where the previous segments of its row end.
    """
    lengths = table["length"]
    starts = np.cumsum(lengths) - lengths
    first = np.searchsorted(table["row"], table["row"], side="left")
    dest = table["row"] * seq_len + starts - starts[first]
    return dest, np.arange(table.size, dtype=np.int64) - first


_ARANGE = np.arange(0, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    """``arange(n)`` as a view of a shared read-only array (it only grows). A batch-sized
    temporary costs a page fault per 4 KiB page whenever the allocator hands it fresh pages
    (150 µs against 10 µs for 32k positions in a loop where it did)."""
    global _ARANGE
    if _ARANGE.size < n:
        grown = np.arange(max(n, 2 * _ARANGE.size), dtype=np.int64)
        grown.flags.writeable = False
        _ARANGE = grown
    return _ARANGE[:n]


def _ranks(counts: np.ndarray) -> np.ndarray:
    """``[0..c0-1, 0..c1-1, ...]`` for ``counts = [c0, c1, ...]``."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def assemble(dataset: Dataset, table: np.ndarray, *, rows: int, seq_len: int, pad_id: int,
             document: DocumentFn | None = None,
             out: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Arrays of one replica slice: ``tokens`` and ``position`` (int64), ``document`` (int32).

    Args:
        dataset: Where the tokens come from.
        table: The slice's segments (:data:`SLICE_DTYPE`), in row order.
        rows: Rows in the slice.
        seq_len: Tokens per row.
        pad_id: Token of unfilled positions (``packing="none"``).
        document: Per-document read for transforms; ``None`` gathers from token maps.
        out: Arrays of shape ``(rows, seq_len)`` to fill in place (a reader process's shared
            slot), keyed like the result; ``None`` allocates them.

    Returns:
        ``tokens``, ``document`` (−1 = padding), ``position`` of shape ``(rows, seq_len)``
        and ``tokens_read``, the number of real tokens.
    """
    shape = (rows, seq_len)
    arrays: dict[str, np.ndarray] = dict(out) if out is not None else {
        "tokens": np.empty(shape, dtype=np.int64), "document": np.empty(shape, dtype=np.int32),
        "position": np.empty(shape, dtype=np.int64)}
    tokens, doc, pos = (arrays[k].reshape(-1) for k in ("tokens", "document", "position"))
    dest, docno = place_segments(table, seq_len)
    lengths = table["length"]
    filled = int(lengths.sum())
    tiled = bool(np.array_equal(dest, np.cumsum(lengths) - lengths))
    if filled == tokens.size and tiled:
        # Every row is full (concat packing): the segments tile the slice in order.
        doc[...] = np.repeat(docno.astype(np.int32), lengths)
        np.add(_arange(filled), np.repeat(table["offset"] - dest, lengths), out=pos)
    else:
        tokens.fill(pad_id)
        doc.fill(-1)
        pos.fill(0)
        within = _ranks(lengths)
        flat = np.repeat(dest, lengths) + within
        doc[flat] = np.repeat(docno, lengths)
        pos[flat] = np.repeat(table["offset"], lengths) + within
    if document is None:
        _gather(dataset, table, dest, tokens, tiled)
    else:
        for seg, at in zip(table, dest.tolist(), strict=True):
            _put(tokens, at, document(dataset, seg), seg)
    return {"tokens": arrays["tokens"], "document": arrays["document"],
            "position": arrays["position"], "tokens_read": filled}


def _put(out: np.ndarray, at: int, tokens: np.ndarray, seg: np.void) -> None:
    off, n = int(seg["offset"]), int(seg["length"])
    out[at:at + n] = tokens[off:off + n]


def _gather(dataset: Dataset, table: np.ndarray, dest: np.ndarray, out: np.ndarray,
            tiled: bool) -> None:
    """Fill ``out`` with every segment's tokens, collected as views (documents stored one per
    file: one ``pread`` each; token maps: slices of the map; other objects: record by record)
    and copied with one ``concatenate`` when the segments tile the slice in order."""
    views: list[np.ndarray | None] = [None] * table.size
    for source in np.unique(table["source"]).tolist():
        sel = np.flatnonzero(table["source"] == source)
        objects, physical = dataset.locate(source, table["record"][sel])
        files = dataset.document_files(source)
        if files is not None:
            single = files.single[objects]
            mine = sel[single]
            got = files.read_segments(objects[single], table["offset"][mine],
                                      table["length"][mine])
            if mine.size == table.size:  # every segment, in order
                views = list(got)
            else:
                for i, view in zip(mine.tolist(), got, strict=True):
                    views[i] = view
            sel, objects, physical = sel[~single], objects[~single], physical[~single]
        for obj, group in _groups(objects):
            _object_views(dataset, source, obj, table, sel[group], physical[group], dest, out,
                          views)
    _copy_views(views, table, dest, out, tiled)


def _groups(objects: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(object, indices of its segments)`` per distinct object, in object order."""
    if objects.size and objects[0] == objects[-1] and not np.any(objects != objects[0]):
        return [(int(objects[0]), np.arange(objects.size))]
    order = np.argsort(objects, kind="stable")
    ranked = objects[order]
    bounds = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), objects.size]
    return [(int(ranked[a]), order[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def _copy_views(views: list[np.ndarray | None], table: np.ndarray, dest: np.ndarray,
                out: np.ndarray, tiled: bool) -> None:
    if tiled and views and all(v is not None for v in views):
        np.concatenate(views, out=out[:int(table["length"].sum())])  # type: ignore[arg-type]
        return
    for view, at in zip(views, dest.tolist(), strict=True):
        if view is not None:
            out[at:at + view.size] = view


def _object_views(dataset: Dataset, source: int, obj: int, table: np.ndarray,
                  idx: np.ndarray, physical: np.ndarray, dest: np.ndarray, out: np.ndarray,
                  views: list[np.ndarray | None]) -> None:
    """Views of the tokens of segments ``idx`` (all in object ``obj``), put in ``views``;
    short segments are gathered straight into ``out`` instead."""
    lengths, offsets = table["length"][idx], table["offset"][idx]
    tmap = dataset.token_map(source, obj)
    if tmap is None:
        for i, rec, off, n in zip(idx.tolist(), physical.tolist(), offsets.tolist(),
                                  lengths.tolist(), strict=True):
            tokens = dataset.read_physical(source, obj, rec)
            views[i] = _checked(tokens[off:off + n], n, dataset, source, obj, physical)
        return
    src = tmap.starts(physical) + offsets
    if int(src.min()) < 0 or int((src + lengths).max()) > tmap.tokens.size:
        _past_end(dataset, source, obj, physical, tmap.tokens.size)
    if int(lengths.sum()) >= _SLICE_MIN * idx.size:
        # Long segments: a view each beats building a gather index per token.
        tokens = tmap.tokens
        for i, lo, n in zip(idx.tolist(), src.tolist(), lengths.tolist(), strict=True):
            views[i] = tokens[lo:lo + n]
        return
    within = _ranks(lengths)
    out[np.repeat(dest[idx], lengths) + within] = tmap.tokens[np.repeat(src, lengths) + within]


def _checked(view: np.ndarray, n: int, dataset: Dataset, source: int, obj: int,
             physical: np.ndarray) -> np.ndarray:
    if view.size != n:
        raise DataError(f"{dataset.manifest.sources[source].objects[obj].path}: records "
                        f"{physical.tolist()[:4]} are shorter than the segments the order "
                        "names; the object changed since the manifest was built, rebuild it")
    return view


def _past_end(dataset: Dataset, source: int, obj: int, physical: np.ndarray,
              size: int) -> None:
    path = dataset.manifest.sources[source].objects[obj].path
    raise DataError(f"{path}: records {physical.tolist()[:4]} end past the object's {size} "
                    "tokens; the object changed since the manifest was built, rebuild it")
