"""Restore planning (pure): which datasets each rank reads, and where every piece lands.

Rank 0 reads the top manifest; each node's leader reads the sub-manifests its ranks need
(:func:`wanted_nodes` first guesses them from the old layout, :func:`uncovered` says whether
more are needed) and plans its node (:func:`plan_node`), then sends every rank its
:class:`RankPlan`. A rank reads only what its current state needs:

- the meta tree (incl. RNG) and rank-local tensors from old rank ``r % N``; rank-local tensors
  only when N == M, else :class:`~hpcrun.errors.ReshardError` naming the tensor and both layouts;
- dim-0 sharded tensors: the old pieces that intersect the rows its state declares
  (:class:`~.state.RowShard`), or, on the same world size, its own old piece;
- replicated tensors: each piece is read by one rank of the node (balanced by bytes) and shared
  over the node group, so a node reads them once;
- DTensor chunks (N-D boxes): the old boxes that intersect the box its state holds now (any
  mesh and world size onto any other, same global shape); of a large old box only the row
  blocks that hold the rows it needs (:func:`~.blocks.narrow`, each block verified against its
  own digest); a box without blocks, or cut along another dimension, is read whole.

Each rank's buffer is laid out as ``[replicated pieces it reads for the node | its own reads]``;
the first part is what the node exchanges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hpcrun.checkpoint.blocks import narrow
from hpcrun.checkpoint.chunks import Box, covered, intersect, volume
from hpcrun.checkpoint.keys import META_KEY, Placement
from hpcrun.checkpoint.manifest import DatasetRecord, ShardRecord
from hpcrun.checkpoint.rawio import align_up
from hpcrun.checkpoint.state import TensorLeaf

Rows = tuple[int, int, tuple[int, ...]]
"""``(row_start, row_stop, global_shape)`` of a dim-0 sharded tensor on this rank."""
Chunk = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""``(offsets, lengths, global_shape)`` of the DTensor box a rank holds."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Need:
    """What one rank's current state asks of a restore (sent to its node leader)."""

    rank: int
    """The rank (new layout)."""
    rows: Mapping[str, Rows] = field(default_factory=dict)
    """Dim-0 sharded tensors it holds now, by key."""
    chunks: Mapping[str, Chunk] = field(default_factory=dict)
    """DTensor boxes it holds now, by key."""


def need_of(rank: int, leaves: Mapping[str, TensorLeaf]) -> Need:
    """The :class:`Need` of a rank from its flattened state's leaves."""
    return Need(rank=rank, rows={
        k: (leaf.row_start, leaf.row_start + leaf.tensor.shape[0], tuple(leaf.global_shape))
        for k, leaf in leaves.items() if leaf.placement is Placement.ROW}, chunks={
        k: (leaf.offsets, tuple(leaf.tensor.shape), tuple(leaf.global_shape))
        for k, leaf in leaves.items() if leaf.placement is Placement.CHUNK})


@dataclass(frozen=True, kw_only=True, slots=True)
class Read:
    """One dataset a rank reads into its buffer."""

    shard: int
    """Old rank whose shard holds it."""
    index: int
    """Index of the dataset in that shard's record."""
    offset: int
    """Byte offset in the reader's buffer."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Placed:
    """A piece a rank assembles from: which buffer holds it, where."""

    record: DatasetRecord
    """The dataset."""
    holder: int
    """Node position whose shared region holds it; -1 for this rank's own reads."""
    offset: int
    """Byte offset in that buffer."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """One tensor a rank rebuilds: rows ``[start, stop)`` of ``global_shape``."""

    key: str
    """Logical key."""
    dtype: str
    """True torch dtype name."""
    global_shape: tuple[int, ...]
    """Shape of the whole tensor."""
    start: int
    """First global row."""
    stop: int
    """One past the last global row."""
    box: Box | None = None
    """A DTensor box: its offsets and lengths (None: rows ``[start, stop)``)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of this rank's tensor."""
        if self.box is not None:
            return self.box[1]
        return (self.stop - self.start, *self.global_shape[1:]) if self.global_shape else ()


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPlan:
    """Everything one rank needs to read and assemble its state (built by its node leader)."""

    ckpt_id: str
    """Checkpoint read."""
    checksum: str
    """Checksum algorithm of its datasets."""
    files: Mapping[int, ShardRecord]
    """Records of the old shards this rank opens, by old rank."""
    reads: tuple[Read, ...]
    """Datasets it reads, in file order."""
    shared: tuple[int, ...]
    """Bytes of each node position's shared region (replicated pieces)."""
    size: int
    """Bytes of this rank's buffer (its shared region, then its own reads)."""
    targets: tuple[tuple[Target, tuple[Placed, ...]], ...]
    """Each tensor to rebuild and the pieces it is built from."""
    meta: Placed | None = None
    """The meta tree's dataset."""
    error: str = ""
    """Why the checkpoint cannot be placed on this layout (a ReshardError message)."""

    @property
    def bytes_read(self) -> int:
        """Data bytes this rank reads from shard files."""
        return sum(self.files[r.shard].datasets[r.index].nbytes for r in self.reads)


def wanted_nodes(old_nodes: Sequence[str], ranks: Sequence[int]) -> list[str]:
    """Old nodes whose sub-manifests hold the old shards ``r % N`` of ``ranks`` (first guess)."""
    n = len(old_nodes)
    return list(dict.fromkeys(old_nodes[r % n] for r in ranks))


def _intervals(records: Mapping[int, ShardRecord]) -> dict[str, list[tuple[int, int, str]]]:
    out: dict[str, list[tuple[int, int, str]]] = {}
    for s in records.values():
        for d in s.datasets:
            if d.placement in (Placement.REPLICATED, Placement.ROW):
                out.setdefault(d.key, []).append((d.row_start, d.row_stop, d.placement))
    return out


def _gaps(spans: Sequence[tuple[int, int, str]], a: int, b: int) -> list[tuple[int, int]]:
    gaps, pos = [], a
    for s, e, _ in sorted(spans):
        if s > pos and pos < b:
            gaps.append((pos, min(s, b)))
        pos = max(pos, e)
    if pos < b:
        gaps.append((pos, b))
    return gaps


def uncovered(records: Mapping[int, ShardRecord], tensors: Mapping[str, int],
              needs: Sequence[Need], old_world: int) -> dict[str, list[tuple[int, int]]]:
    """Row ranges the node's ranks need that ``records`` do not hold yet, by key.

    Args:
        records: shard records read so far, by old rank.
        tensors: rows of every replicated and dim-0 sharded tensor (from the top manifest).
        needs: the node's ranks' needs.
        old_world: ranks that wrote the checkpoint.
    """
    spans = _intervals(records)
    out: dict[str, list[tuple[int, int]]] = {}
    for key, total in tensors.items():
        have = spans.get(key, [])
        rowwise = any(p == "row" for _, _, p in have)
        for need in needs:
            declared = need.rows.get(key)
            if declared is not None:
                a, b = declared[0], declared[1]
            elif rowwise and (need.rank % old_world) in records:
                continue  # same layout: its own old piece, already read
            else:
                a, b = 0, total
            if gaps := _gaps(have, a, b):
                out.setdefault(key, []).extend(gaps)
    out.update(_uncovered_chunks(records, needs))
    return out


def _chunk_boxes(records: Mapping[int, ShardRecord]) -> dict[str, list[Box]]:
    out: dict[str, list[Box]] = {}
    for s in records.values():
        for d in s.datasets:
            if d.placement == Placement.CHUNK:
                out.setdefault(d.key, []).append((d.offsets, d.lengths))
    return out


def _uncovered_chunks(records: Mapping[int, ShardRecord],
                      needs: Sequence[Need]) -> dict[str, list[tuple[int, int]]]:
    """Keys of DTensor boxes the records do not cover yet, with the dim-0 range wanted."""
    boxes = _chunk_boxes(records)
    out: dict[str, list[tuple[int, int]]] = {}
    for need in needs:
        for key, (offs, lens, _) in need.chunks.items():
            if covered((offs, lens), boxes.get(key, [])) < volume(lens):
                start = offs[0] if offs else 0
                out.setdefault(key, []).append((start, start + (lens[0] if lens else 1)))
    return out


def guess_nodes(gaps: Mapping[str, Sequence[tuple[int, int]]], tensors: Mapping[str, int],
                old_nodes: Sequence[str]) -> list[str]:
    """Old nodes whose ranks probably wrote the missing rows (rows split evenly by rank)."""
    n = len(old_nodes)
    ranks: set[int] = set()
    for key, spans in gaps.items():
        total = max(tensors.get(key, 1), 1)
        for a, b in spans:
            lo, hi = max(0, a * n // total - 1), min(n, -(-b * n // total) + 1)
            ranks.update(range(lo, hi))
    return list(dict.fromkeys(old_nodes[r] for r in sorted(ranks)))


def _layouts(old: int, new: int) -> str:
    return f"checkpoint layout {old} ranks, restore layout {new} ranks"


class _Builder:
    """Lays out one node's reads: shared regions per position, own reads per position."""

    def __init__(self, positions: int) -> None:
        self.shared = [0] * positions
        self.reads: list[list[Read]] = [[] for _ in range(positions)]
        self.own: list[list[Read]] = [[] for _ in range(positions)]
        self.own_size = [0] * positions
        self.placed: dict[tuple[int, int], Placed] = {}
        self.cut: list[dict[tuple[int, int], DatasetRecord]] = [{} for _ in range(positions)]
        """Own reads of only part of a dataset (its row blocks), by ``(shard, index)``."""

    def share(self, shard: int, index: int, d: DatasetRecord) -> Placed:
        if (shard, index) not in self.placed:
            p = min(range(len(self.shared)), key=lambda i: (self.shared[i], i))
            self.reads[p].append(Read(shard=shard, index=index, offset=self.shared[p]))
            self.placed[(shard, index)] = Placed(record=d, holder=p, offset=self.shared[p])
            self.shared[p] = align_up(self.shared[p] + d.nbytes)
        return self.placed[(shard, index)]

    def mine(self, pos: int, shard: int, index: int, d: DatasetRecord) -> Placed:
        """An own read (``d``: the dataset or the part of it read); its offset is relative to
        the end of the shared region (see _own)."""
        if d.checksum == "":
            self.cut[pos][(shard, index)] = d
        base = self.own_size[pos]
        self.own[pos].append(Read(shard=shard, index=index, offset=base))
        self.own_size[pos] = align_up(base + d.nbytes)
        return Placed(record=d, holder=-1, offset=base)


def _pieces(records: Mapping[int, ShardRecord]) -> dict[str, list[tuple[int, int, DatasetRecord]]]:
    out: dict[str, list[tuple[int, int, DatasetRecord]]] = {}
    for j in sorted(records):
        for i, d in enumerate(records[j].datasets):
            out.setdefault(d.key, []).append((j, i, d))
    return out


def _plan_rank(b: _Builder, pos: int, need: Need, pieces: Mapping[str, list[tuple[int, int,
               DatasetRecord]]], old_world: int, new_world: int,
               ) -> tuple[list[tuple[Target, tuple[Placed, ...]]], Placed | None, str]:
    src = need.rank % old_world
    targets: list[tuple[Target, tuple[Placed, ...]]] = []
    meta, error = None, ""
    for key, parts in pieces.items():
        d0 = parts[0][2]
        if d0.placement == Placement.REPLICATED:
            t = Target(key=key, dtype=d0.dtype, global_shape=d0.global_shape, start=0,
                       stop=d0.global_shape[0] if d0.global_shape else 1)
            targets.append((t, tuple(b.share(j, i, d) for j, i, d in parts)))
            continue
        if d0.placement == Placement.LOCAL or key == META_KEY:
            own = [(j, i, d) for j, i, d in parts if j == src]
            if not own:
                continue
            if key == META_KEY:
                meta = b.mine(pos, *own[0])
                continue
            if new_world != old_world:
                error = error or (f"tensor {key!r} is rank-local and cannot be resharded "
                                  f"({_layouts(old_world, new_world)}); restore onto {old_world}"
                                  " ranks or make it replicated or RowShard")
                continue
            t = Target(key=key, dtype=d0.dtype, global_shape=d0.global_shape, start=0,
                       stop=d0.global_shape[0] if d0.global_shape else 1)
            targets.append((t, (b.mine(pos, *own[0]),)))
            continue
        if d0.placement == Placement.CHUNK:
            box_target, picked, why = _chunk_target(key, parts, need, old_world, new_world)
            error = error or why
            if box_target is not None:
                targets.append((box_target, tuple(b.mine(pos, j, i, d) for j, i, d in picked)))
            continue
        target, chosen, why = _row_target(key, parts, need, src, old_world, new_world)
        error = error or why
        if target is not None:
            targets.append((target, tuple(b.mine(pos, j, i, d) for j, i, d in chosen)))
    return targets, meta, error


def _row_target(key: str, parts: Sequence[tuple[int, int, DatasetRecord]], need: Need, src: int,
                old_world: int, new_world: int,
                ) -> tuple[Target | None, list[tuple[int, int, DatasetRecord]], str]:
    d0 = parts[0][2]
    declared = need.rows.get(key)
    if declared is None:
        if new_world != old_world:
            return None, [], (f"tensor {key!r} is sharded along dim 0 "
                              f"({_layouts(old_world, new_world)}) but the current state does "
                              "not declare this rank's rows; return a RowShard for it from "
                              "state_dict()")
        own = [p for p in parts if p[0] == src][:1]
        a, b = (own[0][2].row_start, own[0][2].row_stop) if own else (0, 0)
        return Target(key=key, dtype=d0.dtype, global_shape=d0.global_shape, start=a,
                      stop=b), own, ""
    a, b, shape = declared
    if tuple(shape) != tuple(d0.global_shape):
        return None, [], (f"tensor {key!r} has global shape {list(d0.global_shape)} in the "
                          f"checkpoint but {list(shape)} now "
                          f"({_layouts(old_world, new_world)}); only the split may change")
    chosen = [p for p in parts if max(a, p[2].row_start) < min(b, p[2].row_stop)]
    return Target(key=key, dtype=d0.dtype, global_shape=d0.global_shape, start=a,
                  stop=b), chosen, ""


def _chunk_target(key: str, parts: Sequence[tuple[int, int, DatasetRecord]], need: Need,
                  old_world: int, new_world: int,
                  ) -> tuple[Target | None, list[tuple[int, int, DatasetRecord]], str]:
    """The box this rank holds of a DTensor and the old boxes that intersect it."""
    d0 = parts[0][2]
    declared = need.chunks.get(key)
    if declared is None:
        return None, [], (f"tensor {key!r} is a DTensor in the checkpoint "
                          f"({_layouts(old_world, new_world)}) but not in the current state; "
                          "register the sharded module and its optimizer with ctx.restore "
                          "before training (their state then holds DTensors)")
    offs, lens, shape = declared
    if tuple(shape) != tuple(d0.global_shape):
        return None, [], (f"tensor {key!r} has global shape {list(d0.global_shape)} in the "
                          f"checkpoint but {list(shape)} now "
                          f"({_layouts(old_world, new_world)}); only the sharding may change")
    box = (tuple(offs), tuple(lens))
    # copies of a box (written by each copy of a submesh without dim names) are read once
    unique = {(p[2].offsets, p[2].lengths): p for p in reversed(parts)}
    picked = [(j, i, _rows_needed(d, x)) for b, (j, i, d) in unique.items()
              if (x := intersect(box, b)) is not None]
    if covered(box, [(p[2].offsets, p[2].lengths) for p in picked]) < volume(lens):
        return None, [], (f"tensor {key!r}: the checkpoint's chunks do not cover this rank's "
                          f"box at {list(offs)} of {list(lens)}; the checkpoint is incomplete")
    start = offs[0] if offs else 0
    return Target(key=key, dtype=d0.dtype, global_shape=d0.global_shape, start=start,
                  stop=start + (lens[0] if lens else 1), box=box), picked, ""


def _rows_needed(d: DatasetRecord, x: Box) -> DatasetRecord:
    """``d``, or only its row blocks that hold the rows of the intersection ``x``."""
    if not x[0]:
        return d
    first = x[0][0] - d.offsets[0]
    return narrow(d, first, first + x[1][0])


def _with_cuts(shard: int, rec: ShardRecord,
               cuts: Mapping[tuple[int, int], DatasetRecord]) -> ShardRecord:
    """``rec`` with the datasets this rank reads only part of replaced by those parts."""
    mine = {i: d for (j, i), d in cuts.items() if j == shard}
    if not mine:
        return rec
    return replace(rec, datasets=tuple(mine.get(i, d) for i, d in enumerate(rec.datasets)))


def plan_node(records: Mapping[int, ShardRecord], needs: Sequence[Need], *, ckpt_id: str,
              checksum: str, old_world: int, new_world: int) -> list[RankPlan]:
    """Every node rank's :class:`RankPlan`, in the order of ``needs`` (pure).

    Args:
        records: shard records of every old shard the node needs (from its sub-manifests).
        needs: the node's ranks' needs, in rank order (position 0 is the leader).
        old_world: ranks that wrote the checkpoint.
        new_world: ranks restoring it.
    """
    b = _Builder(len(needs))
    pieces = _pieces(records)
    per_rank = [_plan_rank(b, pos, need, pieces, old_world, new_world)
                for pos, need in enumerate(needs)]
    plans = []
    for pos, (targets, meta, error) in enumerate(per_rank):
        base = b.shared[pos]
        own = [Read(shard=r.shard, index=r.index, offset=base + r.offset) for r in b.own[pos]]
        reads = tuple(sorted([*b.reads[pos], *own], key=lambda r: (r.shard, r.offset)))
        plans.append(RankPlan(
            ckpt_id=ckpt_id, checksum=checksum, reads=reads,
            files={r.shard: _with_cuts(r.shard, records[r.shard], b.cut[pos]) for r in reads},
            shared=tuple(b.shared), size=base + b.own_size[pos], meta=_shift(meta, base),
            targets=tuple((t, tuple(_own(p, base) for p in ps)) for t, ps in targets),
            error=error))
    return plans


def _shift(p: Placed | None, base: int) -> Placed | None:
    """Own-read offsets are relative to the end of the rank's shared region."""
    return None if p is None else _own(p, base)


def _own(p: Placed, base: int) -> Placed:
    if p.holder >= 0:
        return p
    return Placed(record=p.record, holder=-1, offset=base + p.offset)


__all__ = ["Chunk", "Need", "Placed", "RankPlan", "Read", "Target", "guess_nodes", "need_of",
           "plan_node", "uncovered", "wanted_nodes"]
