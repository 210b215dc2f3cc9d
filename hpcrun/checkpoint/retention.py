"""Retention and garbage collection: which checkpoint directories may go (pure), and removing them.

Rules (:func:`select_shared_victims`, :func:`select_local_victims`, :func:`select_debris`):

- only committed checkpoints count; the newest ``keep_last`` (K ≥ 2) committed are kept, the
  newest committed one is never deleted whatever K says, nor the newest committed on tier 1,
  nor on the shared tier anything newer than that (it may still be draining there);
- the checkpoint in flight is never a victim and never counts towards K: it reserves its own slot,
  so a save that fails cannot leave fewer than K good checkpoints behind;
- a tier-0 copy is deleted only once tier 1 holds that checkpoint committed, or a newer one;
- uncommitted directories are staging debris, removed only when older than a bound (a save in
  progress elsewhere is younger), at most ``max_victims`` per pass.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.checkpoint.tiers import (
    CommittedCheckpoint,
    Tier,
    check_id,
    fold_checkpoints,
    node_local_root,
    shared_root,
)
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError
from hpcrun.storage import LOCAL_STORAGE, Storage


def _kept(committed: Sequence[CommittedCheckpoint], keep_last: int) -> set[str]:
    if keep_last < 1:
        raise CheckpointError(f"keep_last is {keep_last}; it must be at least 2")
    return {c.ckpt_id for c in committed[-keep_last:]}


def select_shared_victims(committed: Sequence[CommittedCheckpoint], *, keep_last: int,
                          in_flight: Collection[str] = ()) -> list[str]:
    """Committed checkpoints (in commit order) to delete from the shared tier.

    Only checkpoints older than the newest one committed on tier 1 may go: that one is the run's
    durable restore point, and a newer one may still be draining into this tier (deleting its
    directory would leave its coming tier-1 commit without files).
    """
    kept = _kept(committed, keep_last)
    shared_idx = [i for i, c in enumerate(committed) if Tier.SHARED in c.tiers]
    newest_shared = shared_idx[-1] if shared_idx else -1
    return [c.ckpt_id for i, c in enumerate(committed)
            if i < newest_shared and c.ckpt_id not in kept and c.ckpt_id not in in_flight]


def select_local_victims(committed: Sequence[CommittedCheckpoint], present: Collection[str], *,
                         keep_last: int, in_flight: Collection[str] = ()) -> list[str]:
    """Tier-0 copies to delete: old, not in flight, and durable on tier 1 (it or a newer one)."""
    kept = _kept(committed, keep_last)
    shared_idx = [i for i, c in enumerate(committed) if Tier.SHARED in c.tiers]
    newest_shared = shared_idx[-1] if shared_idx else -1
    return [c.ckpt_id for i, c in enumerate(committed)
            if c.ckpt_id in present and c.ckpt_id not in kept and c.ckpt_id not in in_flight
            and i <= newest_shared]


def select_debris(present: Mapping[str, float], committed: Collection[str], *, now: float,
                  older_than: float, in_flight: Collection[str] = (),
                  max_victims: int = 64) -> list[str]:
    """Uncommitted directories (name → mtime) old enough to be abandoned staging debris."""
    old = sorted((mtime, name) for name, mtime in present.items()
                 if name not in committed and name not in in_flight and now - mtime > older_than)
    return [name for _, name in old[:max_victims]]


@dataclass(frozen=True, kw_only=True, slots=True)
class GcReport:
    """What a GC pass removed (or would remove, on a dry run)."""

    retired: tuple[str, ...]
    """Committed checkpoints beyond keep_last removed from the tier."""
    debris: tuple[str, ...]
    """Uncommitted directories removed."""
    root: str
    """Directory that was collected."""


def _present(root: Path, storage: Storage) -> dict[str, float]:
    out = {}
    for name in storage.listdir(root):
        try:
            out[check_id(name)] = os.stat(root / name).st_mtime
        except (CheckpointError, OSError):
            continue  # not ours, or gone meanwhile
    return out


def collect(root: Path, committed: Sequence[CommittedCheckpoint], *, tier: Tier, keep_last: int,
            now: float, older_than: float, in_flight: Collection[str] = (),
            storage: Storage = LOCAL_STORAGE, dry_run: bool = False) -> GcReport:
    """Apply retention and debris GC to one tier's checkpoint root."""
    present = _present(root, storage)
    ids = {c.ckpt_id for c in committed}
    if tier is Tier.SHARED:
        retired = select_shared_victims(committed, keep_last=keep_last, in_flight=in_flight)
    else:
        retired = select_local_victims(committed, present, keep_last=keep_last,
                                       in_flight=in_flight)
    retired = [c for c in retired if c in present]
    debris = select_debris(present, ids, now=now, older_than=older_than, in_flight=in_flight)
    if not dry_run:
        for name in (*retired, *debris):
            storage.rmtree(root / name)
    return GcReport(retired=tuple(retired), debris=tuple(debris), root=str(root))


def collect_run(run_dir: Path, *, log: RunLog, keep_last: int, now: float,
                older_than: float = 3600.0, in_flight: Collection[str] = (),
                local: tuple[Path, str] | None = None, storage: Storage = LOCAL_STORAGE,
                dry_run: bool = False) -> GcReport:
    """GC a run's shared tier, or with ``local=(node_local_root, run_id)`` this node's tier 0."""
    committed = fold_checkpoints(log.read())
    if local is None:
        return collect(shared_root(run_dir), committed, tier=Tier.SHARED, keep_last=keep_last,
                       now=now, older_than=older_than, in_flight=in_flight, storage=storage,
                       dry_run=dry_run)
    return collect(node_local_root(*local), committed, tier=Tier.NODE_LOCAL, keep_last=keep_last,
                   now=now, older_than=older_than, in_flight=in_flight, storage=storage,
                   dry_run=dry_run)
