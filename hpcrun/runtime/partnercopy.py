"""Partner copies over the network between agents: push and fetch.

Node-local disks are private to their node, so a copy travels between agents: each agent of a
run with hot spares runs a partner server (:mod:`hpcrun.runtime.partnerserver`), and these are
its clients, signing every request with the run's secret.

- **push** (:func:`push_round`, called by the node's drainer after each drain round, so it runs
  at the drain's lowest priority and paced like a drain): the newest tier-0 checkpoint holding
  this node's shards, unless the partner already holds it, is sent shard by shard to the ring
  partner (:func:`~hpcrun.checkpoint.partner.ring_partner`); the partner verifies every shard
  against the manifest's checksums before it keeps it (and keeps the newest
  :data:`~hpcrun.checkpoint.partner.KEEP_PARTNER_COPIES` per owner), then the pusher publishes
  a ``partner_copy`` note under its fence (complete, or not and why).
- **fetch** (:func:`fetch_for_restore`, called by a gang node's agent before its ranks start):
  when this node took a lost node's position, the lost node's shards of the newest checkpoint
  are fetched from the node holding a complete copy into this node's tier 0, where the restore
  reads them at node-local speed; a ``partner_fetch`` note records it. Without a complete copy
  nothing is fetched and the restore uses tier 1 as before.

Paths in requests are validated (:func:`~hpcrun.checkpoint.partner.check_relpath`), sizes
must equal the manifest's, and every byte received (pushed or fetched) is checked against the
manifest before it is renamed into place.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.drain import check_shard_image
from hpcrun.checkpoint.manifest import ShardRecord
from hpcrun.checkpoint.pacing import active_pacer
from hpcrun.checkpoint.partner import (
    FetchStep,
    complete_copy,
    fetch_step,
    fold_partner_copies,
    pending_push,
)
from hpcrun.checkpoint.rawio import Extent, aligned_buffer, write_extents
from hpcrun.checkpoint.retention import restorable
from hpcrun.checkpoint.tiers import CommittedCheckpoint, fold_checkpoints, tier_paths
from hpcrun.control.entries import PartnerCopyNote, PartnerFetchNote
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError, HpcrunError, StaleGenerationError, StorageError
from hpcrun.runtime.partnerserver import (
    AUTH_HEADER,
    CHUNK,
    SIZE_HEADER,
    TIMEOUT_S,
    TS_HEADER,
    peer_address,
    read_exactly,
    run_secret,
    sign,
)

_log = logging.getLogger(__name__)

FETCH_STREAMS = 8
"""Parallel streams of one fetch (the node-local restore reads with as many threads)."""


def wanted(spare_nodes: int, node_local_root: Path | None) -> bool:
    """Whether a run keeps partner copies: it has a tier 0 and a spare to restore onto."""
    return spare_nodes > 0 and node_local_root is not None


# -- clients -----------------------------------------------------------------------------------

class PeerClient:
    """Signed requests to one node's partner server."""

    def __init__(self, run_dir: Path, node: str, *, secret: bytes | None = None) -> None:
        self.node = node
        self.host, self.port = peer_address(run_dir, node)
        self.secret = secret if secret is not None else run_secret(run_dir)

    def _connect(self, method: str, path: str, length: int) -> tuple[http.client.HTTPConnection,
                                                                       dict[str, str]]:
        ts = f"{time.time():.3f}"
        headers = {"Content-Length": str(length), TS_HEADER: ts,
                   AUTH_HEADER: sign(self.secret, method, path, length, ts)}
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S), headers

    def put(self, rel: str, src: Path) -> int:
        """Send the shard file ``src`` as ``rel``; the bytes the partner verified and kept.

        Raises:
            StorageError: the partner is unreachable or refused the shard (its reason).
        """
        size, path = src.stat().st_size, f"/v1/copy/{rel}"
        conn, headers = self._connect("PUT", path, size)
        try:
            conn.request("PUT", path, body=_paced_chunks(src), headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except OSError as exc:
            raise StorageError(f"pushing {rel} to {self.node} failed: {exc}") from exc
        finally:
            conn.close()
        if resp.status != 201:
            raise StorageError(f"{self.node} refused {rel}: {resp.status} {resp.reason} "
                               f"{body[:300].decode(errors='replace')}")
        return size

    def get_into(self, rel: str, off: int, view: np.ndarray) -> int:
        """Bytes ``off`` .. ``off + len(view)`` of the copy the partner holds as ``rel`` (or of
        its own tier-0 shard), into ``view`` (unverified: check them before use); the whole
        file's size.

        Raises:
            StorageError: unreachable, missing there, or a length other than asked.
        """
        path = f"/v1/copy/{rel}?off={off}&len={view.size}"
        conn, headers = self._connect("GET", path, 0)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise StorageError(f"{self.node} has no {rel}: {resp.status} {resp.reason}")
            if int(resp.headers.get("Content-Length") or -1) != view.size:
                raise StorageError(f"{self.node} sends {view.size} bytes of {rel} at {off} as "
                                   f"{resp.headers.get('Content-Length')} bytes")
            read_exactly(resp, view)
            return int(resp.headers.get(SIZE_HEADER) or -1)
        except (OSError, ValueError) as exc:
            raise StorageError(f"fetching {rel} from {self.node} failed: {exc}") from exc
        finally:
            conn.close()


def fetch_ranges(size: int, *, streams: int = FETCH_STREAMS,
                 least: int = 64 << 20) -> list[tuple[int, int]]:
    """``(offset, length)`` pieces of a ``size``-byte shard fetched over parallel streams:
    at most ``streams``, none under ``least`` bytes but the last, 4 KiB aligned (pure)."""
    n = max(1, min(streams, size // least))
    step = (-(-size // n) + 4095) // 4096 * 4096 if n > 1 else size
    return [(o, min(step, size - o)) for o in range(0, size, step)] if size else [(0, 0)]


def _paced_chunks(src: Path) -> Iterator[bytes]:
    """The file in 8 MiB pieces, paced by this process's drain pacer when it has one."""
    pacer = active_pacer()
    if pacer is not None:
        pacer.begin()
    try:
        with open(src, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
                if pacer is not None:
                    pacer.pace(len(chunk))
    finally:
        if pacer is not None:
            pacer.end()


# -- push (the drainer's side) -----------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class PushTarget:
    """What one node pushes, to whom, under which fencing token."""

    run_dir: Path
    """Run directory."""
    node: str
    """This node."""
    partner: str
    """The node that holds this node's copies (its ring successor in the gang)."""
    node_local_root: Path
    """This node's tier-0 directory."""
    generation: int
    """Fencing token: generation."""
    holder: str
    """Fencing token: holder."""


def push_round(target: PushTarget, log: RunLog, *, reported: set[str] | None = None) -> str | None:
    """Copy the newest checkpoint of this node's shards to its partner, if not held yet.

    Publishes a ``partner_copy`` note under the fence: complete, or incomplete with the reason
    (once per checkpoint in ``reported``). Returns the checkpoint copied completely, if any.

    Raises:
        StaleGenerationError: a newer generation fenced this node out.
    """
    entries = log.read()
    ckpt = pending_push(fold_checkpoints(entries), fold_partner_copies(entries),
                        node=target.node, partner=target.partner)
    if ckpt is None:
        return None
    try:
        sent = _push(target, ckpt)
    except StaleGenerationError:
        raise
    except (HpcrunError, OSError) as exc:
        _log.warning("partner copy of %s to %s failed: %s", ckpt.ckpt_id, target.partner, exc)
        if reported is None or ckpt.ckpt_id not in reported:
            _note(log, target, ckpt.ckpt_id, 0, complete=False, detail=str(exc)[:1000])
            if reported is not None:
                reported.add(ckpt.ckpt_id)
        return None
    _note(log, target, ckpt.ckpt_id, sent, complete=True)
    return ckpt.ckpt_id


def _push(target: PushTarget, ckpt: CommittedCheckpoint) -> int:
    m = read_manifest(target.run_dir, ckpt)
    src = tier_paths(target.run_dir, ckpt.ckpt_id, local_root=target.node_local_root,
                     run_id=m.run_id).node_local
    assert src is not None
    mine = [s for s in m.shards if s.node == target.node]
    if not mine or not all((src / s.path).exists() for s in mine):
        raise CheckpointError(f"{target.node} holds no complete tier-0 copy of {ckpt.ckpt_id}")
    client = PeerClient(target.run_dir, target.partner)
    return sum(client.put(f"{ckpt.ckpt_id}/{s.path}", src / s.path) for s in mine)


def _note(log: RunLog, target: PushTarget, ckpt_id: str, sent: int, *, complete: bool,
          detail: str = "") -> None:
    log.publish_entry(PartnerCopyNote(ckpt_id=ckpt_id, owner=target.node,
                                      held_by=target.partner, bytes=sent, complete=complete,
                                      detail=detail),
                      generation=target.generation, holder=target.holder)


# -- fetch (a replacement node's agent, before its ranks start) --------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class FetchTarget:
    """A gang node about to start its ranks: where they restore from."""

    run_dir: Path
    """Run directory."""
    node: str
    """This node."""
    ranks: tuple[int, ...]
    """The ranks this node runs in the new gang."""
    gang: tuple[str, ...]
    """The new gang (nodes that may hold a copy and are alive)."""
    node_local_root: Path
    """This node's tier-0 directory."""
    fence_slot: int
    """The incarnation's restore point: only checkpoints committed before it count."""
    generation: int
    """Fencing token: generation."""
    holder: str
    """Fencing token: holder."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardSet:
    """The shards some ranks restore from one checkpoint, as its manifest records them."""

    ckpt_id: str
    """Checkpoint."""
    run_id: str
    """Run it belongs to (names its tier-0 directory)."""
    checksum: str
    """Checksum algorithm of its datasets."""
    shards: tuple[ShardRecord, ...]
    """The shard records."""


def shards_for(run_dir: Path, ckpt: CommittedCheckpoint, ranks: tuple[int, ...], *, node: str,
               gang: tuple[str, ...]) -> ShardSet | None:
    """The shards of ``ranks`` in ``ckpt``, from the fewest sub-manifests: this node's own
    first, then those of nodes no longer in the gang (the lost ones). None when they do not
    cover ``ranks`` (another layout: the restore plans that one itself).

    Raises:
        CorruptCheckpointError: a manifest is missing or fails its digest.
    """
    from hpcrun.checkpoint.hierarchy import read_node_shards, read_top_manifest

    top = read_top_manifest(run_dir, ckpt)
    if not top.get("node_manifests"):  # a manifest from before node sub-manifests
        m = read_manifest(run_dir, ckpt)
        found = [s for s in m.shards if s.rank in ranks]
    else:
        listed = [str(n) for n in top.get("nodes") or ()]
        found = []
        for old in [n for n in listed if n == node] + [n for n in listed if n not in gang]:
            found += [s for s in read_node_shards(run_dir, ckpt.ckpt_id, top, old)
                      if s.rank in ranks]
            if {s.rank for s in found} >= set(ranks):
                break
    if {s.rank for s in found} != set(ranks):
        return None
    return ShardSet(ckpt_id=ckpt.ckpt_id, run_id=str(top.get("run_id") or run_dir.name),
                    checksum=str(top.get("checksum")), shards=tuple(found))


def fetch_for_restore(target: FetchTarget, log: RunLog) -> PartnerFetchNote | None:
    """Fetch the shards this node's ranks restore, when another node wrote them and a partner
    holds a complete copy (newest checkpoint first; see
    :func:`~hpcrun.checkpoint.partner.fetch_step`). Returns what was fetched (also published
    as a ``partner_fetch`` note), or None when the restore needs nothing from a partner.
    """
    entries = [e for e in log.read() if e.slot < target.fence_slot]
    copies = fold_partner_copies(entries)
    for ckpt in reversed(restorable(entries)):
        try:
            found = shards_for(target.run_dir, ckpt, target.ranks, node=target.node,
                               gang=target.gang)
        except (HpcrunError, OSError):
            continue  # the restore will find this one unusable too
        if found is None:
            return None
        shards, owners = list(found.shards), {s.node for s in found.shards}
        paths = tier_paths(target.run_dir, ckpt.ckpt_id, local_root=target.node_local_root,
                           run_id=found.run_id)
        local = paths.node_local
        assert local is not None
        have = bool(shards) and all((local / s.path).exists() for s in shards)
        shared = all((paths.shared / s.path).exists() for s in shards)
        copy = complete_copy(copies, ckpt.ckpt_id, next(iter(owners), ""),
                             holders=[n for n in target.gang if n != target.node])
        step = fetch_step(ckpt, owners=owners, node=target.node, local_complete=have, copy=copy,
                          shared_complete=shared)
        if step is FetchStep.FETCH and copy is not None:
            note = _fetch(target, found, local, copy.held_by, log)
            if note is not None:
                return note
            step = fetch_step(ckpt, owners=owners, node=target.node, local_complete=False,
                              copy=None, shared_complete=shared)
        if step is FetchStep.STOP:
            return None
    return None


def _fetch(target: FetchTarget, found: ShardSet, local: Path, held_by: str,
           log: RunLog) -> PartnerFetchNote | None:
    started = time.monotonic()
    try:
        total = fetch_shards(PeerClient(target.run_dir, held_by), found, local)
    except (HpcrunError, OSError) as exc:
        _log.warning("fetching %s from %s failed, the restore falls back: %s", found.ckpt_id,
                     held_by, exc)
        for s in found.shards:  # never leave part of a copy where the restore looks
            with contextlib.suppress(FileNotFoundError):
                (local / s.path).unlink()
        return None
    note = PartnerFetchNote(ckpt_id=found.ckpt_id, owner=found.shards[0].node, held_by=held_by,
                            node=target.node, bytes=total,
                            seconds=round(time.monotonic() - started, 4))
    log.publish_entry(note, generation=target.generation, holder=target.holder)
    return note


def fetch_shards(client: PeerClient, found: ShardSet, local: Path, *,
                 least: int = 64 << 20) -> int:
    """Fetch ``found``'s shards from ``client``'s node over parallel streams into ``local``;
    the bytes fetched. Each stream writes its piece (O_DIRECT where possible) as it arrives;
    each shard is then checked against the manifest and only then renamed into place.

    Raises:
        StorageError: a stream or a write failed. CorruptCheckpointError: a shard fails its
        checks (nothing of it is left in place).
    """
    shards = found.shards
    bufs = {s.path: aligned_buffer(s.bytes, touch=False) for s in shards}
    tmps = {s.path: (local / s.path).with_name(f".{Path(s.path).name}.partner") for s in shards}
    try:
        for tmp in tmps.values():
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(b"")

        def one(piece: tuple[ShardRecord, int, int]) -> None:
            s, off, n = piece
            view = bufs[s.path][off:off + n]
            client.get_into(f"{found.ckpt_id}/{s.path}", off, view)
            write_extents(tmps[s.path], [Extent(file_offset=off, buffer=view.data)], threads=1)

        pieces = [(s, off, n) for s in shards for off, n in fetch_ranges(s.bytes, least=least)]
        with ThreadPoolExecutor(max_workers=max(1, min(FETCH_STREAMS, len(pieces)))) as pool:
            list(pool.map(one, pieces))
        for s in shards:
            check_shard_image(bufs[s.path], s, found.checksum, tmps[s.path], found.ckpt_id)
            os.replace(tmps[s.path], local / s.path)
    finally:
        for tmp in tmps.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return sum(s.bytes for s in shards)
