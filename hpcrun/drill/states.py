"""Read a committed checkpoint offline, as a given layout would restore it, and compare two.

This is the checkpoint plane's own restore path (manifest verification, per-shard checksums,
the gather plan and reshard rules) run in one process for every rank of a layout: what rank
``r`` of ``M`` ranks would hold after ``ctx.restore``. The exact-resume proof compares the bytes
of every tensor and the meta tree (RNG streams, data cursor) of two runs' final checkpoints.

A comparison may leave out whole *state families*: ``rng`` (the RNG streams every checkpoint
captures) or a top-level key of the state the run saved (``model``, ``optim``, ``data``, or any
name its ``ctx.restore(...)`` registered), whose tensors and meta tree go together.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrun.control.log import RunLog
from hpcrun.errors import ArgumentError, CheckpointError
from hpcrun.vocab import Tier

RNG_FAMILY = "rng"
"""The family of the RNG streams (the meta tree's ``__rng__`` field)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankState:
    """What one rank of a layout holds after restoring a checkpoint."""

    rank: int
    """Rank in the restore layout."""
    tensors: Mapping[str, bytes] = field(default_factory=dict)
    """Logical key → raw bytes of the tensor (dtype and shape are in ``shapes``)."""
    shapes: Mapping[str, str] = field(default_factory=dict)
    """Logical key → ``dtype[shape]``."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The rank's meta tree (non-tensor state, RNG streams, data cursor)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointState:
    """A committed checkpoint restored offline onto ``world_size`` ranks."""

    ckpt_id: str
    """Checkpoint id."""
    step: int
    """Optimizer step it holds."""
    saved_world_size: int
    """World size that wrote it."""
    world_size: int
    """World size it was restored onto."""
    ranks: Sequence[RankState] = ()
    """One entry per restore rank."""

    def __post_init__(self) -> None:
        if len(self.ranks) != self.world_size:
            raise ArgumentError(f"{len(self.ranks)} rank states for world size "
                                f"{self.world_size}; expected one per restore rank")


def committed(run_dir: Path) -> list[Any]:
    """The run's committed checkpoints in commit order (fenced commits only)."""
    from hpcrun.checkpoint import fold_checkpoints

    return fold_checkpoints(RunLog(run_dir).read())


def find_committed(run_dir: Path, ckpt_id: str | None = None) -> Any:
    """A committed checkpoint by id, or the newest; CheckpointError naming what exists."""
    found = committed(run_dir)
    if not found:
        raise CheckpointError(f"run {run_dir.name} has no committed checkpoint; run it until "
                              "its first commit (checkpoint.every_steps) or pick another run")
    if ckpt_id is None:
        return found[-1]
    for ckpt in found:
        if ckpt.ckpt_id == ckpt_id:
            return ckpt
    raise CheckpointError(f"checkpoint {ckpt_id} is not committed in run {run_dir.name}; "
                          f"committed: {', '.join(c.ckpt_id for c in found[-5:])}")


def load_state(run_dir: Path, ckpt: Any, *, world_size: int | None = None) -> CheckpointState:
    """Restore ``ckpt`` offline onto ``world_size`` ranks (default: the layout that wrote it).

    Raises:
        CorruptCheckpointError: the manifest or a shard fails verification.
        ReshardError: the state cannot be placed on that layout.
    """
    from hpcrun.checkpoint.commit import read_manifest
    from hpcrun.checkpoint.restore import assemble, plan_gather, read_assigned
    from hpcrun.checkpoint.tiers import shared_root

    m = read_manifest(run_dir, ckpt)
    size = world_size or m.world_size
    plan = plan_gather(m, size)
    base = shared_root(run_dir) / ckpt.ckpt_id
    bufs = [read_assigned(m, plan, r, lambda j: [(Tier.SHARED, base / m.shards[j].path)])[0]
            for r in range(size)]
    ranks = []
    for r in range(size):
        tensors, meta = assemble(m, plan, bufs, rank=r, world_size=size, rows={})
        ranks.append(RankState(
            rank=r, meta=meta,
            tensors={k: t.contiguous().view(-1).view(_u8()).numpy().tobytes()
                     for k, t in tensors.items()},
            shapes={k: f"{t.dtype}{list(t.shape)}" for k, t in tensors.items()}))
    return CheckpointState(ckpt_id=m.ckpt_id, step=m.step, saved_world_size=m.world_size,
                           world_size=size, ranks=tuple(ranks))


def _u8() -> Any:
    import torch

    return torch.uint8


def tensor_family(key: str) -> str:
    """The family of a tensor's logical key (``optim/state/0/exp_avg`` → ``optim``; pure)."""
    return key.split("/", 1)[0]


def meta_family(key: str) -> str:
    """The family of a top-level meta field (``__rng__`` → ``rng``; pure)."""
    from hpcrun.checkpoint.keys import RNG_FIELD

    return RNG_FAMILY if key == RNG_FIELD else key


def state_families(states: Iterable[CheckpointState]) -> list[str]:
    """Every family the states hold, sorted (pure)."""
    found: set[str] = set()
    for state in states:
        for r in state.ranks:
            found |= {tensor_family(k) for k in r.tensors} | {meta_family(k) for k in r.meta}
    return sorted(found)


def check_families(names: Iterable[str], *states: CheckpointState) -> None:
    """Refuse a family to ignore that none of ``states`` holds (a typo would hide nothing).

    Raises:
        ArgumentError: naming the unknown families and the ones the states hold.
    """
    held = state_families(states)
    unknown = sorted(set(names) - set(held))
    if unknown:
        raise ArgumentError(f"--ignore {', '.join(unknown)}: no such state family in these "
                            f"checkpoints; they hold {', '.join(held) or 'nothing'}")


def diff_states(a: CheckpointState, b: CheckpointState, *,
                ignore: Collection[str] = ()) -> list[str]:
    """Every difference between two restored checkpoints, one line each (pure).

    Tensors are compared byte for byte; meta trees as canonical JSON, top-level field by
    field. Families named in ``ignore`` (``rng``, ``optim``, ...) are left out, tensors and meta
    alike. An empty list means bitwise-identical state (outside the ignored families).
    """
    out = []
    if (a.step, a.world_size) != (b.step, b.world_size):
        out.append(f"step/world size: {a.step}/{a.world_size} vs {b.step}/{b.world_size}")
    for ra, rb in zip(a.ranks, b.ranks, strict=False):
        keys = sorted(k for k in set(ra.tensors) | set(rb.tensors)
                      if tensor_family(k) not in ignore)
        for key in keys:
            if key not in ra.tensors or key not in rb.tensors:
                out.append(f"rank {ra.rank}: tensor {key!r} only in "
                           f"{a.ckpt_id if key in ra.tensors else b.ckpt_id}")
            elif ra.shapes[key] != rb.shapes[key] or ra.tensors[key] != rb.tensors[key]:
                out.append(f"rank {ra.rank}: tensor {key!r} differs "
                           f"({ra.shapes[key]} vs {rb.shapes[key]})")
        out += _meta_diff(ra, rb, ignore)
    return out


def _meta_diff(ra: RankState, rb: RankState, ignore: Collection[str]) -> list[str]:
    out = []
    for key in sorted(set(ra.meta) | set(rb.meta)):
        if meta_family(key) in ignore:
            continue
        ja = json.dumps(ra.meta.get(key), sort_keys=True)
        jb = json.dumps(rb.meta.get(key), sort_keys=True)
        if ja != jb:  # named by its family: the name --ignore takes
            out.append(f"rank {ra.rank}: meta {meta_family(key)!r} differs "
                       f"({ja[:80]} vs {jb[:80]})")
    return out
