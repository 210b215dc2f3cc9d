"""Partner copies over the network between agents: serve, push, fetch.

Node-local disks are private to their node, so a copy travels between agents: each agent of a
run with hot spares runs a small HTTP server (:class:`PartnerServer`, a thread of the agent,
bound to the node's own address on a port the kernel picks, published in
``<run_dir>/partner/<node>.json``). Every request carries an HMAC of its method, path, length
and time under a run-scoped secret (``<run_dir>/partner/secret``, mode 0600); anything else is
refused.

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
import hashlib
import hmac
import http.client
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.drain import check_shard_image
from hpcrun.checkpoint.manifest import Manifest, ShardRecord
from hpcrun.checkpoint.pacing import active_pacer
from hpcrun.checkpoint.partner import (
    FetchStep,
    check_relpath,
    complete_copy,
    fetch_step,
    fold_partner_copies,
    partner_root,
    pending_push,
    retired_copies,
)
from hpcrun.checkpoint.rawio import Extent, aligned_buffer, write_extents
from hpcrun.checkpoint.retention import restorable
from hpcrun.checkpoint.tiers import CommittedCheckpoint, fold_checkpoints, tier_paths
from hpcrun.control.entries import PartnerCopyNote, PartnerFetchNote
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError, HpcrunError, StaleGenerationError, StorageError

_log = logging.getLogger(__name__)

PARTNER_RUN_DIR = "partner"
"""Subdirectory of the run directory: the secret and each agent's address."""
ADDR_SCHEMA_VERSION = 1
AUTH_HEADER = "X-Hpcrun-Auth"
TS_HEADER = "X-Hpcrun-Time"
AUTH_WINDOW_S = 300.0
"""A request signed longer ago than this (or this far ahead) is refused."""
CHUNK = 8 << 20
"""Bytes per read or send (the drain's request size)."""
TIMEOUT_S = 60.0
"""Socket timeout of one request."""
FETCH_STREAMS = 8
"""Parallel streams of one fetch (the node-local restore reads with as many threads)."""


def wanted(spare_nodes: int, node_local_root: Path | None) -> bool:
    """Whether a run keeps partner copies: it has a tier 0 and a spare to restore onto."""
    return spare_nodes > 0 and node_local_root is not None


# -- secret and addresses ----------------------------------------------------------------------

def run_secret(run_dir: Path) -> bytes:
    """The run's partner secret (created on first use, mode 0600, by whichever agent is first).

    Raises:
        StorageError: it cannot be created or read, or its mode lets others read it.
    """
    path = Path(run_dir) / PARTNER_RUN_DIR / "secret"
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if not path.exists():
            tmp = path.with_name(f".secret.{os.getpid()}.{secrets.token_hex(6)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_hex(32).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # atomic: the first agent's secret wins
            os.unlink(tmp)
        if path.stat().st_mode & 0o077:
            raise StorageError(f"partner secret {path} is readable by others "
                               f"(mode {path.stat().st_mode & 0o777:o}); expected 0600: "
                               "remove it and restart the run")
        return path.read_bytes().strip()
    except OSError as exc:
        raise StorageError(f"partner secret {path} cannot be created or read: {exc}; check "
                           "the run directory's permissions") from exc


def addr_path(run_dir: Path, node: str) -> Path:
    """Where ``node``'s agent publishes its partner server's address."""
    return Path(run_dir) / PARTNER_RUN_DIR / f"{node}.json"


def node_address(node: str, backend: str) -> str:
    """This node's own address (what its server binds to); loopback for the local backend."""
    if backend == "local":
        return "127.0.0.1"
    try:
        return socket.gethostbyname(node)
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def peer_address(run_dir: Path, node: str) -> tuple[str, int]:
    """The address ``node``'s agent published (untrusted: checked for shape only).

    Raises:
        StorageError: none published, or malformed.
    """
    path = addr_path(run_dir, node)
    try:
        body = json.loads(path.read_bytes())
        host, port = str(body["host"]), int(body["port"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"no partner address for {node} at {path} ({exc}); its agent has "
                           "not started its partner server") from exc
    if not 0 < port < 65536:
        raise StorageError(f"partner address of {node} names port {port}; expected 1-65535")
    return host, port


def sign(secret: bytes, method: str, path: str, length: int, ts: str) -> str:
    """The request's authenticator: HMAC-SHA256 of method, path, length and time."""
    msg = f"{method}\n{path}\n{length}\n{ts}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def authentic(secret: bytes, headers: Mapping[str, str], method: str, path: str, length: int,
              now: float) -> bool:
    """Whether a request's signature matches and its time is within the window (pure)."""
    lower = {k.lower(): v for k, v in headers.items()}  # HTTP header names ignore case
    ts, mac = lower.get(TS_HEADER.lower(), ""), lower.get(AUTH_HEADER.lower(), "")
    try:
        fresh = abs(now - float(ts)) <= AUTH_WINDOW_S
    except ValueError:
        return False
    return fresh and hmac.compare_digest(mac, sign(secret, method, path, length, ts))


# -- manifests ---------------------------------------------------------------------------------

class ManifestCache:
    """Manifests of committed checkpoints, read (digest-checked) once each."""

    def __init__(self, run_dir: Path, log: RunLog, size: int = 8) -> None:
        self.run_dir, self.log, self.size = Path(run_dir), log, size
        self._by_id: dict[str, Manifest] = {}
        self._lock = threading.Lock()

    def get(self, ckpt_id: str) -> Manifest:
        """The manifest of committed ``ckpt_id``; CheckpointError when it is not committed."""
        with self._lock:
            if ckpt_id in self._by_id:
                return self._by_id[ckpt_id]
        ckpt = next((c for c in fold_checkpoints(self.log.read()) if c.ckpt_id == ckpt_id), None)
        if ckpt is None:
            raise CheckpointError(f"checkpoint {ckpt_id} is not committed in the run log; a "
                                  "partner copy is only taken of a committed checkpoint")
        m = read_manifest(self.run_dir, ckpt)
        with self._lock:
            if len(self._by_id) >= self.size:
                self._by_id.pop(next(iter(self._by_id)))
            self._by_id[ckpt_id] = m
        return m

    def record(self, ckpt_id: str, owner: str, name: str) -> tuple[ShardRecord, str]:
        """The manifest's record of ``<owner>/<name>`` and its checksum algorithm."""
        m = self.get(ckpt_id)
        rec = next((s for s in m.shards if s.path == f"{owner}/{name}" and s.node == owner),
                   None)
        if rec is None:
            raise CheckpointError(f"checkpoint {ckpt_id} has no shard {owner}/{name}")
        return rec, m.checksum


def land_verified(data: np.ndarray, dest: Path, rec: ShardRecord, *, algorithm: str,
                  ckpt_id: str) -> None:
    """Write received shard bytes to ``dest`` durably, only if they match the manifest.

    Raises:
        CorruptCheckpointError: size or checksums differ (nothing is left at ``dest``).
        StorageError: the write failed.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partner")
    tmp.touch()
    try:
        write_extents(tmp, [Extent(file_offset=0, buffer=data.data)])
        check_shard_image(data, rec, algorithm, tmp, ckpt_id)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# -- the server (one per agent) ----------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class HolderStore:
    """The copies this node holds for its partner, on its tier 0."""

    root: Path
    """``<node_local_root>/<run_id>/partner``."""
    manifests: ManifestCache
    """Committed manifests (what every received byte is checked against)."""

    def path_of(self, rel: str) -> Path:
        ckpt_id, owner, name = check_relpath(rel)
        return self.root / ckpt_id / owner / name

    def receive(self, rel: str, data: np.ndarray) -> None:
        """Keep a pushed shard once it matches the manifest; retire old copies of its owner."""
        ckpt_id, owner, name = check_relpath(rel)
        rec, algorithm = self.manifests.record(ckpt_id, owner, name)
        land_verified(data, self.path_of(rel), rec, algorithm=algorithm, ckpt_id=ckpt_id)
        self.retire(owner)

    def retire(self, owner: str) -> None:
        held = [d.name for d in self.root.iterdir() if (d / owner).is_dir()]
        for ckpt_id in retired_copies(held):
            shutil.rmtree(self.root / ckpt_id / owner, ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.root / ckpt_id).rmdir()  # only once no other owner's copy is left


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("partner server: " + format, *args)

    def _rel(self) -> str | None:
        length = int(self.headers.get("Content-Length") or 0)
        headers = dict(self.headers.items())
        if not self.path.startswith("/v1/copy/") or not authentic(
                self.server.secret, headers, self.command, self.path, length, time.time()):
            self.send_error(403, "unsigned, stale or misaddressed request")
            return None
        return self.path.removeprefix("/v1/copy/")

    def do_PUT(self) -> None:
        rel = self._rel()
        if rel is None:
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            ckpt_id, owner, name = check_relpath(rel)
            rec, _ = self.server.store.manifests.record(ckpt_id, owner, name)
            if length != rec.bytes:
                raise CheckpointError(f"{rel} is sent as {length} bytes, the manifest says "
                                      f"{rec.bytes}")
            data = aligned_buffer(length, touch=False)
            _read_exactly(self.rfile, data)
            self.server.store.receive(rel, data)
        except (HpcrunError, OSError) as exc:
            self.send_error(422, str(exc)[:500])
            return
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        rel = self._rel()
        if rel is None:
            return
        rel, _, query = rel.partition("?")
        try:
            path = self.server.store.path_of(rel)
            size = path.stat().st_size
            off, length = byte_range(query, size)
        except (HpcrunError, OSError, ValueError) as exc:
            self.send_error(404, str(exc)[:500])
            return
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()
        with open(path, "rb") as f:
            sent = 0
            while sent < length:  # zero-copy, file to socket
                n = os.sendfile(self.connection.fileno(), f.fileno(), off + sent, length - sent)
                if n == 0:
                    break
                sent += n


def byte_range(query: str, size: int) -> tuple[int, int]:
    """``off=A&len=B`` of a GET (the whole file when absent), checked against ``size`` (pure).

    Raises:
        ValueError: malformed, or outside the file.
    """
    if not query:
        return 0, size
    fields = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
    off, length = int(fields.get("off", "x")), int(fields.get("len", "x"))
    if off < 0 or length < 0 or off + length > size:
        raise ValueError(f"range {off}+{length} lies outside the {size}-byte copy")
    return off, length


def _read_exactly(stream: Any, data: np.ndarray) -> None:
    view, got = data.data.cast("B"), 0
    while got < len(view):
        n = stream.readinto(view[got:got + CHUNK])
        if not n:
            raise StorageError(f"the connection closed after {got} of {len(view)} bytes")
        got += n


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], secret: bytes, store: HolderStore) -> None:
        super().__init__(addr, _Handler)
        self.secret, self.store = secret, store


class PartnerServer:
    """This agent's partner server: a thread, started and stopped as a context manager."""

    def __init__(self, run_dir: Path, *, node: str, host: str, node_local_root: Path,
                 log: RunLog) -> None:
        self.run_dir, self.node = Path(run_dir), node
        store = HolderStore(root=partner_root(node_local_root, self.run_dir.name),
                            manifests=ManifestCache(self.run_dir, log))
        store.root.mkdir(parents=True, exist_ok=True)
        self._server = _Server((host, 0), run_secret(self.run_dir), store)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="hpcrun-partner", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def __enter__(self) -> PartnerServer:
        self._thread.start()
        host, port = self.address
        body = {"schema_version": ADDR_SCHEMA_VERSION, "node": self.node, "host": host,
                "port": port}
        from hpcrun.storage import LOCAL_STORAGE

        LOCAL_STORAGE.write_atomic(addr_path(self.run_dir, self.node), json.dumps(body).encode())
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


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

    def get_into(self, rel: str, off: int, view: np.ndarray) -> None:
        """Bytes ``off`` .. ``off + len(view)`` of the copy the partner holds as ``rel``, into
        ``view`` (unverified: check them before use).

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
            _read_exactly(resp, view)
        except OSError as exc:
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
            m = read_manifest(target.run_dir, ckpt)
        except (HpcrunError, OSError):
            continue  # the restore will find this one unusable too
        shards = [s for s in m.shards if s.rank in target.ranks]
        owners = {s.node for s in shards}
        paths = tier_paths(target.run_dir, ckpt.ckpt_id, local_root=target.node_local_root,
                           run_id=m.run_id)
        local = paths.node_local
        assert local is not None
        have = bool(shards) and all((local / s.path).exists() for s in shards)
        shared = all((paths.shared / s.path).exists() for s in shards)
        copy = complete_copy(copies, ckpt.ckpt_id, next(iter(owners), ""),
                             holders=[n for n in target.gang if n != target.node])
        step = fetch_step(ckpt, owners=owners, node=target.node, local_complete=have, copy=copy,
                          shared_complete=shared)
        if step is FetchStep.FETCH and copy is not None:
            note = _fetch(target, m, shards, local, copy.held_by, log)
            if note is not None:
                return note
            step = fetch_step(ckpt, owners=owners, node=target.node, local_complete=False,
                              copy=None, shared_complete=shared)
        if step is FetchStep.STOP:
            return None
    return None


def _fetch(target: FetchTarget, m: Manifest, shards: list[ShardRecord], local: Path,
           held_by: str, log: RunLog) -> PartnerFetchNote | None:
    started = time.monotonic()
    try:
        total = fetch_shards(PeerClient(target.run_dir, held_by), m, shards, local)
    except (HpcrunError, OSError) as exc:
        _log.warning("fetching %s from %s failed, the restore falls back: %s", m.ckpt_id,
                     held_by, exc)
        for s in shards:  # never leave part of a copy where the restore looks
            with contextlib.suppress(FileNotFoundError):
                (local / s.path).unlink()
        return None
    note = PartnerFetchNote(ckpt_id=m.ckpt_id, owner=shards[0].node, held_by=held_by,
                            node=target.node, bytes=total,
                            seconds=round(time.monotonic() - started, 4))
    log.publish_entry(note, generation=target.generation, holder=target.holder)
    return note


def fetch_shards(client: PeerClient, m: Manifest, shards: list[ShardRecord], local: Path, *,
                 least: int = 64 << 20) -> int:
    """Fetch ``shards`` from ``client``'s node over parallel streams into ``local``; the bytes
    fetched. Each stream writes its piece (O_DIRECT where possible) as it arrives; each shard
    is then checked against the manifest and only then renamed into place.

    Raises:
        StorageError: a stream or a write failed. CorruptCheckpointError: a shard fails its
        checks (nothing of it is left in place).
    """
    bufs = {s.path: aligned_buffer(s.bytes, touch=False) for s in shards}
    tmps = {s.path: (local / s.path).with_name(f".{Path(s.path).name}.partner") for s in shards}
    try:
        for tmp in tmps.values():
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(b"")

        def one(piece: tuple[ShardRecord, int, int]) -> None:
            s, off, n = piece
            view = bufs[s.path][off:off + n]
            client.get_into(f"{m.ckpt_id}/{s.path}", off, view)
            write_extents(tmps[s.path], [Extent(file_offset=off, buffer=view.data)], threads=1)

        pieces = [(s, off, n) for s in shards for off, n in fetch_ranges(s.bytes, least=least)]
        with ThreadPoolExecutor(max_workers=max(1, min(FETCH_STREAMS, len(pieces)))) as pool:
            list(pool.map(one, pieces))
        for s in shards:
            check_shard_image(bufs[s.path], s, m.checksum, tmps[s.path], m.ckpt_id)
            os.replace(tmps[s.path], local / s.path)
    finally:
        for tmp in tmps.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return sum(s.bytes for s in shards)
