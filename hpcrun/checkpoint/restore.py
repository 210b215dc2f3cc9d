"""Restore's reading and assembling (planning is :mod:`hpcrun.checkpoint.readplan`).

:func:`read_planned` reads the datasets of a rank's plan into its buffer and verifies them;
:func:`build_tensors` copies each piece into the rank's target tensors in place (a new tensor
only where the state has none of that shape and dtype).

The rest of this module is the exchange restore, used only when some rank cannot reach a shard
it needs (its tier-0 copy is on another node and was not drained yet): old shard ``j`` of a
checkpoint written by N ranks is read by new rank ``j % M`` (M = new world size), so each file
is opened once in total and every rank opens about N/M files: no rank opens everyone's files.
The ranks then all-gather what they read (:func:`plan_gather` fixes, without talking, where
every dataset lands in whose buffer) and each rank assembles:

- replicated tensors in full (any N → M);
- dim-0 sharded tensors: the rows its current state declares (:class:`~.state.RowShard`),
  from whichever old pieces overlap them (any N → M with the same global shape);
- DTensor chunks: the box its current state holds, from the old boxes that intersect it; with
  no current state (an offline reader, :func:`hpcrun.drill.states.load_state`) the whole
  global tensor;
- rank-local tensors and the meta tree (incl. RNG) from old rank ``r % N`` — rank-local tensors
  only when N == M, else :class:`~hpcrun.errors.ReshardError` naming the tensor and both layouts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcrun.checkpoint.chunks import Box, intersect, relative, volume
from hpcrun.checkpoint.device import HostLanding
from hpcrun.checkpoint.keys import META_KEY, Placement
from hpcrun.checkpoint.manifest import DatasetRecord, Manifest, ShardRecord
from hpcrun.checkpoint.rawio import align_up, aligned_buffer
from hpcrun.checkpoint.readpipe import RestorePhases
from hpcrun.checkpoint.readplan import Placed, RankPlan, Read, Target
from hpcrun.checkpoint.shards import ShardSource, read_datasets
from hpcrun.checkpoint.stage import torch_dtype
from hpcrun.checkpoint.state import TensorLeaf
from hpcrun.errors import CorruptCheckpointError, ReshardError
from hpcrun.vocab import Tier


@dataclass(frozen=True, kw_only=True, slots=True)
class GatherPlan:
    """Who reads which old shard, and where each dataset lands in the exchanged buffers."""

    files: dict[int, list[int]]
    """New rank → old shard ranks it reads."""
    sizes: list[int]
    """Bytes each new rank contributes to the exchange."""
    where: dict[tuple[int, int], tuple[int, int]]
    """(old rank, dataset index) → (new rank, byte offset in its buffer)."""


def plan_gather(m: Manifest, world_size: int) -> GatherPlan:
    """Assign old shards to new ranks and lay out the exchange buffers (pure)."""
    files: dict[int, list[int]] = {r: [] for r in range(world_size)}
    for j in range(m.world_size):
        files[j % world_size].append(j)
    sizes, where = [], {}
    for r in range(world_size):
        offset = 0
        for j in files[r]:
            for i, d in enumerate(m.shards[j].datasets):
                where[(j, i)] = (r, offset)
                offset = align_up(offset + d.nbytes)
        sizes.append(offset)
    return GatherPlan(files=files, sizes=sizes, where=where)


SourceChoice = Callable[[int], Sequence[tuple[Tier, Path | ShardSource]]]
"""Old shard rank → candidate ``(tier, file or peer copy)`` pairs, preferred first."""


def read_assigned(m: Manifest, plan: GatherPlan, rank: int, candidates: SourceChoice,
                  ) -> tuple[np.ndarray, dict[Tier, int], RestorePhases]:
    """Read and verify this rank's assigned shards into its exchange buffer.

    Each shard is tried on its candidate tiers in order; a copy that fails verification is
    never used, the next tier is tried.

    Returns:
        The buffer, the data bytes read from each tier, and where the time went.

    Raises:
        CorruptCheckpointError: some shard verified on no tier.
    """
    buf = aligned_buffer(plan.sizes[rank], touch=False)
    counts: dict[Tier, int] = {}
    phases = RestorePhases()
    for j in plan.files[rank]:
        shard = m.shards[j]
        dest = [buf[off:off + d.nbytes] for d, off in
                ((d, plan.where[(j, i)][1]) for i, d in enumerate(shard.datasets))]
        tier, took = read_first_good(m.ckpt_id, m.checksum, j, shard, list(enumerate(dest)),
                                     candidates)
        counts[tier] = counts.get(tier, 0) + sum(d.nbytes for d in shard.datasets)
        phases = add_phases(phases, took)
    return buf, counts, phases


def add_phases(a: RestorePhases, b: RestorePhases) -> RestorePhases:
    """The sum of two splits (shards are read one after another)."""
    return a.plus(**b.fields())


def read_first_good(ckpt_id: str, algorithm: str, j: int, rec: ShardRecord,
                    wanted: Sequence[tuple[int, np.ndarray]], candidates: SourceChoice,
                    ) -> tuple[Tier, RestorePhases]:
    """Read ``wanted`` datasets of old rank ``j``'s shard from its first copy that verifies;
    the tier it came from and the split of that read.

    Raises:
        CorruptCheckpointError: no copy verified (each copy's reason in the message).
    """
    errors = []
    for tier, src in candidates(j):
        try:
            return tier, read_datasets(src, rec, wanted, ckpt_id=ckpt_id, algorithm=algorithm)
        except CorruptCheckpointError as exc:
            errors.append(f"{tier}: {exc}")
    raise CorruptCheckpointError(
        f"shard of rank {j} of checkpoint {ckpt_id} verified on no tier: "
        f"{' | '.join(errors) or 'no tier holds it'}")


def _as_tensor(raw: np.ndarray, d: DatasetRecord) -> torch.Tensor:
    shape = d.shape
    if not raw.size:
        return torch.empty(shape, dtype=torch_dtype(d.dtype))
    return torch.from_numpy(raw).view(torch_dtype(d.dtype)).view(shape)


def _layouts(m: Manifest, world_size: int) -> str:
    return f"checkpoint layout {m.world_size} ranks, restore layout {world_size} ranks"


def assemble(m: Manifest, plan: GatherPlan, gathered: Sequence[np.ndarray], *, rank: int,
             world_size: int, rows: Mapping[str, TensorLeaf]) -> tuple[dict[str, torch.Tensor],
                                                                      dict[str, Any]]:
    """This rank's tensors by key and its meta tree, from the exchanged buffers.

    Args:
        rows: the current state's ROW and CHUNK leaves (which rows or box this rank holds
            now; a chunked tensor without a leaf is assembled whole).

    Raises:
        ReshardError: a tensor cannot be placed on the new layout.
    """
    source = rank % m.world_size
    pieces: dict[str, list[tuple[DatasetRecord, torch.Tensor]]] = {}
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for j, shard in enumerate(m.shards):
        for i, d in enumerate(shard.datasets):
            r, off = plan.where[(j, i)]
            raw = gathered[r][off:off + d.nbytes]
            if d.placement == Placement.LOCAL:
                if j == source:
                    _take_local(d, raw, m, world_size, tensors, meta)
            else:
                pieces.setdefault(d.key, []).append((d, _as_tensor(raw, d)))
    for key, parts in pieces.items():
        if parts[0][0].placement == Placement.ROW:
            tensors[key] = _rows_for(key, parts, rows.get(key), m, rank, world_size)
        elif parts[0][0].placement == Placement.CHUNK:
            tensors[key] = _box_for(key, parts, rows.get(key), m, world_size)
        else:
            tensors[key] = _whole(parts)
    return tensors, meta


def _take_local(d: DatasetRecord, raw: np.ndarray, m: Manifest, world_size: int,
                tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    if d.key == META_KEY:
        try:
            meta.update(json.loads(raw.tobytes()))
        except ValueError as exc:
            raise CorruptCheckpointError(f"meta tree of {m.ckpt_id} is not JSON") from exc
        return
    if world_size != m.world_size:
        raise ReshardError(f"tensor {d.key!r} is rank-local and cannot be resharded "
                           f"({_layouts(m, world_size)}); restore onto {m.world_size} ranks "
                           "or make it replicated or RowShard")
    tensors[d.key] = _as_tensor(raw, d)


def _whole(parts: list[tuple[DatasetRecord, torch.Tensor]]) -> torch.Tensor:
    d0, t0 = parts[0]
    if len(parts) == 1:
        return t0  # a view of the exchanged bytes: no copy
    out = torch.empty(d0.global_shape, dtype=t0.dtype)
    for d, t in parts:
        out[d.row_start:d.row_stop] = t
    return out


def _rows_for(key: str, parts: list[tuple[DatasetRecord, torch.Tensor]],
              leaf: TensorLeaf | None, m: Manifest, rank: int, world_size: int) -> torch.Tensor:
    d0, t0 = parts[0]
    if leaf is None:
        if world_size != m.world_size:
            raise ReshardError(f"tensor {key!r} is sharded along dim 0 ({_layouts(m, world_size)}) "
                               "but the current state does not declare this rank's rows; "
                               "return a RowShard for it from state_dict()")
        mine = [p for p in parts if p[0].row_start == _old_start(m, rank, key)]
        return mine[0][1] if mine else t0[:0]
    if tuple(leaf.global_shape) != tuple(d0.global_shape):
        raise ReshardError(f"tensor {key!r} has global shape {list(d0.global_shape)} in the "
                           f"checkpoint but {list(leaf.global_shape)} now "
                           f"({_layouts(m, world_size)}); only the split may change")
    start, stop = leaf.row_start, leaf.row_start + leaf.tensor.shape[0]
    out = torch.empty((stop - start, *d0.global_shape[1:]), dtype=t0.dtype)
    for d, t in parts:
        a, b = max(start, d.row_start), min(stop, d.row_stop)
        if a < b:
            out[a - start:b - start] = t[a - d.row_start:b - d.row_start]
    return out


def _box_for(key: str, parts: list[tuple[DatasetRecord, torch.Tensor]],
             leaf: TensorLeaf | None, m: Manifest, world_size: int) -> torch.Tensor:
    """The box ``leaf`` holds (the whole tensor without a leaf) from the old boxes."""
    d0, t0 = parts[0]
    if leaf is not None and tuple(leaf.global_shape) != tuple(d0.global_shape):
        raise ReshardError(f"tensor {key!r} has global shape {list(d0.global_shape)} in the "
                           f"checkpoint but {list(leaf.global_shape)} now "
                           f"({_layouts(m, world_size)}); only the sharding may change")
    box: Box = ((leaf.offsets, tuple(leaf.tensor.shape)) if leaf is not None
                else ((0,) * len(d0.global_shape), tuple(d0.global_shape)))
    out = torch.empty(box[1], dtype=t0.dtype)
    filled, seen = 0, set()
    for d, t in parts:
        if (d.offsets, d.lengths) in seen:
            continue  # another copy of a box already taken
        seen.add((d.offsets, d.lengths))
        if (x := intersect(box, (d.offsets, d.lengths))) is not None:
            out[relative(x, box[0])] = t[relative(x, d.offsets)]
            filled += volume(x[1])
    if filled != volume(box[1]):
        raise CorruptCheckpointError(f"tensor {key!r}: the chunks of {m.ckpt_id} cover "
                                     f"{filled} of the {volume(box[1])} elements needed; the "
                                     "checkpoint is incomplete")
    return out


def _old_start(m: Manifest, rank: int, key: str) -> int:
    for d in m.shards[rank].datasets:
        if d.key == key:
            return d.row_start
    return -1


LANDED = -2
""":attr:`Placed.holder` of a piece read straight into its target tensor (nothing to copy)."""


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _fits(target: Target, d: DatasetRecord, leaf: TensorLeaf | None) -> bool:
    """Whether dataset ``d`` is, byte for byte, the whole of the state's own tensor."""
    if leaf is None or not d.nbytes:
        return False
    t = leaf.tensor
    whole = (d.offsets, d.lengths) == target.box if target.box is not None else (
        not target.global_shape or (d.row_start, d.row_stop) == (target.start, target.stop))
    return (whole and t.device.type == "cpu" and t.is_contiguous()
            and t.dtype == torch_dtype(target.dtype) and tuple(t.shape) == target.shape
            and tuple(t.shape) == d.shape and t.numel() * t.element_size() == d.nbytes)


def land_in_place(plan: RankPlan, leaves: Mapping[str, TensorLeaf], pos: int,
                  ) -> tuple[RankPlan, dict[tuple[int, int], np.ndarray]]:
    """Send each dataset that is a whole state tensor straight into that tensor.

    A piece qualifies when it is this rank's own read (or a replicated one on a node of one
    rank: nobody else needs it from this rank's buffer) and fills the state's own contiguous
    host tensor of its shape and dtype. The rest keeps its place in the read buffer, compacted,
    so the buffer is only as large as what still goes through it.

    Returns:
        The plan with those pieces marked :data:`LANDED` and the buffer offsets compacted, and
        ``(shard, index) -> the target tensor's bytes`` for the reads to land in place.
    """
    solo = len(plan.shared) == 1
    at = {r.offset: (r.shard, r.index) for r in plan.reads}  # unique within this rank's buffer
    into: dict[tuple[int, int], np.ndarray] = {}
    for target, pieces in plan.targets:
        leaf = leaves.get(target.key)
        if len(pieces) != 1 or not _mine(pieces[0], solo) or leaf is None:
            continue
        key = at.get(pieces[0].offset)
        if key is not None and _fits(target, pieces[0].record, leaf):
            into[key] = _bytes_of(leaf.tensor)
    if not into:
        return plan, into
    return _compact(plan, {at_off for at_off, k in at.items() if k in into}, pos, solo), into


def _mine(p: Placed, solo: bool) -> bool:
    """Whether ``p`` lies in this rank's own buffer and nobody else reads it from there."""
    return p.holder == -1 or (solo and p.holder == 0)


def _compact(plan: RankPlan, landed: set[int], pos: int, solo: bool) -> RankPlan:
    """``plan`` with the reads at ``landed`` offsets out of the buffer and the others packed
    (on a node of several ranks the shared region, which the node exchanges, stays as it is)."""
    base = plan.shared[pos]
    kept = sorted((r for r in plan.reads if r.offset not in landed), key=lambda r: r.offset)
    moved: dict[int, int] = {}

    def pack(reads: Sequence[Read], cursor: int) -> int:
        for r in reads:
            moved[r.offset] = cursor
            cursor = align_up(cursor + plan.files[r.shard].datasets[r.index].nbytes)
        return cursor

    new_base = pack([r for r in kept if r.offset < base], 0) if solo else base
    size = pack([r for r in kept if r.offset >= base], new_base)

    def place(p: Placed) -> Placed:
        if not _mine(p, solo):
            return p
        if p.offset in landed:
            return Placed(record=p.record, holder=LANDED, offset=-1)
        return Placed(record=p.record, holder=p.holder, offset=moved.get(p.offset, p.offset))

    return RankPlan(
        ckpt_id=plan.ckpt_id, checksum=plan.checksum, files=plan.files,
        reads=tuple(Read(shard=r.shard, index=r.index, offset=moved.get(r.offset, r.offset))
                    for r in plan.reads),
        shared=(new_base,) if solo else plan.shared, size=size,
        targets=tuple((t, tuple(place(p) for p in ps)) for t, ps in plan.targets),
        meta=None if plan.meta is None else place(plan.meta), error=plan.error)


def read_planned(plan: RankPlan, buf: np.ndarray, candidates: SourceChoice,
                 into: Mapping[tuple[int, int], np.ndarray] | None = None,
                 ) -> tuple[dict[Tier, int], RestorePhases]:
    """Read and verify the datasets of ``plan`` into ``buf`` (or, for those in ``into``,
    straight into their target tensors), shard by shard.

    Returns:
        The data bytes read from each tier (counted as the reads land), and where the time
        went (read and checksum).

    Raises:
        CorruptCheckpointError: some shard verified on no tier.
    """
    counts: dict[Tier, int] = {}
    phases = RestorePhases()
    by_shard: dict[int, list[tuple[int, np.ndarray]]] = {}
    for r in plan.reads:
        d = plan.files[r.shard].datasets[r.index]
        dest = (into or {}).get((r.shard, r.index))
        by_shard.setdefault(r.shard, []).append(
            (r.index, dest if dest is not None else buf[r.offset:r.offset + d.nbytes]))
    for j, wanted in by_shard.items():
        tier, took = read_first_good(plan.ckpt_id, plan.checksum, j, plan.files[j], wanted,
                                     candidates)
        counts[tier] = counts.get(tier, 0) + sum(int(dest.size) for _, dest in wanted)
        phases = add_phases(phases, took)
    return counts, phases


def _dest(target: Target, leaf: TensorLeaf | None) -> torch.Tensor:
    """The state's own tensor when it has this shape and dtype (filled in place), else new."""
    dtype = torch_dtype(target.dtype)
    if leaf is not None and tuple(leaf.tensor.shape) == target.shape and \
            leaf.tensor.dtype == dtype:
        return leaf.tensor
    return torch.empty(target.shape, dtype=dtype)


def _land_box(landing: HostLanding, dest: torch.Tensor, box: Box, src: torch.Tensor,
              d: DatasetRecord) -> None:
    if (x := intersect(box, (d.offsets, d.lengths))) is not None:
        landing.copy_into(dest[relative(x, box[0])], src[relative(x, d.offsets)])


def as_state_values(tensors: Mapping[str, torch.Tensor],
                    leaves: Mapping[str, TensorLeaf]) -> dict[str, Any]:
    """The restored values a state's ``load_state_dict`` gets: for a DTensor leaf, the DTensor
    itself (its local tensor was filled in place, or is empty); plain tensors as they are."""
    out: dict[str, Any] = dict(tensors)
    for key, leaf in leaves.items():
        if leaf.placement is Placement.CHUNK:
            if key in tensors and tensors[key] is not leaf.tensor:
                landing = HostLanding()
                landing.copy_into(leaf.tensor, tensors[key])
            out[key] = leaf.source
    return out


def build_tensors(plan: RankPlan, own: np.ndarray, shared: Sequence[np.ndarray],
                  leaves: Mapping[str, TensorLeaf], *, landing: HostLanding | None = None,
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's tensors by key (its state's own tensors, filled in place) and meta tree.

    Args:
        own: this rank's buffer (its own reads).
        shared: each node position's shared region (replicated pieces).
        leaves: the current state's leaves (the in-place targets; a device tensor is filled
            from pinned host memory, never through a second device buffer).
        landing: the pinned buffer device targets land through (one per restore when None).
    """
    landing = landing or HostLanding()
    tensors: dict[str, torch.Tensor] = {}
    for target, pieces in plan.targets:
        dest = _dest(target, leaves.get(target.key))
        for p in pieces:
            if p.holder == LANDED:
                continue  # read straight into ``dest``
            buf = own if p.holder < 0 else shared[p.holder]
            d = p.record
            src = _as_tensor(buf[p.offset:p.offset + d.nbytes], d)
            if target.box is not None:
                _land_box(landing, dest, target.box, src, d)
                continue
            if not target.global_shape:
                landing.copy_into(dest, src)
                continue
            a, b = max(target.start, d.row_start), min(target.stop, d.row_stop)
            if a < b:
                landing.copy_into(dest[a - target.start:b - target.start],
                                  src[a - d.row_start:b - d.row_start])
        tensors[target.key] = dest
    meta: dict[str, Any] = {}
    if plan.meta is not None:
        raw = own[plan.meta.offset:plan.meta.offset + plan.meta.record.nbytes]
        try:
            meta = json.loads(raw.tobytes())
        except ValueError as exc:
            raise CorruptCheckpointError(f"meta tree of {plan.ckpt_id} is not JSON") from exc
    return tensors, meta
