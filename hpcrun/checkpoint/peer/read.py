"""The restore's peer tier: a shard read, by byte range, from the gang node that has it.

A rank's restore plan needs other nodes' shards: replicated tensors are written once, their
rows split over every rank's shard, and a lost node's shards are held by its ring partner
(:mod:`hpcrun.checkpoint.peer.push`). Rather than the shared filesystem (which a checkpoint not
yet drained is not even on), :class:`PeerShards` (the Checkpointer's ``peers``, in every
multi-node run with a tier 0: :func:`~hpcrun.checkpoint.peer.push.serves_peers`) names where
such a shard is, nearest first:

1. a copy this node holds for its partner (read from its own disk, as tier 0);
2. the owner's tier 0, when the owner is in the gang;
3. a complete partner copy another gang node holds (the run log's ``partner_copy`` notes).

Remote copies are read through the holder's partner server
(:mod:`~hpcrun.checkpoint.peer.server`): the HDF5 header and small datasets through
:class:`RangeFile` (cached ranged GETs), bulk datasets straight into the restore's buffer over
parallel ranged streams, nothing written to disk. The restore verifies every byte against the
manifest's checksums (:func:`~hpcrun.checkpoint.shards.read_datasets`), as from any tier, and
moves on to the next copy (tier 1 last) when one fails.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpcrun.checkpoint.manifest import ShardRecord
from hpcrun.checkpoint.peer.ledger import (
    PartnerCopy,
    complete_copy,
    fold_partner_copies,
    partner_root,
)
from hpcrun.checkpoint.peer.push import FETCH_STREAMS, PeerClient, fetch_ranges
from hpcrun.checkpoint.shards import LocalShard, ShardSource
from hpcrun.control.log import RunLog
from hpcrun.errors import HpcrunError
from hpcrun.vocab import Tier

_log = logging.getLogger(__name__)

BLOCK = 256 << 10
"""Bytes per ranged GET of :class:`RangeFile` (an HDF5 header and its small datasets)."""
CACHED_BLOCKS = 64
"""Blocks a :class:`RangeFile` keeps (bulk datasets never pass through it)."""
LEAST_STREAM = 8 << 20
"""Smallest piece of a bulk read given its own stream."""


class RangeFile(io.RawIOBase):
    """A peer's copy of one file as a read-only, seekable file object (what h5py opens)."""

    def __init__(self, client: PeerClient, rel: str, size: int, *, block: int = BLOCK) -> None:
        super().__init__()
        self._client, self._rel, self._size, self._block = client, rel, size, block
        self._pos = 0
        self._cache: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        got = 0
        while got < n:
            index, within = divmod(self._pos + got, self._block)
            data = self._get(index)
            take = min(n - got, len(data) - within)
            view[got:got + take] = data[within:within + take]
            got += take
        self._pos += n
        return n

    def _get(self, index: int) -> bytes:
        if index not in self._cache:
            off = index * self._block
            buf = np.empty(min(self._block, self._size - off), dtype=np.uint8)
            self._client.get_into(self._rel, off, buf)
            if len(self._cache) >= CACHED_BLOCKS:
                self._cache.pop(next(iter(self._cache)))
            self._cache[index] = buf.tobytes()
        return self._cache[index]


class RemoteShard:
    """A shard on another gang node (its own tier 0 or a copy it holds), read over the network
    (a :class:`~hpcrun.checkpoint.shards.ShardSource`)."""

    def __init__(self, client: PeerClient, rel: str, *, least: int = LEAST_STREAM) -> None:
        self.client, self.rel, self.least = client, rel, least
        self._size: int | None = None

    @property
    def name(self) -> str:
        """``<node>:<ckpt_id>/<owner>/rank-NNNNN.h5``."""
        return f"{self.client.node}:{self.rel}"

    def size(self) -> int:
        """The copy's size there (StorageError when that node lacks it or is unreachable)."""
        if self._size is None:
            self._size = self.client.get_into(self.rel, 0, np.empty(0, dtype=np.uint8))
        return self._size

    def open_h5(self) -> h5py.File:
        """The copy opened with h5py over cached ranged GETs."""
        return h5py.File(RangeFile(self.client, self.rel, self.size()), "r")

    def read_into(self, extents: Sequence[tuple[int, np.ndarray]]) -> None:
        """Each ``(offset, buffer)`` filled over parallel ranged streams."""
        pieces = [(off + o, buf[o:o + n]) for off, buf in extents
                  for o, n in fetch_ranges(buf.size, least=self.least) if n]
        if not pieces:
            return
        with ThreadPoolExecutor(max_workers=min(FETCH_STREAMS, len(pieces))) as pool:
            list(pool.map(lambda p: self.client.get_into(self.rel, p[0], p[1]), pieces))


@dataclass(kw_only=True)
class PeerShards:
    """Where a shard is on the gang's nodes (see the module docstring); the Checkpointer's
    ``peers`` in a run whose agents run partner servers."""

    run_dir: Path
    """Run directory (peer addresses, the secret, the log)."""
    node: str
    """This node."""
    gang: tuple[str, ...]
    """The incarnation's nodes (the ones alive to ask)."""
    node_local_root: Path
    """This node's tier-0 directory (the copies it holds for its partner)."""
    log: RunLog
    """The run log (``partner_copy`` notes)."""
    fence_slot: int = -1
    """The incarnation's fence: the copies that count are noted before it (-1: the whole log).
    What precedes it is in the agent's node-local copy of the log, so a restarted rank lists
    nothing to find them."""
    _copies: dict[tuple[str, str, str], PartnerCopy] | None = field(default=None, repr=False)
    _asked: set[str] = field(default_factory=set, repr=False)
    _clients: dict[str, PeerClient | None] = field(default_factory=dict, repr=False)

    def __call__(self, ckpt_id: str, shard: ShardRecord) -> list[tuple[Tier, ShardSource]]:
        owner = shard.node
        copy = complete_copy(self._partner_copies(ckpt_id), ckpt_id, owner, holders=self.gang)
        holders = [copy.held_by] if copy is not None else []
        out: list[tuple[Tier, ShardSource]] = []
        if self.node in holders:
            held = partner_root(self.node_local_root, self.run_dir.name) / ckpt_id / shard.path
            out.append((Tier.NODE_LOCAL, LocalShard(held)))
        remote = [owner] if owner in self.gang and owner != self.node else []
        remote += [h for h in holders if h not in (self.node, owner)]
        for peer in remote:
            client = self._client(peer)
            if client is not None:
                out.append((Tier.PEER, RemoteShard(client, f"{ckpt_id}/{shard.path}")))
        return out

    def _partner_copies(self, ckpt_id: str) -> dict[tuple[str, str, str], PartnerCopy]:
        """The log's partner copies, read once per checkpoint asked about."""
        if self._copies is None or ckpt_id not in self._asked:
            self._copies = fold_partner_copies(self.log.read_before(self.fence_slot))
            self._asked.add(ckpt_id)
        return self._copies

    def _client(self, peer: str) -> PeerClient | None:
        if peer not in self._clients:
            try:
                self._clients[peer] = PeerClient(self.run_dir, peer)
            except (HpcrunError, OSError) as exc:  # no server there: not a source
                _log.warning("no peer reads from %s: %s", peer, exc)
                self._clients[peer] = None
        return self._clients[peer]

