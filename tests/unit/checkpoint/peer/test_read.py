"""The restore's peer tier over loopback, with real partner servers and real HDF5 shards: a
checkpoint on no tier 1 restored on another node from the owner's tier 0 or from the copy its
partner holds, every byte checked, a corrupt or missing copy never used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.checkpoint.peer.push import PeerClient, PushTarget, push_round
from hpcrun.checkpoint.peer.read import PeerShards, RangeFile
from hpcrun.checkpoint.peer.server import PartnerServer
from hpcrun.control.entries import FaultPayload, decode
from hpcrun.control.log import RunLog, new_holder

from ..conftest import same_state, trained


def _layout(node: str) -> Layout:
    return Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node=node)


@pytest.fixture
def servers(run_dir: Path, tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Start a node's partner server over its own tier-0 directory; that directory."""
    with ExitStack() as stack:
        def start(node: str) -> Path:
            nvme = tmp_path / f"nvme-{node}"
            stack.enter_context(PartnerServer(run_dir, node=node, host="127.0.0.1",
                                              node_local_root=nvme, log=RunLog(run_dir)))
            return nvme
        yield start


@pytest.fixture
def checkpointer(run_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Checkpointer]]:
    """A new generation's single-rank Checkpointer on ``node``, with the peer tier of ``gang``
    (None: without one)."""
    made: list[Checkpointer] = []
    log = RunLog(run_dir)

    def make(node: str, gang: tuple[str, ...] | None = None) -> Checkpointer:
        holder = new_holder()
        fence = log.claim(holder)
        nvme = tmp_path / f"nvme-{node}"
        peers = None if gang is None else PeerShards(run_dir=run_dir, node=node, gang=gang,
                                                     node_local_root=nvme, log=log)
        made.append(Checkpointer(
            identity=CheckpointIdentity(run_id=run_dir.name, spec_id="s", dataset_id="d",
                                        generation=fence.generation, holder=holder),
            layout=_layout(node), log=log, fence_slot=fence.slot, peers=peers,
            tiers=TierLayout(run_dir=run_dir, node_local_root=nvme)))
        return made[-1]

    yield make
    for ck in made:
        ck.close()


def _save(checkpointer: Callable[..., Checkpointer], step: int) -> tuple[Checkpointer, str]:
    ck = checkpointer("node0")
    model, opt = trained(step)
    return ck, ck.save(step, {"model": model, "optim": opt}, blocking=True).ckpt_id


def _restore(ck: Checkpointer) -> tuple[object, dict]:
    model, opt = trained(99)
    return ck.restore({"model": model, "optim": opt}), model.state_dict()


def test_a_shard_on_the_owners_tier0_is_restored_on_another_node_through_the_peer_tier(
        run_dir: Path, servers, checkpointer) -> None:
    servers("node0")
    _, ckpt = _save(checkpointer, 3)
    assert not list(run_dir.rglob("*.h5"))  # on node0's tier 0 only, nothing on tier 1
    assert _restore(checkpointer("node2"))[0] is None  # no peer tier: nothing readable
    result, state = _restore(checkpointer("node2", gang=("node2", "node0")))
    assert result is not None and (result.ckpt_id, result.tier) == (ckpt, "peer")
    assert result.peer_bytes == result.bytes_read > 0
    assert same_state(state, trained(3)[0].state_dict())


def test_a_lost_nodes_shards_are_read_from_the_copy_its_partner_holds(
        run_dir: Path, tmp_path: Path, servers, checkpointer) -> None:
    nvme1 = servers("node1")
    ck, ckpt = _save(checkpointer, 4)
    assert push_round(PushTarget(run_dir=run_dir, node="node0", partner="node1",
                                 node_local_root=tmp_path / "nvme-node0",
                                 generation=ck.id.generation, holder=ck.id.holder),
                      RunLog(run_dir)) == ckpt
    # node0 is lost (no server, its disk gone); node2 took its place beside node1
    result, state = _restore(checkpointer("node2", gang=("node1", "node2")))
    assert result is not None and (result.ckpt_id, result.tier) == (ckpt, "peer")
    assert same_state(state, trained(4)[0].state_dict())
    # the holder itself reads the copy from its own disk
    result, state = _restore(checkpointer("node1", gang=("node1", "node2")))
    assert result is not None and (result.ckpt_id, result.tier) == (ckpt, "node_local")
    assert result.peer_bytes == 0 and result.bytes_read > 0
    assert same_state(state, trained(4)[0].state_dict())

    # a bit flipped in a tensor's bytes on the holder's disk: the copy fails its checksum and
    # is never used
    [held] = nvme1.rglob("rank-00000.h5")
    offset = _last_byte_of_largest_dataset(held)
    data = bytearray(held.read_bytes())
    data[offset] ^= 0xFF
    held.write_bytes(bytes(data))
    assert _restore(checkpointer("node2", gang=("node1", "node2")))[0] is None
    faults = [p for e in RunLog(run_dir).read() if e.kind == "fault"
              and isinstance(p := decode(e), FaultPayload)]
    assert any("node1:" in f.detail and "checksum" in f.detail for f in faults), faults


def _last_byte_of_largest_dataset(path: Path) -> int:
    """File offset of the last byte of the file's largest contiguous dataset."""
    found: list[tuple[int, int]] = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _, obj: found.append((obj.id.get_storage_size(), obj.id.get_offset()))
                     if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None
                     else None)
    size, offset = max(found)
    return offset + size - 1


def test_a_range_file_reads_a_peers_hdf5_file_as_h5py_does_a_local_one(
        run_dir: Path, tmp_path: Path, servers) -> None:
    nvme = servers("node0")
    ckpt = "g000001-s0000000001-x"
    path = nvme / run_dir.name / "ckpt" / ckpt / "node0" / "rank-00000.h5"
    path.parent.mkdir(parents=True)
    data = np.arange(300_000, dtype=np.int64)
    with h5py.File(path, "w") as f:
        f.create_dataset("a/b", data=data)
        f.attrs["format"] = "x"
    client = PeerClient(run_dir, "node0")
    rel = f"{ckpt}/node0/rank-00000.h5"
    size = client.get_into(rel, 0, np.empty(0, dtype=np.uint8))
    assert size == path.stat().st_size
    with h5py.File(RangeFile(client, rel, size, block=4096), "r") as f:
        assert f.attrs["format"] == "x" and np.array_equal(f["a/b"][()], data)
