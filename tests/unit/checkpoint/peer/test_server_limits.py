"""The partner server bounds its peers: a real server on 127.0.0.1, real sockets.

Trickling or silent peers are dropped within the header deadline and cannot pile up threads;
the signature is checked before any header is parsed; a link never leads a GET or a PUT out of
the server's tree. Deadlines are shortened for the test (module constants), loops are bounded.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcrun.checkpoint.manifest import ShardRecord
from hpcrun.checkpoint.peer import server as ps
from hpcrun.checkpoint.peer.server import (
    AUTH_HEADER,
    TS_HEADER,
    PartnerServer,
    contained,
    peer_address,
    run_secret,
    sign,
)
from hpcrun.control.log import RunLog
from hpcrun.errors import CorruptCheckpointError, StorageError

CKPT = "g000001-s0000000001-x"


@pytest.fixture
def server(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[PartnerServer]:
    monkeypatch.setattr(ps, "HEADER_DEADLINE_S", 0.5)
    monkeypatch.setattr(ps, "MAX_CONNECTIONS", 4)
    with PartnerServer(run_dir, node="node1", host="127.0.0.1",
                       node_local_root=tmp_path / "nvme1", log=RunLog(run_dir)) as srv:
        yield srv


def _signed(run_dir: Path, method: str, path: str, length: int = 0) -> dict[str, str]:
    ts = f"{time.time():.3f}"
    return {"Content-Length": str(length), TS_HEADER: ts,
            AUTH_HEADER: sign(run_secret(run_dir), method, path, length, ts)}


def _get(run_dir: Path, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    host, port = peer_address(run_dir, "node1")
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1024) == b""  # an orderly close, nothing sent back
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_trickling_peers_are_dropped_and_cannot_pile_up_threads(run_dir: Path,
                                                               server: PartnerServer) -> None:
    before = threading.active_count()
    host, port = server.address
    socks = []
    for _ in range(12):  # three times the connection cap
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET /v1/copy/")  # a request line that never ends
        socks.append(s)
    # each served connection holds a handler and a deadline timer; the rest wait in the backlog
    assert threading.active_count() <= before + 2 * ps.MAX_CONNECTIONS + 1
    try:
        assert all(_closed_by_server(s, within_s=10) for s in socks)
    finally:
        for s in socks:
            s.close()
    status, _ = _get(run_dir, f"/v1/copy/{CKPT}/node0/rank-00000.h5",
                     _signed(run_dir, "GET", f"/v1/copy/{CKPT}/node0/rank-00000.h5"))
    assert status == 404  # served again: signed, nothing held


def test_a_malformed_length_from_an_unsigned_peer_is_refused_before_it_is_parsed(
        run_dir: Path, server: PartnerServer) -> None:
    status, _ = _get(run_dir, f"/v1/copy/{CKPT}/node0/rank-00000.h5", {"Content-Length": "abc"})
    assert status == 403
    path = f"/v1/copy/{CKPT}/node0/rank-00000.h5"
    assert _get(run_dir, path, _signed(run_dir, "GET", path))[0] == 404  # the server lives


def test_a_link_out_of_tier0_is_never_followed(run_dir: Path, server: PartnerServer,
                                               tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "node1"
    outside.mkdir(parents=True)
    (outside / "rank-00000.h5").write_bytes(b"secret bytes outside the tree")
    tier0 = server._server.store.tier0
    assert tier0 is not None
    (tier0 / CKPT).mkdir(parents=True)
    (tier0 / CKPT / "node1").symlink_to(outside)
    path = f"/v1/copy/{CKPT}/node1/rank-00000.h5"
    status, body = _get(run_dir, path, _signed(run_dir, "GET", path))
    assert status == 404 and b"secret bytes" not in body
    # a link as the file itself is refused by O_NOFOLLOW
    (tier0 / CKPT / "node1").unlink()
    (tier0 / CKPT / "node1").mkdir()
    (tier0 / CKPT / "node1" / "rank-00000.h5").symlink_to(outside / "rank-00000.h5")
    status, body = _get(run_dir, path, _signed(run_dir, "GET", path))
    assert status == 404 and b"secret bytes" not in body


def test_contained_allows_a_linked_root_and_refuses_links_out(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "a").mkdir(parents=True)
    (tmp_path / "root").symlink_to(real)  # the tier's root itself may be a link
    assert contained(tmp_path / "root", tmp_path / "root" / "a" / "f") == \
        tmp_path / "root" / "a" / "f"
    (real / "b").symlink_to(tmp_path)
    with pytest.raises(StorageError, match="leads outside"):
        contained(tmp_path / "root", tmp_path / "root" / "b" / "f")


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    dest = tmp_path / "copy" / "rank-00000.h5"
    dest.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    os.symlink(victim, dest.with_name(f".{dest.name}.partner"))  # the old fixed name
    rec = ShardRecord(node="node0", rank=0, path=f"node0/{dest.name}", bytes=999, datasets=())
    with pytest.raises(CorruptCheckpointError):  # 8 bytes where the manifest says 999
        ps.land_verified(np.zeros(8, dtype="uint8"), dest, rec, algorithm="xxh3", ckpt_id=CKPT)
    assert victim.read_bytes() == b"untouched" and not dest.exists()
    assert [p.name for p in dest.parent.iterdir()] == [f".{dest.name}.partner"]  # only the link



def test_a_reader_slower_than_the_server_still_gets_every_byte(
        run_dir: Path, server: PartnerServer) -> None:
    """The server sends a range zero-copy into a socket with a timeout (non-blocking beneath):
    a peer that reads late, so the send buffer fills, gets the whole range, not a connection
    closed halfway (a restore on a loaded node read 5.6 of 8 MiB that way)."""
    tier0 = server._server.store.tier0
    assert tier0 is not None
    shard = tier0 / CKPT / "node1" / "rank-00000.h5"
    shard.parent.mkdir(parents=True)
    data = np.random.default_rng(3).integers(0, 256, 32 << 20, dtype=np.uint8).tobytes()
    shard.write_bytes(data)
    path = f"/v1/copy/{CKPT}/node1/rank-00000.h5"
    off, length = 4096, len(data) - 8192
    host, port = peer_address(run_dir, "node1")
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        query = f"{path}?off={off}&len={length}"
        conn.request("GET", query, headers=_signed(run_dir, "GET", query))
        time.sleep(1.0)  # read nothing yet: the socket buffers fill, the server must wait
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200 and len(body) == length and body == data[off:off + length]
    empty = f"{path}?off=0&len=0"  # an empty range: headers, no body
    assert _get(run_dir, empty, _signed(run_dir, "GET", empty)) == (200, b"")
