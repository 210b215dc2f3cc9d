"""The partner server every agent of a multi-node run with a tier 0 runs, and what
authenticates it.

A thread of the agent (:class:`PartnerServer`): an HTTP server bound to the node's fabric
address (the site's ``fabric_interface``, else the interface of the node's Slurm ``NodeAddr``:
:mod:`hpcrun.launch.fabric`) on a port the kernel picks, published in
``<run_dir>/partner/<node>.json`` with the interface and why it was chosen. Every request
carries an HMAC-SHA256 of its method, path, length and time under the run's secret
(``<run_dir>/partner/secret``, mode 0600, created by the first agent); anything else is
refused. ``PUT /v1/copy/<ckpt_id>/<owner>/rank-NNNNN.h5`` keeps a pushed shard on this node's
tier 0 once it matches the committed manifest (size, checksums), and retires the owner's older
copies; ``GET`` of the same path (optionally ``?off=A&len=B``) sends with ``sendfile`` a held
copy, or, when ``<owner>`` is this node, its own tier-0 shard (the restore's peer tier,
:mod:`hpcrun.checkpoint.peer.read`); the file's size comes back in ``X-Hpcrun-Size``. Paths are
validated (:func:`~hpcrun.checkpoint.peer.ledger.check_relpath`), sizes must equal the manifest's.

The server bounds its peers: the signature is checked before any header is parsed; a request's
line and headers must arrive within ``HEADER_DEADLINE_S`` and its transfer within a deadline set
by its size; at most ``MAX_CONNECTIONS`` are served at once (the accept loop waits for a slot);
each PUT lands in its own temporary file (unique name, ``O_EXCL | O_NOFOLLOW``); and no link
leads a GET or a PUT out of tier 0 or the partner root (:func:`contained`, ``O_NOFOLLOW``).
The clients are in :mod:`hpcrun.checkpoint.peer.push` and :mod:`hpcrun.checkpoint.peer.read`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.drain import check_shard_image
from hpcrun.checkpoint.manifest import Manifest, ShardRecord
from hpcrun.checkpoint.peer.ledger import check_relpath, partner_root, retired_copies
from hpcrun.checkpoint.rawio import Extent, aligned_buffer, write_extents
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.checkpoint.tiers import node_local_root as node_local_root_of
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError, HpcrunError, StorageError
from hpcrun.vocab import Backend

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
"""Socket timeout of one request (the clients')."""
RECV_TIMEOUT_S = 10.0
"""The server's socket timeout: a peer silent this long is dropped."""
HEADER_DEADLINE_S = 10.0
"""A request's line and headers must arrive, signed, within this: a peer that trickles them
(or never signs) is dropped, whatever its pace."""
BODY_BASE_S = 30.0
BODY_MIN_RATE = 8 << 20
"""A signed transfer must finish within ``BODY_BASE_S`` + bytes / ``BODY_MIN_RATE`` seconds."""
MAX_CONNECTIONS = 64
"""Requests served at once; the accept loop waits for a slot (back-pressure) up to
``HEADER_DEADLINE_S``, then drops the newcomer."""
SIZE_HEADER = "X-Hpcrun-Size"
"""A GET's answer: the size of the whole file it reads from."""


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


def node_address(node: str, backend: Backend) -> str:
    """This node's own address when no fabric address was chosen (:mod:`hpcrun.launch.fabric`):
    loopback for the local backend, the name's resolution on Slurm."""
    if backend == Backend.LOCAL:
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


def sign(secret: bytes, method: str, path: str, length: int | str, ts: str) -> str:
    """The request's authenticator: HMAC-SHA256 of method, path, length and time."""
    msg = f"{method}\n{path}\n{length}\n{ts}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def authentic(secret: bytes, headers: Mapping[str, str], method: str, path: str,
              length: int | str, now: float) -> bool:
    """Whether a request's signature matches and its time is within the window (pure).

    ``length`` is the ``Content-Length`` header as sent: the signature is checked before any
    header is parsed, so a malformed value from an unsigned peer is refused, never parsed."""
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
    # one temporary file per request: two racing PUTs of a shard never share one, and a link
    # planted at the name is never followed
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(8)}.partner")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        write_extents(tmp, [Extent(file_offset=0, buffer=data.data)], allocate=data.size)
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
    node: str = ""
    """This node: a GET of its own shards is served from ``tier0``."""
    tier0: Path | None = None
    """This node's tier 0 of the run (``<node_local_root>/<run_id>/ckpt``)."""

    def path_of(self, rel: str) -> Path:
        """Where ``rel`` is on this node: a held copy, or this node's own tier-0 shard.

        Raises:
            StorageError: a symbolic link inside tier 0 or the partner root leads out of it.
        """
        ckpt_id, owner, name = check_relpath(rel)
        base = self.tier0 if owner == self.node and self.tier0 is not None else self.root
        return contained(base, base / ckpt_id / owner / name)

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
    timeout = RECV_TIMEOUT_S  # applied to the connection's socket by StreamRequestHandler
    length = 0

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("partner server: " + format, *args)

    def setup(self) -> None:
        super().setup()
        self._deadline: threading.Timer | None = None
        self._arm(HEADER_DEADLINE_S)

    def _arm(self, seconds: float) -> None:
        """Drop the connection ``seconds`` from now unless the request is done by then."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = threading.Timer(seconds, self._drop)
        self._deadline.daemon = True
        self._deadline.start()

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        with contextlib.suppress(OSError):
            super().finish()

    def _rel(self) -> str | None:
        """The request's shard path once its signature checks out (before any header is parsed);
        None after answering 403."""
        raw_length = self.headers.get("Content-Length") or "0"
        headers = dict(self.headers.items())
        if not self.path.startswith("/v1/copy/") or not authentic(
                self.server.secret, headers, self.command, self.path, raw_length, time.time()):
            self.send_error(403, "unsigned, stale or misaddressed request")
            return None
        self.length = int(raw_length)  # signed as str(int) by our own clients
        self._arm(BODY_BASE_S + self.length / BODY_MIN_RATE)
        return self.path.removeprefix("/v1/copy/")

    def do_PUT(self) -> None:
        rel = self._rel()
        if rel is None:
            return
        length = self.length
        try:
            ckpt_id, owner, name = check_relpath(rel)
            rec, _ = self.server.store.manifests.record(ckpt_id, owner, name)
            if length != rec.bytes:
                raise CheckpointError(f"{rel} is sent as {length} bytes, the manifest says "
                                      f"{rec.bytes}")
            data = aligned_buffer(length, touch=False)
            read_exactly(self.rfile, data)
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
            fd = os.open(self.server.store.path_of(rel), os.O_RDONLY | os.O_NOFOLLOW)
        except (HpcrunError, OSError) as exc:
            self.send_error(404, str(exc)[:500])
            return
        try:
            self._send_range(fd, query)
        finally:
            os.close(fd)

    def _send_range(self, fd: int, query: str) -> None:
        try:
            size = os.fstat(fd).st_size
            off, length = byte_range(query, size)
        except (HpcrunError, ValueError) as exc:
            self.send_error(404, str(exc)[:500])
            return
        self._arm(BODY_BASE_S + length / BODY_MIN_RATE)
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.send_header(SIZE_HEADER, str(size))
        self.end_headers()
        self.wfile.flush()
        # zero-copy, file to socket; socket.sendfile waits while the send buffer is full (the
        # socket has a timeout, so it is non-blocking underneath: a bare os.sendfile there
        # fails with EAGAIN as soon as a slow reader lets the buffer fill)
        if length:  # socket.sendfile refuses a count of 0 (an empty range has no body)
            with os.fdopen(os.dup(fd), "rb") as src:
                self.connection.sendfile(src, off, length)


def contained(base: Path, path: Path) -> Path:
    """``path``, once its real location is inside ``base``'s (pure but for resolving links).

    Raises:
        StorageError: a symbolic link on the way leads outside ``base``.
    """
    real, root = path.resolve(), base.resolve()
    if not real.is_relative_to(root):
        raise StorageError(f"{path} leads outside {base} (to {real}); a partner server never "
                           "follows a link out of its tree")
    return path


def byte_range(query: str, size: int) -> tuple[int, int]:
    """``off=A&len=B`` of a GET (the whole file when absent), checked against ``size`` (pure).

    Raises:
        ValueError: malformed. StorageError: outside the file.
    """
    if not query:
        return 0, size
    fields = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
    off, length = int(fields.get("off", "x")), int(fields.get("len", "x"))
    if off < 0 or length < 0 or off + length > size:
        raise StorageError(f"range {off}+{length} lies outside the {size}-byte copy; "
                           "expected off=A&len=B within the file")
    return off, length


def read_exactly(stream: Any, data: np.ndarray) -> None:
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
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        # back-pressure: the accept loop waits for a free slot; every served request ends
        # within its deadlines, so a slot frees up unless the server is flooded
        if not self._slots.acquire(timeout=HEADER_DEADLINE_S):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()


class PartnerServer:
    """This agent's partner server: a thread, started and stopped as a context manager."""

    def __init__(self, run_dir: Path, *, node: str, host: str, node_local_root: Path,
                 log: RunLog, fabric: Mapping[str, str] | None = None) -> None:
        """Bind to ``host`` (a port the kernel picks); ``fabric`` is what the published address
        record says of how ``host`` was chosen (interface, source, detail:
        :meth:`hpcrun.launch.fabric.FabricChoice.record`)."""
        self.run_dir, self.node = Path(run_dir), node
        self._fabric = dict(fabric or {})
        store = HolderStore(root=partner_root(node_local_root, self.run_dir.name),
                            manifests=ManifestCache(self.run_dir, log), node=node,
                            tier0=node_local_root_of(node_local_root, self.run_dir.name))
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
                "port": port, **self._fabric}
        from hpcrun.storage import LOCAL_STORAGE

        LOCAL_STORAGE.write_atomic(addr_path(self.run_dir, self.node), json.dumps(body).encode())
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
