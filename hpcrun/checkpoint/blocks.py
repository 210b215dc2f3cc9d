"""Row blocks of a DTensor box: the unit a resharding restore reads and verifies (pure).

A box (one DTensor shard as written) of at least :data:`MIN_BLOCKS` blocks of
:data:`BLOCK_BYTES` is also checksummed per *row block*: ``block_rows`` consecutive rows along
its first dimension, a contiguous byte range of the dataset. The manifest records those digests
beside the whole dataset's (``DatasetRecord.blocks``). A rank whose new box takes only some rows
of an old box (FSDP 2 → 4, a shrink) reads only the blocks that hold them (:func:`narrow`) and
verifies each block on its own (:func:`digest_spans`); nothing is returned unverified.

A box cut along another dimension (a TP column shard of a row-sharded box) needs every row, so
it is read whole: row blocks are the only contiguous ranges a C-ordered box has.
"""

from __future__ import annotations

from dataclasses import replace

from hpcrun.checkpoint.manifest import DatasetRecord

BLOCK_BYTES = 1 << 20
"""Target bytes of one row block (whole rows: a row larger than this is a block of its own)."""
MIN_BLOCKS = 2
"""Boxes smaller than this many blocks are read whole (one digest is enough)."""


def rows_per_block(lengths: tuple[int, ...], nbytes: int) -> int:
    """Rows per block of a box of ``lengths`` holding ``nbytes``; 0 when it is not split."""
    if not lengths or lengths[0] < 2 or nbytes < MIN_BLOCKS * BLOCK_BYTES:
        return 0
    row = nbytes // lengths[0]
    per = max(1, BLOCK_BYTES // max(1, row))
    return per if per < lengths[0] else 0


def block_ranges(rows: int, per: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of every block of a box of ``rows`` rows."""
    return [(a, min(a + per, rows)) for a in range(0, rows, per)]


def digest_spans(d: DatasetRecord) -> list[tuple[int, int, str]]:
    """``(byte start, byte length, digest)`` pieces that together verify ``d``'s bytes: its
    blocks when it has them, else the whole dataset under its one checksum."""
    if not d.blocks:
        return [(0, d.nbytes, d.checksum)]
    row = d.nbytes // d.lengths[0]
    return [(a * row, (b - a) * row, digest) for (a, b), digest in
            zip(block_ranges(d.lengths[0], d.block_rows), d.blocks, strict=True)]


def narrow(d: DatasetRecord, first: int, stop: int) -> DatasetRecord:
    """``d`` cut to the blocks holding its rows ``[first, stop)`` (relative to the box), as a
    record of its own: a smaller box at a later file offset with those blocks' digests, and no
    whole-dataset checksum (only its blocks verify it). ``d`` itself when every block is needed
    or it has none."""
    if not d.blocks:
        return d
    b0, b1 = first // d.block_rows, -(-stop // d.block_rows)
    if b0 == 0 and b1 >= len(d.blocks):
        return d
    row = d.nbytes // d.lengths[0]
    a, b = b0 * d.block_rows, min(b1 * d.block_rows, d.lengths[0])
    return replace(d, offsets=(d.offsets[0] + a, *d.offsets[1:]),
                   lengths=(b - a, *d.lengths[1:]), row_start=d.row_start + a,
                   row_stop=d.row_start + b, offset=d.offset + a * row, nbytes=(b - a) * row,
                   checksum="", blocks=d.blocks[b0:b1])


__all__ = ["BLOCK_BYTES", "MIN_BLOCKS", "block_ranges", "digest_spans", "narrow",
           "rows_per_block"]
