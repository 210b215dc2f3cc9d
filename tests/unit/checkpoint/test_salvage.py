"""A node lost before it drained: its partner drains the copy it holds on the lost node's behalf,
so the newest checkpoint becomes whole on tier 1 and a restore on other nodes reads it; every
drain copy's bytes are under the shared tier's deadline."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from hpcrun.checkpoint import Tier, finalize_tier1, fold_checkpoints
from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.drain import copy_verified, salvage_lost, salvageable
from hpcrun.checkpoint.peer.ledger import partner_root
from hpcrun.control.entries import PartnerCopyNote
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.errors import StorageTimeoutError
from hpcrun.storage import LOCAL_STORAGE, DeadlineStorage, FaultyStorage

from .conftest import same_state, trained


def _lost_node_with_a_partner_copy(run_dir: Path, tmp_path: Path, log: RunLog, incarnation,
                                   *, complete: bool = True) -> tuple[object, str, Path]:
    """node0 commits step 3 on its tier 0, its partner node1 holds a copy, node0 is lost."""
    nvme, partner = tmp_path / "nvme0", tmp_path / "nvme1"
    ck = incarnation(node_local_root=nvme)
    model, opt = trained(3)
    ckpt_id = ck.save(3, {"model": model, "optim": opt}, blocking=True).ckpt_id
    shutil.copytree(nvme / "run1" / "ckpt" / ckpt_id, partner_root(partner, "run1") / ckpt_id)
    log.append_entry(PartnerCopyNote(ckpt_id=ckpt_id, owner="node0", held_by="node1", bytes=1,
                                     complete=complete),
                     generation=ck.id.generation, holder=ck.id.holder)
    shutil.rmtree(nvme)  # the node is gone, and its tier 0 with it
    return ck, ckpt_id, partner


def test_the_partner_drains_a_lost_nodes_copy_and_tier_1_restores_the_newest_commit(
        run_dir: Path, tmp_path: Path, log: RunLog, incarnation) -> None:
    ck, ckpt_id, partner = _lost_node_with_a_partner_copy(run_dir, tmp_path, log, incarnation)
    gen, holder = ck.id.generation, ck.id.holder
    kw = {"node": "node1", "log": log, "generation": gen, "holder": holder}
    assert salvage_lost(run_dir, partner, lost=["node2"], **kw) == []  # not a node it holds
    assert salvage_lost(run_dir, partner, lost=["node0"], **kw) == ["node0"]
    drained = [e for e in log.read() if e.kind == EntryKind.DRAINED]
    assert [e.payload["node"] for e in drained] == ["node0"]  # on the owner's behalf
    assert salvage_lost(run_dir, partner, lost=["node0"], **kw) == []  # idempotent
    assert finalize_tier1(run_dir, log=log, generation=gen, holder=holder) == [ckpt_id]
    assert fold_checkpoints(log.read())[0].tiers == {Tier.NODE_LOCAL, Tier.SHARED}

    model, opt = trained(9)
    result = incarnation(node_local_root=tmp_path / "fresh").restore(
        {"model": model, "optim": opt})
    assert result is not None and (result.ckpt_id, result.tier, result.step) == \
        (ckpt_id, "shared", 3)
    assert same_state(model.state_dict(), trained(3)[0].state_dict())


def test_an_incomplete_copy_is_not_salvaged(run_dir: Path, tmp_path: Path, log: RunLog,
                                            incarnation) -> None:
    ck, _, partner = _lost_node_with_a_partner_copy(run_dir, tmp_path, log, incarnation,
                                                    complete=False)
    assert salvageable(log.read(), node="node1", lost=["node0"])[1] == []
    assert salvage_lost(run_dir, partner, node="node1", lost=["node0"], log=log,
                        generation=ck.id.generation, holder=ck.id.holder) == []
    assert EntryKind.DRAINED not in [e.kind for e in log.read()]


def test_a_corrupt_copy_is_noted_not_drained(run_dir: Path, tmp_path: Path, log: RunLog,
                                            incarnation) -> None:
    ck, ckpt_id, partner = _lost_node_with_a_partner_copy(run_dir, tmp_path, log, incarnation)
    [shard] = (partner_root(partner, "run1") / ckpt_id).rglob("rank-*.h5")
    data = bytearray(shard.read_bytes())
    data[len(data) * 2 // 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert salvage_lost(run_dir, partner, node="node1", lost=["node0"], log=log,
                        generation=ck.id.generation, holder=ck.id.holder) == []
    last = log.read()[-1]
    assert EntryKind.DRAINED not in [e.kind for e in log.read()]
    assert last.payload["event"] == "drain_error" and "node0" in last.payload["detail"]


def _one_shard_to_drain(run_dir: Path, tmp_path: Path, log: RunLog, incarnation):
    """A committed one-shard checkpoint on tier 0: (id, manifest, shard record, its file, where
    a drain puts it)."""
    nvme = tmp_path / "nvme0"
    ck = incarnation(node_local_root=nvme)
    model, opt = trained(3)
    ckpt_id = ck.save(3, {"model": model, "optim": opt}, blocking=True).ckpt_id
    [ckpt] = fold_checkpoints(log.read())
    m = read_manifest(run_dir, ckpt)
    [rec] = m.shards
    src, dst = nvme / "run1" / "ckpt" / ckpt_id / rec.path, tmp_path / "tier1" / rec.path
    return ckpt_id, m, rec, src, dst


def test_a_drain_copy_blocked_writing_its_bytes_fails_at_the_deadline_and_retries_clean(
        run_dir: Path, tmp_path: Path, log: RunLog, incarnation) -> None:
    """A hung OST stalls the shard's bytes, not only the metadata around them: the copy fails
    at the tier's deadline (the drain retries it next round), nothing lands at the target, and
    the same copy succeeds once the tier answers."""
    ckpt_id, m, rec, src, dst = _one_shard_to_drain(run_dir, tmp_path, log, incarnation)
    fifo = tmp_path / "hung-ost"
    os.mkfifo(fifo)
    stalled = FaultyStorage(LOCAL_STORAGE, mode="stall", while_path=str(fifo),
                            ops=("write_data",))
    started = time.monotonic()
    with pytest.raises(StorageTimeoutError, match=r"write_data .* did not finish within"):
        copy_verified(src, dst, rec, ckpt_id=ckpt_id, algorithm=m.checksum,
                      storage=DeadlineStorage(stalled, deadline_s=0.5))
    assert time.monotonic() - started < 5.0 and not dst.exists()
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the tier answers again
    fifo.unlink()
    os.close(writer)
    copy_verified(src, dst, rec, ckpt_id=ckpt_id, algorithm=m.checksum,
                  storage=DeadlineStorage(stalled, deadline_s=30))
    assert dst.read_bytes() == src.read_bytes()


def test_two_drainers_of_one_shard_at_once_both_succeed_and_leave_only_the_shard(
        run_dir: Path, tmp_path: Path, log: RunLog, incarnation) -> None:
    """A stale node's drain retry beside the new incarnation's salvage of the same shard: each
    copies through its own temporary file, so neither writes into or renames away the other's."""
    ckpt_id, m, rec, src, dst = _one_shard_to_drain(run_dir, tmp_path, log, incarnation)
    both = threading.Barrier(2)

    class Together:  # both copies are between their write and their rename at the same time
        def __getattr__(self, name: str):
            return getattr(LOCAL_STORAGE, name)

        def rename(self, a, b) -> None:
            both.wait(timeout=30)
            LOCAL_STORAGE.rename(a, b)

    errors: list[BaseException] = []

    def drain() -> None:
        try:
            copy_verified(src, dst, rec, ckpt_id=ckpt_id, algorithm=m.checksum,
                          storage=Together())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dst.parent.iterdir()) == [dst.name]
