"""Drain tier 0 to tier 1 in the node agent's process, and verification by cold reads.

h5py serialises every HDF5 call of a process under one lock, so draining inside the training
process would stall the data loader's HDF5 reads: the node agent drains instead. For every
checkpoint committed on tier 0 and not yet drained by this node it copies the node's shards to
``<run_dir>/ckpt/<ckpt_id>/<node>/``, re-reads the copy past the page cache (O_DIRECT, or
``posix_fadvise(DONTNEED)`` after fsync) and compares it with the source and with the manifest's
checksums, then appends a DRAINED entry. The node-0 agent appends the tier-1 COMMIT once every
node has drained (:func:`finalize_tier1`); :func:`drain_to_tier1` is the one entry that runs a
drain round, copy then commit. Everything here is idempotent: rerunning after a crash
redoes at most the copy that was interrupted.

A node lost before it drained leaves its shards on its partner (``hpcrun.checkpoint.peer``):
before a requeue the partner drains that copy on the lost node's behalf
(:func:`salvage_lost`), so the newest commit becomes whole on tier 1 and the next allocation
restores it rather than an older one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import statistics
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import numpy as np

from hpcrun.checkpoint.commit import commit_entry, read_manifest
from hpcrun.checkpoint.manifest import Manifest, ShardRecord
from hpcrun.checkpoint.pacing import DrainPacer, active_pacer
from hpcrun.checkpoint.peer.ledger import complete_copy, fold_partner_copies, partner_root
from hpcrun.checkpoint.rawio import (
    Extent,
    aligned_buffer,
    drop_cache,
    read_extents,
    read_file_cold,
    write_extents,
)
from hpcrun.checkpoint.shards import checksum, read_shard
from hpcrun.checkpoint.tiers import (
    CommittedCheckpoint,
    Tier,
    fold_checkpoints,
    shared_root,
)
from hpcrun.checkpoint.tiers import (
    node_local_root as local_ckpt_root,
)
from hpcrun.control.entries import DrainedPayload, DrainErrorNote, decode_as
from hpcrun.control.log import EntryKind, LogEntry, RunLog
from hpcrun.errors import (
    CorruptCheckpointError,
    HpcrunError,
    PayloadError,
    StaleGenerationError,
    StorageTimeoutError,
)
from hpcrun.storage import LOCAL_STORAGE, Storage

_log = logging.getLogger(__name__)


def check_shard_image(data: np.ndarray, rec: ShardRecord, algorithm: str, where: Path,
                      ckpt_id: str) -> None:
    """Check a shard image against its manifest record: size and contiguous datasets from
    ``data``, the rest through HDF5 from the file ``where`` (which holds the same bytes).

    Raises:
        CorruptCheckpointError: a size or checksum differs from the manifest's.
    """
    if data.size != rec.bytes:
        raise CorruptCheckpointError(f"{where} is {data.size} bytes, manifest says {rec.bytes}")
    for d in rec.datasets:
        if d.offset >= 0 and checksum(algorithm, data[d.offset:d.offset + d.nbytes]) != d.checksum:
            raise CorruptCheckpointError(f"{where}: dataset {d.key!r} fails its checksum")
    small = replace(rec, datasets=tuple(d for d in rec.datasets if d.offset < 0))
    read_shard(where, small, [np.empty(d.nbytes, dtype=np.uint8) for d in small.datasets],
               ckpt_id=ckpt_id, algorithm=algorithm)


def copy_verified(src: Path, dst: Path, rec: ShardRecord, *, ckpt_id: str, algorithm: str,
                  storage: Storage = LOCAL_STORAGE, pacer: DrainPacer | None = None) -> None:
    """Copy one shard durably and prove the copy by a cold read-back.

    Args:
        pacer: Pace every read and write (default: this process's background pacer, if it
            is the node's drainer; none otherwise, at full speed).

    Raises:
        CorruptCheckpointError: the source or the copy fails verification.
        StorageError: a tier failed.
    """
    pacer = pacer or active_pacer()
    if pacer is None:
        _copy_verified(src, dst, rec, ckpt_id=ckpt_id, algorithm=algorithm, storage=storage,
                       pacer=None)
        return
    pacer.begin()
    try:
        _copy_verified(src, dst, rec, ckpt_id=ckpt_id, algorithm=algorithm, storage=storage,
                       pacer=pacer)
    finally:
        pacer.end()


def _copy_verified(src: Path, dst: Path, rec: ShardRecord, *, ckpt_id: str, algorithm: str,
                   storage: Storage, pacer: DrainPacer | None) -> None:
    data = _read_cold(src, pacer)
    check_shard_image(data, rec, algorithm, src, ckpt_id)
    want = checksum(algorithm, data)
    storage.makedirs(dst.parent)
    # one temporary file per copy: two drainers of one shard (a stale node's retry beside the
    # new incarnation's salvage) never write into, or rename away, each other's file
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(8)}.drain")
    try:
        # the bytes too go through the seam: a hung OST fails the copy at the tier's deadline
        # (retried later) instead of hanging the drain and the end of the incarnation with it
        storage.data("write_data", tmp, lambda: _write(tmp, data, pacer))
        storage.rename(tmp, dst)
    except StorageTimeoutError:
        raise  # a hung tier: the file is debris, gone with its checkpoint's directory
    except BaseException:
        with contextlib.suppress(HpcrunError, OSError):
            storage.remove(tmp)
        raise
    storage.fsync_path(dst.parent)
    back = storage.data("read_data", dst, lambda: _read_cold(dst, pacer))
    if checksum(algorithm, back) != want:
        raise CorruptCheckpointError(f"drained copy {dst} differs from its source {src} when "
                                     "read back past the page cache; check the shared tier")


def _read_cold(path: Path, pacer: DrainPacer | None) -> np.ndarray:
    """The whole file past the page cache; in paced chunks when a pacer is given."""
    if pacer is None:
        return read_file_cold(path)
    size = os.stat(path).st_size
    buf = aligned_buffer(size, touch=False)
    for off in range(0, size, pacer.policy.chunk):
        view = buf.data[off:off + pacer.policy.chunk]
        read_extents(path, [Extent(file_offset=off, buffer=view)], threads=1)
        _drop_cached(path)  # what a filesystem without O_DIRECT cached on the way
        pacer.pace(len(view))
    return buf


def _write(path: Path, data: np.ndarray, pacer: DrainPacer | None) -> None:
    """Write ``data`` into a new file ``path`` durably; paced chunks leave nothing in the page
    cache."""
    path.touch()
    if pacer is None:
        write_extents(path, [Extent(file_offset=0, buffer=data.data)], allocate=data.size)
        return
    for off in range(0, data.size, pacer.policy.chunk):
        view = data.data[off:off + pacer.policy.chunk]
        write_extents(path, [Extent(file_offset=off, buffer=view)], threads=1)
        _drop_cached(path)  # pages a non-O_DIRECT filesystem cached (clean after the fsync)
        pacer.pace(len(view))


def _drop_cached(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cache(fd)
    finally:
        os.close(fd)


def _drain_one(run_dir: Path, local_root: Path, ckpt: CommittedCheckpoint, node: str,
               run_id: str | None, storage: Storage) -> int | None:
    """Copy this node's shards of ``ckpt``; the bytes copied (None: no complete copy here)."""
    m = read_manifest(run_dir, ckpt, storage=storage)
    return _copy_owned(run_dir, local_ckpt_root(local_root, run_id or m.run_id) / ckpt.ckpt_id,
                       m, owner=node, storage=storage)


def _copy_owned(run_dir: Path, src_dir: Path, m: Manifest, *, owner: str,
                storage: Storage) -> int | None:
    """Copy ``owner``'s shards of ``m`` from ``src_dir`` (laid out as the checkpoint directory:
    ``<node>/rank-NNNNN.h5``) to tier 1, verified; the bytes copied (None: ``src_dir`` holds no
    complete copy of them)."""
    mine = [s for s in m.shards if s.node == owner]
    if not mine or not all((src_dir / s.path).exists() for s in mine):
        return None  # no complete copy here (lost, retired, or never written here)
    for s in mine:
        copy_verified(src_dir / s.path, shared_root(run_dir) / m.ckpt_id / s.path, s,
                      ckpt_id=m.ckpt_id, algorithm=m.checksum, storage=storage)
    return sum(s.bytes for s in mine)


def newest_undrained(committed: list[CommittedCheckpoint]) -> CommittedCheckpoint | None:
    """The newest tier-0 checkpoint newer than the newest one on tier 1 (pure): the one a final
    drain makes whole on tier 1; None when tier 1 is up to date."""
    floor = max((c.slot for c in committed if Tier.SHARED in c.tiers), default=-1)
    local = [c for c in committed if Tier.NODE_LOCAL in c.tiers and c.slot > floor]
    return local[-1] if local else None


def salvageable(entries: list[LogEntry], *, node: str, lost: Collection[str]
                ) -> tuple[CommittedCheckpoint | None, list[str]]:
    """The newest checkpoint not yet on tier 1 and the ``lost`` nodes whose shards of it this
    node holds a complete partner copy of, not drained yet (pure)."""
    newest = newest_undrained(fold_checkpoints(entries))
    if newest is None:
        return None, []
    copies = fold_partner_copies(entries)
    owners = [o for o in sorted(set(lost)) if o in newest.nodes and o not in newest.drained
              and complete_copy(copies, newest.ckpt_id, o, holders=(node,)) is not None]
    return newest, owners


def salvage_lost(run_dir: Path, node_local_root: Path, *, node: str, lost: Collection[str],
                 log: RunLog, generation: int, holder: str,
                 storage: Storage = LOCAL_STORAGE) -> list[str]:
    """Drain the partner copies this node holds of ``lost`` nodes' shards of the newest
    checkpoint not yet on tier 1, each verified as the owner's own drain would be, with a
    DRAINED entry on the owner's behalf: the checkpoint becomes whole on tier 1 although its
    tier-0 copy died with its node.

    Returns:
        The owners whose shards were drained by this call.

    Raises:
        StaleGenerationError: a newer generation fenced this agent out.
    """
    newest, owners = salvageable(log.read(), node=node, lost=lost)
    if newest is None or not owners:
        return []
    m = read_manifest(run_dir, newest, storage=storage)
    src = partner_root(node_local_root, m.run_id or Path(run_dir).name) / newest.ckpt_id
    done = []
    for owner in owners:
        t0 = time.monotonic()
        try:
            copied = _copy_owned(Path(run_dir), src, m, owner=owner, storage=storage)
        except HpcrunError as exc:
            log.append_entry(DrainErrorNote(node=node, step=newest.step, ckpt_id=newest.ckpt_id,
                                            detail=f"salvage of {owner}'s copy: {exc}"[:2000]),
                             generation=generation, holder=holder)
            continue
        if copied is None:
            continue
        log.publish_entry(DrainedPayload(ckpt_id=newest.ckpt_id, node=owner, bytes=copied,
                                         seconds=time.monotonic() - t0),
                          generation=generation, holder=holder)
        done.append(owner)
    return done


DRAIN_RATE_PRIOR = 100e6
"""Bytes per second a drain is assumed to move before the run measured one (a busy shared
filesystem's share per node)."""


def drain_rate(entries: Iterable[LogEntry], *, newest: int = 8) -> float:
    """The run's measured drain rate (pure): the median bytes per second of its ``newest``
    DRAINED entries that carry a measurement, else :data:`DRAIN_RATE_PRIOR`."""
    rates = []
    for e in entries:
        if e.kind != EntryKind.DRAINED:
            continue
        try:
            p = decode_as(e, DrainedPayload)
        except PayloadError:  # untrusted: a malformed entry measures nothing
            continue
        if p.bytes > 0 and p.seconds > 0:
            rates.append(p.bytes / p.seconds)
    return statistics.median(rates[-newest:]) if rates else DRAIN_RATE_PRIOR


def drain_wait_s(remaining_bytes: int, rate_bps: float, *, cap_s: float,
                 floor_s: float = 10.0, slack: float = 2.0) -> float:
    """How long a final drain keeps trying (pure): ``slack`` times the remaining bytes at the
    measured rate (a retry after a failed copy included), at least ``floor_s``, at most
    ``cap_s`` (the time left: a preemption's grace)."""
    need = slack * remaining_bytes / max(rate_bps, 1.0)
    return max(0.0, min(cap_s, max(floor_s, need)))


def pending_bytes(committed: list[CommittedCheckpoint], node: str | None = None) -> int:
    """Bytes still to copy before the newest tier-0 checkpoint is whole on tier 1 (pure): its
    shards on the nodes that have not drained it (``node``: that node's share alone); 0 when
    it is on tier 1 already."""
    newest = newest_undrained(committed)
    if newest is None:
        return 0
    left = [n for n in newest.nodes if n not in newest.drained and node in (None, n)]
    return newest.bytes * len(left) // max(1, len(newest.nodes))


def pending_drains(committed: list[CommittedCheckpoint], node: str) -> list[CommittedCheckpoint]:
    """Checkpoints this node could drain now, in the order to try them (pure).

    Only checkpoints newer than the newest one on tier 1 count (an older one is superseded).
    Among them, the newest that another node has already drained comes first: finishing it
    gives tier 1 a complete checkpoint, whereas always jumping to the newest starves tier 1
    when checkpoints commit faster than a drain round (each node would hold a different one).
    The newest tier-0 checkpoint follows, for when this node has no copy of the first (lost,
    or retired by retention). :func:`drain_pending` drains the first that succeeds.
    """
    shared = [c.slot for c in committed if Tier.SHARED in c.tiers]
    floor = max(shared, default=-1)
    todo = [c for c in committed if Tier.NODE_LOCAL in c.tiers and c.slot > floor
            and node in c.nodes and node not in c.drained]
    if not todo:
        return []
    partial = [c for c in todo if c.drained]
    first = partial[-1] if partial else todo[-1]
    return [first] if first is todo[-1] else [first, todo[-1]]


def drain_pending(run_dir: Path, node_local_root: Path, *, node: str, log: RunLog,
                  generation: int, holder: str, run_id: str | None = None, limit: int | None = 1,
                  storage: Storage = LOCAL_STORAGE) -> list[str]:
    """Drain this node's shards of committed, undrained checkpoints to tier 1.

    Tries :func:`pending_drains`'s candidates in order and stops after ``limit`` drained (a
    background round drains one, so it sees the log afresh; the last round of an incarnation
    passes None, to leave the newest checkpoint on tier 1 as well).

    Returns:
        IDs drained by this call (a DRAINED entry appended for each).

    Raises:
        StaleGenerationError: a newer generation fenced this agent out.
    """
    done: list[str] = []
    for ckpt in pending_drains(fold_checkpoints(log.read()), node):
        if limit is not None and len(done) >= limit:
            break
        t0 = time.monotonic()
        try:
            copied = _drain_one(Path(run_dir), Path(node_local_root), ckpt, node, run_id,
                                storage)
            if copied is None:
                continue
        except HpcrunError as exc:
            _log.warning("drain of %s on %s failed: %s", ckpt.ckpt_id, node, exc)
            # A background incident, not a gang fault: training goes on, the drain is retried
            # next round, and the tier-1 RPO exposure grows until it succeeds.
            log.append_entry(DrainErrorNote(node=node, step=ckpt.step, ckpt_id=ckpt.ckpt_id,
                                            detail=str(exc)[:2000]),
                             generation=generation, holder=holder)
            continue
        log.publish_entry(DrainedPayload(ckpt_id=ckpt.ckpt_id, node=node, bytes=copied,
                                         seconds=time.monotonic() - t0),
                          generation=generation, holder=holder)
        done.append(ckpt.ckpt_id)
    return done


def finalize_tier1(run_dir: Path, *, log: RunLog, generation: int, holder: str) -> list[str]:
    """Node-0 agent: commit on tier 1 every checkpoint that every node has drained.

    A checkpoint's own node list (from its COMMIT entry) decides coverage, so checkpoints of an
    earlier, differently sized incarnation also finalize.
    """
    out = []
    for c in finalizable(fold_checkpoints(log.read())):
        # the same entry as the tier-0 commit, on tier 1 (the run directory is named by the
        # run id, for checkpoints committed before commits carried it)
        log.publish_entry(commit_entry(
            run_id=c.run_id or Path(run_dir).name, ckpt_id=c.ckpt_id,
            generation=c.generation, step=c.step, tier=Tier.SHARED, digest=c.digest,
            total_bytes=c.bytes, nodes=c.nodes), generation=generation, holder=holder)
        out.append(c.ckpt_id)
    return out


class DrainRound(StrEnum):
    """Which drain :func:`drain_to_tier1` runs."""

    BACKGROUND = "background"
    """The drainer's round: one checkpoint copied, then the tier-1 commit; a failure is noted."""
    FINAL = "final"
    """An incarnation's last round (and the supervisor's tier-1 wait): every pending
    checkpoint copied, then the tier-1 commit; a failure is noted."""
    COMMIT_ONLY = "commit_only"
    """A new incarnation's start: nothing copied, the tier-1 commit of what every node drained
    before the last incarnation ended; a failure raises (the start fails with it)."""


class DrainScope(Protocol):
    """One node's drain under a fencing token (the node agent's ``DrainTarget`` is one)."""

    @property
    def run_dir(self) -> Path: ...
    @property
    def node(self) -> str: ...
    @property
    def node_local_root(self) -> Path: ...
    @property
    def generation(self) -> int: ...
    @property
    def holder(self) -> str: ...
    @property
    def supervisor(self) -> bool:
        """Whether this node appends the tier-1 commits."""
    def storage(self, log: RunLog) -> Storage:
        """The shared tier as this drain writes it."""


def drain_to_tier1(scope: DrainScope, log: RunLog,
                   kind: DrainRound = DrainRound.BACKGROUND,
                   lost: Collection[str] = ()) -> list[str]:
    """Drain a node's tier-0 checkpoints to tier 1: the one entry of a drain, so the walk from
    a tier-0 COMMIT to the tier-1 COMMIT stays in this module until it returns.

    1. **Copy.** This node's shards of the checkpoints it can drain (:func:`pending_drains`)
       are copied and verified by cold reads, a DRAINED entry each (:func:`drain_pending`):
       one checkpoint in a background round, so the next round sees the log afresh; every
       pending one in the final round. None at a commit-only start.
       In a final round before a requeue that lost nodes (``lost``), the partner copies this
       node holds of their shards of the newest checkpoint follow (:func:`salvage_lost`).
    2. **Commit.** On the supervising node, every checkpoint each of its nodes has drained is
       committed on tier 1 (:func:`finalize_tier1`).
    3. **A failure** of a background or final round is a background incident: a
       ``drain_error`` note, training goes on, the next round retries, and the tier-1 RPO
       exposure grows until it succeeds.

    Returns:
        The checkpoint ids committed on tier 1 by this call.

    Raises:
        StaleGenerationError: a newer generation fenced this node out.
    """
    if kind is DrainRound.COMMIT_ONLY:
        return _commit_tier1(scope, log)
    try:
        drain_pending(scope.run_dir, scope.node_local_root, node=scope.node, log=log,
                      generation=scope.generation, holder=scope.holder,
                      limit=None if kind is DrainRound.FINAL else 1,
                      storage=scope.storage(log))
        if lost and kind is DrainRound.FINAL:
            salvage_lost(scope.run_dir, scope.node_local_root, node=scope.node, lost=lost,
                         log=log, generation=scope.generation, holder=scope.holder,
                         storage=scope.storage(log))
        return _commit_tier1(scope, log)
    except StaleGenerationError:
        raise
    except (HpcrunError, OSError) as exc:
        log.append_entry(DrainErrorNote(node=scope.node,
                                        detail=f"drain to the shared tier failed, will retry: "
                                               f"{exc}"),
                         generation=scope.generation, holder=scope.holder)
        return []


def _commit_tier1(scope: DrainScope, log: RunLog) -> list[str]:
    if not scope.supervisor:
        return []
    return finalize_tier1(scope.run_dir, log=log, generation=scope.generation,
                          holder=scope.holder)


def finalizable(committed: list[CommittedCheckpoint]) -> list[CommittedCheckpoint]:
    """Checkpoints to commit on tier 1 now, in commit order (pure): drained by every node that
    holds a shard, and newer than the newest checkpoint already on tier 1.

    An older one is superseded, as in :func:`pending_drains`: a node whose last round began
    before the newer checkpoint reached tier 1 may still finish draining it, and committing it
    then would put a stale checkpoint after the newest one in the tier-1 history.
    """
    floor = max((c.slot for c in committed if Tier.SHARED in c.tiers), default=-1)
    return [c for c in committed if Tier.NODE_LOCAL in c.tiers and Tier.SHARED not in c.tiers
            and c.slot > floor and set(c.nodes) <= c.drained]


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyResult:
    """Outcome of re-reading one checkpoint."""

    ckpt_id: str
    """Checkpoint checked."""
    tier: Tier
    """Tier read."""
    problems: tuple[str, ...]
    """What failed (empty when everything verified)."""
    bytes_read: int
    """Shard bytes read and checked."""

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_checkpoint(run_dir: Path, ckpt: CommittedCheckpoint, *,
                      local: tuple[Path, str] | None = None,
                      progress: Callable[[int], None] = lambda n: None,
                      storage: Storage = LOCAL_STORAGE) -> VerifyResult:
    """Re-read a committed checkpoint's manifest and every shard past the page cache.

    Args:
        local: ``(node_local_root, node)`` to check this node's tier-0 copies instead of tier 1.
        progress: called with the bytes of each shard once it is checked.
    """
    tier = Tier.NODE_LOCAL if local else Tier.SHARED
    try:
        m = read_manifest(run_dir, ckpt, storage=storage)
    except HpcrunError as exc:
        return VerifyResult(ckpt_id=ckpt.ckpt_id, tier=tier, problems=(str(exc),), bytes_read=0)
    root = shared_root(run_dir) / ckpt.ckpt_id
    shards = m.shards
    if local is not None:
        root = local_ckpt_root(local[0], m.run_id) / ckpt.ckpt_id
        shards = tuple(s for s in shards if s.node == local[1])
    problems, total = [], 0
    for s in shards:
        dest = [np.empty(d.nbytes, dtype=np.uint8) for d in s.datasets]
        try:
            read_shard(root / s.path, s, dest, ckpt_id=m.ckpt_id, algorithm=m.checksum)
            total += s.bytes
        except HpcrunError as exc:
            problems.append(str(exc))
        progress(s.bytes)
    return VerifyResult(ckpt_id=ckpt.ckpt_id, tier=tier, problems=tuple(problems),
                        bytes_read=total)
