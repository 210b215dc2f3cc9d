"""Partner copies between agents over loopback: a node's tier-0 shards pushed to its partner,
verified there, and restored on a replacement node from the partner's copy, with no tier 1.
"""

from __future__ import annotations

import http.client
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.peer.push import (
    PeerClient,
    PushTarget,
    fetch_ranges,
    push_loop,
    push_round,
    serves_peers,
    wanted,
)
from hpcrun.checkpoint.peer.read import PeerShards, RemoteShard
from hpcrun.checkpoint.peer.server import (
    AUTH_HEADER,
    TS_HEADER,
    PartnerServer,
    peer_address,
    run_secret,
    sign,
)
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.control.entries import PartnerCopyNote, decode
from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import RunLog, new_holder
from hpcrun.control.spec import RunSpec
from hpcrun.errors import StaleGenerationError
from hpcrun.vocab import Tier

from ..conftest import same_state, trained

LOST = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="node0")
SPARE = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="node2")


@pytest.fixture
def log(run_dir: Path) -> RunLog:
    return RunLog(run_dir)


@pytest.fixture
def incarnation(run_dir: Path, log: RunLog) -> Iterator[Callable[..., Checkpointer]]:
    """Claim a new generation; a single-rank Checkpointer of it on the given node's tier 0."""
    made: list[Checkpointer] = []

    def make(*, node_local_root: Path, layout: Layout,
             gang: tuple[str, ...] | None = None) -> Checkpointer:
        holder = new_holder()
        fence = log.claim(holder)
        ident = CheckpointIdentity(run_id="run1", spec_id="spec1", dataset_id="ds1",
                                   generation=fence.generation, holder=holder)
        peers = None if gang is None else PeerShards(
            run_dir=run_dir, node=layout.node, gang=gang, node_local_root=node_local_root,
            log=log)
        made.append(Checkpointer(identity=ident, layout=layout, log=log, fence_slot=fence.slot,
                                 tiers=TierLayout(run_dir=run_dir,
                                                  node_local_root=node_local_root),
                                 peers=peers))
        return made[-1]

    yield make
    for ck in made:
        ck.close()


def _notes(log: RunLog, cls: type) -> list:
    """The notes of ``cls`` that count under fencing."""
    _, valid = fold_fences(log.read())
    return [p for e in valid if e.kind == "note" and isinstance(p := decode(e), cls)]


@pytest.fixture
def holder(run_dir: Path, log: RunLog, tmp_path: Path):
    with PartnerServer(run_dir, node="node1", host="127.0.0.1",
                       node_local_root=tmp_path / "nvme1", log=log) as server:
        yield server


def _saved(incarnation, nvme: Path, step: int):
    ck = incarnation(node_local_root=nvme, layout=LOST)
    model, opt = trained(step)
    return ck, ck.save(step, {"model": model, "optim": opt}, blocking=True).ckpt_id


def _push(run_dir: Path, log: RunLog, ck, nvme: Path) -> str | None:
    return push_round(PushTarget(run_dir=run_dir, node="node0", partner="node1",
                                 node_local_root=nvme, generation=ck.id.generation,
                                 holder=ck.id.holder), log)


def test_a_lost_nodes_shards_come_back_from_its_partner_without_tier1(
        run_dir: Path, log: RunLog, tmp_path: Path, incarnation, holder) -> None:
    nvme0, nvme2 = tmp_path / "nvme0", tmp_path / "nvme2"
    ck, first = _saved(incarnation, nvme0, 1)
    _, newest = _saved(incarnation, nvme0, 2)
    with pytest.raises(StaleGenerationError):  # generation 1 was fenced out by the next
        _push(run_dir, log, ck, nvme0)
    ck2 = incarnation(node_local_root=nvme0, layout=LOST)
    assert _push(run_dir, log, ck2, nvme0) == newest
    assert _push(run_dir, log, ck2, nvme0) is None  # held already: not copied again
    [note] = _notes(log, PartnerCopyNote)
    src = nvme0 / "run1" / "ckpt" / newest / "node0" / "rank-00000.h5"
    kept = tmp_path / "nvme1" / "run" / "partner" / newest / "node0" / "rank-00000.h5"
    assert (note.ckpt_id, note.owner, note.held_by, note.complete) == (newest, "node0", "node1",
                                                                        True)
    assert note.bytes == src.stat().st_size and kept.read_bytes() == src.read_bytes()
    assert all(Tier.SHARED not in c.tiers for c in fold_checkpoints(log.read()))

    # node0 is lost with its tier 0; node2 takes its place and its ranks, and reads node0's
    # shards from node1's copy (nothing lands on node2's disk)
    model, opt = trained(9)
    result = incarnation(node_local_root=nvme2, layout=SPARE, gang=("node2", "node1")).restore(
        {"model": model, "optim": opt})
    assert result is not None and (result.ckpt_id, result.tier) == (newest, "peer")
    assert result.peer_bytes == result.bytes_read > 0
    assert same_state(model.state_dict(), trained(2)[0].state_dict())
    assert first != newest and not list(nvme2.rglob("*.h5"))


def test_the_pusher_copies_each_tier0_commit_as_it_lands_until_fenced_out(
        run_dir: Path, log: RunLog, tmp_path: Path, incarnation, holder) -> None:
    nvme0 = tmp_path / "nvme0"
    ck = incarnation(node_local_root=nvme0, layout=LOST)
    target = PushTarget(run_dir=run_dir, node="node0", partner="node1", node_local_root=nvme0,
                        generation=ck.id.generation, holder=ck.id.holder)
    stop, done = threading.Event(), []
    pusher = threading.Thread(target=lambda: done.append(
        push_loop(target, RunLog(run_dir), stop, poll_s=0.05)))
    pusher.start()
    try:
        for step in (1, 2):  # no drain ever runs: each copy follows its tier-0 commit alone
            model, opt = trained(step)
            ckpt = ck.save(step, {"model": model, "optim": opt}, blocking=True).ckpt_id
            _wait_for(lambda c=ckpt: c in {n.ckpt_id for n in _notes(log, PartnerCopyNote)})
        notes = _notes(log, PartnerCopyNote)
        assert all(n.complete and n.held_by == "node1" for n in notes) and len(notes) == 2
        assert all(Tier.SHARED not in c.tiers for c in fold_checkpoints(log.read()))
        incarnation(node_local_root=nvme0, layout=LOST)  # a newer generation fences node0 out
        _saved(incarnation, nvme0, 3)
        pusher.join(timeout=30)
        assert done == [False]  # the pusher stopped on its own: fenced
    finally:
        stop.set()
        pusher.join(timeout=30)


def _wait_for(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``cond`` until it holds (the pusher is another thread: no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_incomplete_copy_is_recorded_and_never_read(
        run_dir: Path, log: RunLog, tmp_path: Path, incarnation) -> None:
    nvme0, nvme2 = tmp_path / "nvme0", tmp_path / "nvme2"
    _, ckpt = _saved(incarnation, nvme0, 1)
    ck = incarnation(node_local_root=nvme0, layout=LOST)
    assert _push(run_dir, log, ck, nvme0) is None  # node1 serves nothing: no address
    [note] = _notes(log, PartnerCopyNote)
    assert (note.ckpt_id, note.complete) == (ckpt, False) and "node1" in note.detail
    model, opt = trained(9)
    spare = incarnation(node_local_root=nvme2, layout=SPARE, gang=("node2", "node1"))
    assert spare.restore({"model": model, "optim": opt}) is None


def _request(run_dir: Path, method: str, path: str, headers: dict[str, str]) -> int:
    host, port = peer_address(run_dir, "node1")
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, body=b"" if method == "PUT" else None,
                     headers={"Content-Length": "0", **headers})
        return conn.getresponse().status
    finally:
        conn.close()


def test_unsigned_or_forged_requests_and_escaping_paths_are_refused(
        run_dir: Path, holder) -> None:
    secret = run_secret(run_dir)
    assert stat.S_IMODE(os.stat(run_dir / "partner" / "secret").st_mode) == 0o600
    path = "/v1/copy/g000001-s0000000001-x/node0/rank-00000.h5"
    assert _request(run_dir, "GET", path, {}) == 403
    ts = "1700000000.0"  # long ago: a replayed request
    assert _request(run_dir, "GET", path, {TS_HEADER: ts,
                                           AUTH_HEADER: sign(secret, "GET", path, 0, ts)}) == 403
    ts = f"{time.time():.3f}"
    assert _request(run_dir, "GET", path, {TS_HEADER: ts,
                                           AUTH_HEADER: sign(b"wrong", "GET", path, 0, ts)}) == 403
    bad = "/v1/copy/../../secret/x/rank-00000.h5"
    assert _request(run_dir, "GET", bad, {TS_HEADER: ts,
                                          AUTH_HEADER: sign(secret, "GET", bad, 0, ts)}) == 404
    assert _request(run_dir, "PUT", bad, {TS_HEADER: ts,
                                          AUTH_HEADER: sign(secret, "PUT", bad, 0, ts)}) == 422


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 10 * 4096 + 7, 123_456_789])
def test_fetch_ranges_cover_the_shard_once_in_aligned_pieces(size: int) -> None:
    pieces = fetch_ranges(size, streams=8, least=4096)
    assert pieces[0][0] == 0 and sum(n for _, n in pieces) == size
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(pieces))
    assert all(off % 4096 == 0 for off, _ in pieces) and len(pieces) <= 8


def test_a_shard_read_from_a_peer_over_parallel_streams_is_byte_identical(
        run_dir: Path, log: RunLog, tmp_path: Path, incarnation, holder) -> None:
    nvme0 = tmp_path / "nvme0"
    _, ckpt = _saved(incarnation, nvme0, 3)
    ck = incarnation(node_local_root=nvme0, layout=LOST)
    assert _push(run_dir, log, ck, nvme0) == ckpt
    committed = {c.ckpt_id: c for c in fold_checkpoints(log.read())}
    shard = read_manifest(run_dir, committed[ckpt]).shards[0]
    assert len(fetch_ranges(shard.bytes, least=4096)) > 1
    remote = RemoteShard(PeerClient(run_dir, "node1"), f"{ckpt}/{shard.path}", least=4096)
    src = nvme0 / "run1" / "ckpt" / ckpt / shard.path
    got = np.zeros(shard.bytes, dtype=np.uint8)
    remote.read_into([(0, got[:100]), (100, got[100:])])
    assert remote.size() == src.stat().st_size and got.tobytes() == src.read_bytes()


@pytest.mark.parametrize(("resources", "membership", "copies", "peers"), [
    ({"nodes": 1}, None, False, False),                        # one node: nothing to ask
    ({"nodes": 2}, None, True, True),                          # a gang: copies, tier 0 served
    ({"nodes": 1, "spare_nodes": 1}, None, True, True),        # a spare: copies to restore from
    ({"nodes": 3}, {"mode": "elastic", "min_nodes": 2}, True, True),  # a shrink reads them too
])
def test_which_runs_keep_partner_copies_and_read_through_the_peer_tier(
        tmp_path: Path, resources: dict, membership: dict | None, copies: bool,
        peers: bool) -> None:
    raw = {"name": "t", "entrypoint": "m:f", "resources": resources}
    spec = RunSpec.from_dict({**raw, "membership": membership} if membership else raw)
    assert (wanted(spec, tmp_path), serves_peers(spec, tmp_path)) == (copies, peers)
    assert (wanted(spec, None), serves_peers(spec, None)) == (False, False)  # no tier 0
