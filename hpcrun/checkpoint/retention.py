"""Retention and garbage collection: which checkpoint directories may go (pure), and removing them.

Rules (:func:`select_shared_victims`, :func:`select_local_victims`, :func:`select_debris`):

- only committed checkpoints count; the newest ``keep_last`` (K ≥ 2) committed are kept, the
  newest committed one is never deleted whatever K says, nor the newest committed on tier 1,
  nor on the shared tier anything newer than that (it may still be draining there);
- the checkpoint in flight is never a victim and never counts towards K: it reserves its own slot,
  so a save that fails cannot leave fewer than K good checkpoints behind;
- a tier-0 copy is deleted only once tier 1 holds that checkpoint committed, or a newer one;
- uncommitted directories are staging debris, removed only when older than a bound (a save in
  progress elsewhere is younger), at most ``max_victims`` per pass;
- the newest *known-good* checkpoint (a replica agreement check at or after its step passed: a
  ``known_good`` note) is kept besides the newest K, whatever K says: silent data corruption
  can damage every newer one.

Known-good and rollback (:func:`known_good`, :func:`restorable`): after a FAULT ``sdc`` the
checkpoints committed before it that were not known-good by then are distrusted: a restore
skips them and rolls back to the newest known-good one (or starts fresh when there is none).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
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
from hpcrun.control.entries import (
    EntryKind,
    FaultPayload,
    KnownGoodNote,
    LogEntry,
    PayloadError,
    decode,
)
from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import FaultClass


def _sdc_entries(entries: Iterable[LogEntry]) -> Iterator[tuple[LogEntry, object]]:
    """Counted ``known_good`` notes and ``sdc`` faults, decoded, in slot order."""
    _, valid = fold_fences(entries)
    for e in valid:
        if e.kind not in (EntryKind.NOTE, EntryKind.FAULT):
            continue
        try:
            p = decode(e)
        except PayloadError:
            continue
        if isinstance(p, KnownGoodNote) or (isinstance(p, FaultPayload) and not p.background
                                            and p.fault == FaultClass.SDC):
            yield e, p


def known_good(entries: Iterable[LogEntry]) -> list[str]:
    """Checkpoint IDs marked known-good, in the order they were marked (pure)."""
    return [p.ckpt_id for _, p in _sdc_entries(entries) if isinstance(p, KnownGoodNote)]


def distrusted(entries: Sequence[LogEntry]) -> set[str]:
    """Checkpoints an ``sdc`` fault distrusts: committed before it and not known-good by then
    (pure)."""
    committed = fold_checkpoints(entries)
    good: set[str] = set()
    out: set[str] = set()
    for e, p in _sdc_entries(entries):
        if isinstance(p, KnownGoodNote):
            good.add(p.ckpt_id)
        else:
            out |= {c.ckpt_id for c in committed if c.slot < e.slot and c.ckpt_id not in good}
    return out


def restorable(entries: Sequence[LogEntry]) -> list[CommittedCheckpoint]:
    """Committed checkpoints a restore may use, in commit order: all of them, less those an
    ``sdc`` fault distrusts (so the restore rolls back to the newest known-good one) (pure)."""
    bad = distrusted(entries)
    return [c for c in fold_checkpoints(entries) if c.ckpt_id not in bad]


def newest_known_good(committed: Sequence[CommittedCheckpoint],
                      good: Collection[str]) -> str | None:
    """The newest committed checkpoint among ``good`` (pure)."""
    return next((c.ckpt_id for c in reversed(committed) if c.ckpt_id in good), None)


def _kept(committed: Sequence[CommittedCheckpoint], keep_last: int,
          known_good_ids: Collection[str] = ()) -> set[str]:
    if keep_last < 1:
        raise CheckpointError(f"keep_last is {keep_last}; it must be at least 2")
    newest_good = newest_known_good(committed, known_good_ids)
    return {c.ckpt_id for c in committed[-keep_last:]} | ({newest_good} if newest_good else set())


def select_shared_victims(committed: Sequence[CommittedCheckpoint], *, keep_last: int,
                          in_flight: Collection[str] = (),
                          known_good: Collection[str] = ()) -> list[str]:
    """Committed checkpoints (in commit order) to delete from the shared tier.

    Only checkpoints older than the newest one committed on tier 1 may go: that one is the run's
    durable restore point, and a newer one may still be draining into this tier (deleting its
    directory would leave its coming tier-1 commit without files). The newest of
    ``known_good`` stays too.
    """
    kept = _kept(committed, keep_last, known_good)
    shared_idx = [i for i, c in enumerate(committed) if Tier.SHARED in c.tiers]
    newest_shared = shared_idx[-1] if shared_idx else -1
    return [c.ckpt_id for i, c in enumerate(committed)
            if i < newest_shared and c.ckpt_id not in kept and c.ckpt_id not in in_flight]


def select_local_victims(committed: Sequence[CommittedCheckpoint], present: Collection[str], *,
                         keep_last: int, in_flight: Collection[str] = (),
                         known_good: Collection[str] = ()) -> list[str]:
    """Tier-0 copies to delete: old, not in flight, not the newest of ``known_good``, and
    durable on tier 1 (it or a newer one)."""
    kept = _kept(committed, keep_last, known_good)
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
            storage: Storage = LOCAL_STORAGE, dry_run: bool = False,
            known_good: Collection[str] = ()) -> GcReport:
    """Apply retention and debris GC to one tier's checkpoint root."""
    present = _present(root, storage)
    ids = {c.ckpt_id for c in committed}
    if tier is Tier.SHARED:
        retired = select_shared_victims(committed, keep_last=keep_last, in_flight=in_flight,
                                        known_good=known_good)
    else:
        retired = select_local_victims(committed, present, keep_last=keep_last,
                                       in_flight=in_flight, known_good=known_good)
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
    entries = log.read()
    committed = fold_checkpoints(entries)
    good = known_good(entries)
    if local is None:
        return collect(shared_root(run_dir), committed, tier=Tier.SHARED, keep_last=keep_last,
                       now=now, older_than=older_than, in_flight=in_flight, storage=storage,
                       dry_run=dry_run, known_good=good)
    return collect(node_local_root(*local), committed, tier=Tier.NODE_LOCAL, keep_last=keep_last,
                   now=now, older_than=older_than, in_flight=in_flight, storage=storage,
                   dry_run=dry_run, known_good=good)
