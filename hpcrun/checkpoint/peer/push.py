"""Partner copies over the network between agents: the push, and the client both sides use.

Node-local disks are private to their node, so a copy travels between agents: each agent of a
multi-node run with a tier 0 runs a partner server (:mod:`hpcrun.checkpoint.peer.server`), and
these are its clients, signing every request with the run's secret.

- **push** (:func:`push_round`, run by the node's drainer process in its own thread,
  :func:`push_loop`, as soon as a tier-0 commit lands rather than behind the drain round, at
  the drain's lowest priority and paced like a drain): the newest tier-0 checkpoint holding
  this node's shards, unless the partner already holds it, is sent shard by shard to the ring
  partner (:func:`~hpcrun.checkpoint.peer.ledger.ring_partner`); the partner verifies every shard
  against the manifest's checksums before it keeps it (and keeps the newest
  :data:`~hpcrun.checkpoint.peer.ledger.KEEP_PARTNER_COPIES` per owner), then the pusher publishes
  a ``partner_copy`` note under its fence (complete, or not and why).
- **read** (:class:`PeerClient`'s ``get_into``, used by the restore's peer tier,
  :mod:`hpcrun.checkpoint.peer.read`): byte ranges of a copy a node holds, or of its own tier-0
  shards, read straight into a restoring rank's buffer, which checks them against the manifest.

Paths in requests are validated (:func:`~hpcrun.checkpoint.peer.ledger.check_relpath`), sizes
must equal the manifest's, and every byte pushed is checked against the manifest before it is
renamed into place.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.pacing import active_pacer
from hpcrun.checkpoint.peer.ledger import (
    fold_partner_copies,
    pending_push,
)
from hpcrun.checkpoint.peer.server import (
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
from hpcrun.checkpoint.tiers import CommittedCheckpoint, fold_checkpoints, tier_paths
from hpcrun.control.elastic import survives_node_loss
from hpcrun.control.entries import PartnerCopyNote
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError, HpcrunError, StaleGenerationError, StorageError

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec

_log = logging.getLogger(__name__)

PUSH_POLL_S = 0.5
"""How often the pusher looks for a tier-0 commit its partner does not hold yet."""

FETCH_STREAMS = 8
"""Parallel streams of one read from a peer (the node-local restore reads with as many
threads)."""


def wanted(spec: RunSpec, node_local_root: Path | None) -> bool:
    """Whether a run keeps partner copies: it has a tier 0 and either spans several nodes (a
    node lost before its newest checkpoint drained leaves a copy on its partner, which a
    restore reads through the peer tier instead of going back to an older tier-1 commit) or
    outlives a node loss in its allocation (a spare takes the lost node's place, or the
    elastic gang goes on without it)."""
    return node_local_root is not None and (spec.resources.nodes > 1 or survives_node_loss(spec))


def serves_peers(spec: RunSpec, node_local_root: Path | None) -> bool:
    """Whether a run's agents serve their tier 0 and its restores read through the peer tier: it
    keeps partner copies, or its gang spans several nodes with a tier 0 (a checkpoint not yet
    drained is then on no tier every node reads, and replicated tensors need every shard)."""
    return wanted(spec, node_local_root) or (node_local_root is not None
                                             and spec.resources.nodes > 1)


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
    """``(offset, length)`` pieces of ``size`` bytes read from a peer over parallel streams:
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


def push_loop(target: PushTarget, log: RunLog, stop: threading.Event, *,
              poll_s: float = PUSH_POLL_S) -> bool:
    """Push every new tier-0 commit to the partner as soon as it lands (the log is polled
    every ``poll_s``), until ``stop`` is set.

    Returns:
        True when stopped; False when a newer generation fenced this node out.
    """
    reported: set[str] = set()
    while not stop.is_set():
        try:
            push_round(target, log, reported=reported)
        except StaleGenerationError:
            return False
        stop.wait(poll_s)
    return True


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
