"""DTensor chunks: a sharded tensor as N-D boxes of its global shape, and the box arithmetic.

A DTensor (FSDP2 ``fully_shard``, tensor parallel, HSDP) holds on each rank one box of the
global tensor: its offsets and lengths in every dimension, which DTensor computes itself for
any mesh and placements (``Shard(d)`` on any dim, ``Replicate``, the ``_StridedShard`` of
FSDP2 + TP, uneven splits): :func:`local_box` asks it, it reimplements no placement math.

Ranks that differ only along ``Replicate`` mesh dims hold the same box; exactly one of them
writes it (:func:`is_writer`), chosen per box and tensor so the copies spread over the replicas
(and so over nodes). A restore onto another mesh intersects the boxes it needs with the boxes
written (:func:`intersect`, :func:`covered`, pure).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hpcrun.errors import CheckpointError

Box = tuple[tuple[int, ...], tuple[int, ...]]
"""``(offsets, lengths)`` of an N-D box in a global tensor."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalBox:
    """One rank's box of a DTensor."""

    local: torch.Tensor
    """The rank's local tensor (``to_local()``), the box's values."""
    global_shape: tuple[int, ...]
    """Shape of the whole tensor."""
    offsets: tuple[int, ...]
    """Global offset of the box in every dimension."""
    placements: tuple[str, ...]
    """The placements on the mesh, as text."""
    writer: bool
    """Whether this rank writes the box (one replica of it does; never an empty box)."""


def volume(lengths: Sequence[int]) -> int:
    """Elements in a box (1 for a 0-d tensor)."""
    return math.prod(lengths)


def intersect(a: Box, b: Box) -> Box | None:
    """The box both ``a`` and ``b`` cover, or None when they do not overlap (pure)."""
    offs, lens = [], []
    for ao, al, bo, bl in zip(a[0], a[1], b[0], b[1], strict=True):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return None
        offs.append(lo)
        lens.append(hi - lo)
    return tuple(offs), tuple(lens)


def covered(target: Box, boxes: Sequence[Box]) -> int:
    """Elements of ``target`` the (pairwise disjoint) ``boxes`` cover (pure)."""
    return sum(volume(x[1]) for b in boxes if (x := intersect(target, b)) is not None)


def relative(box: Box, origin: Sequence[int]) -> tuple[slice, ...]:
    """Index of ``box`` inside a tensor whose element 0 is at global ``origin`` (pure)."""
    return tuple(slice(o - z, o - z + n) for o, n, z in zip(box[0], box[1], origin, strict=True))


def is_writer(coordinate: Sequence[int], mesh_shape: Sequence[int],
              replicate_dims: Sequence[int], key: str) -> bool:
    """Whether the rank at ``coordinate`` writes its box (pure).

    The replicas of a box are the ranks that differ only along ``replicate_dims``; the one
    whose index among them is ``(box ordinal + crc32(key)) mod replicas`` writes it, so
    neighbouring boxes and different tensors fall to different replicas.
    """
    rep_index, replicas, ordinal = 0, 1, 0
    for dim, (c, n) in enumerate(zip(coordinate, mesh_shape, strict=True)):
        if dim in replicate_dims:
            rep_index, replicas = rep_index * n + c, replicas * n
        else:
            ordinal = ordinal * n + c
    return rep_index == (ordinal + zlib.crc32(key.encode())) % replicas


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed support
        return None
    return DTensor


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor."""
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(value, dtensor)


def dtensor_box(dt: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local shape and global offset of DTensor ``dt``'s local part, as DTensor itself
    reports them to DCP (its public ``__create_chunk_list__``: one chunk per DTensor)."""
    [chunk] = dt.__create_chunk_list__()
    return tuple(int(n) for n in chunk.sizes), tuple(int(n) for n in chunk.offsets)


def local_box(value: torch.Tensor, path: str) -> LocalBox:
    """This rank's box of the DTensor ``value`` at state path ``path``.

    Raises:
        CheckpointError: ``value`` is another tensor subclass, holds a ``Partial`` placement,
            lives on a mesh without this rank, or its local tensor is not one box.
    """
    if not is_dtensor(value):
        raise CheckpointError(
            f"cannot checkpoint {path!r}: a {type(value).__name__} is a tensor subclass hpcrun "
            "does not know; return a plain tensor, a DTensor, RowShard or RankLocal for it "
            "from state_dict()")
    dt: Any = value  # a DTensor: mesh, placements and local part are its own attributes
    mesh, placements = dt.device_mesh, tuple(dt.placements)
    if any(p.is_partial() for p in placements):
        raise CheckpointError(
            f"cannot checkpoint {path!r}: the DTensor has a Partial placement (a pending "
            "reduction); redistribute it to Shard or Replicate before it is saved")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise CheckpointError(f"cannot checkpoint {path!r}: this rank is not on the DTensor's "
                              f"mesh {mesh}; register only state this rank holds")
    shape, offsets = dtensor_box(dt)
    local = dt.to_local()
    if tuple(local.shape) != tuple(shape):
        raise CheckpointError(
            f"cannot checkpoint {path!r}: its local tensor {list(local.shape)} is not one box "
            f"of {list(value.shape)} under {list(map(str, placements))}; use Shard/Replicate "
            "placements whose local part is contiguous in the global tensor")
    coords, sizes, rep = _replica_space(mesh, placements)
    return LocalBox(local=local, global_shape=tuple(value.shape), offsets=tuple(offsets),
                    placements=tuple(str(p) for p in placements),
                    writer=volume(shape) > 0 and is_writer(coords, sizes, rep, path))


def _replica_space(mesh: Any, placements: Sequence[Any],
                   ) -> tuple[list[int], tuple[int, ...], list[int]]:
    """(coordinate, mesh shape, replicate dims) in which a box's replicas are counted.

    A DTensor on a submesh (FSDP2's ``dp`` of a ``(dp, tp)`` mesh) has copies along the root
    mesh's other dims: those count as replicate dims too, so one copy writes. A submesh
    without dim names is taken alone (its copies each write; restore reads one)."""
    rep = [i for i, p in enumerate(placements) if p.is_replicate()]
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    names, root_names = mesh.mesh_dim_names, root.mesh_dim_names
    if root is mesh or not names or not root_names or not set(names) <= set(root_names):
        return list(mesh.get_coordinate()), tuple(mesh.shape), rep
    mine = {root_names.index(n): i for i, n in enumerate(names)}
    rep_root = [d for d in range(root.ndim) if d not in mine or mine[d] in rep]
    return list(root.get_coordinate()), tuple(root.shape), rep_root


__all__ = ["Box", "LocalBox", "covered", "intersect", "is_dtensor", "is_writer", "local_box",
           "relative", "volume"]
