"""Tier 0 → tier 1: drain with cold-read verification, tier-1 commit, restore after node loss."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrun.checkpoint import Tier, drain_pending, finalize_tier1, fold_checkpoints
from hpcrun.checkpoint.retention import collect_run
from hpcrun.control.entries import CommitPayload, decode_as
from hpcrun.control.log import EntryKind, RunLog

from .conftest import same_state, trained


def _save(ck, step: int) -> str:
    model, opt = trained(step)
    return ck.save(step, {"model": model, "optim": opt}, blocking=True).ckpt_id


def test_drain_finalize_and_restore_after_node_loss(run_dir: Path, tmp_path: Path, log: RunLog,
                                                    incarnation) -> None:
    nvme = tmp_path / "nvme"
    ck = incarnation(node_local_root=nvme)
    first = _save(ck, 1)
    assert fold_checkpoints(log.read())[0].tiers == {Tier.NODE_LOCAL}
    assert not list((run_dir / "ckpt" / first).rglob("*.h5"))  # only the manifest is shared

    gen, holder = ck.id.generation, ck.id.holder
    assert drain_pending(run_dir, nvme, node="node0", log=log, generation=gen,
                         holder=holder) == [first]
    assert drain_pending(run_dir, nvme, node="node0", log=log, generation=gen,
                         holder=holder) == []  # idempotent
    assert finalize_tier1(run_dir, log=log, generation=gen, holder=holder) == [first]
    assert fold_checkpoints(log.read())[0].tiers == {Tier.NODE_LOCAL, Tier.SHARED}
    # one COMMIT shape on every tier: the tier-1 copy names the run and the saving generation
    tier0, tier1 = [decode_as(e, CommitPayload) for e in log.read() if e.kind == EntryKind.COMMIT]
    assert tier1 == replace(tier0, tier=Tier.SHARED) and tier1.run_id and tier1.generation == gen

    model, opt = trained(5)
    assert incarnation(node_local_root=nvme).restore({"model": model, "optim": opt}).tier == \
        "node_local"
    shutil.rmtree(nvme)  # the node is gone, and its tier 0 with it
    result = incarnation(node_local_root=nvme).restore({"model": model, "optim": opt})
    assert result is not None and (result.ckpt_id, result.tier) == (first, "shared")
    assert same_state(model.state_dict(), trained(1)[0].state_dict())


def test_corrupt_tier0_copy_is_not_drained(run_dir: Path, tmp_path: Path, log: RunLog,
                                           incarnation) -> None:
    nvme = tmp_path / "nvme"
    ck = incarnation(node_local_root=nvme)
    first = _save(ck, 1)
    [shard] = (nvme / "run1" / "ckpt" / first).rglob("rank-*.h5")
    data = bytearray(shard.read_bytes())
    data[len(data) * 2 // 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert drain_pending(run_dir, nvme, node="node0", log=log, generation=ck.id.generation,
                         holder=ck.id.holder) == []
    entries = log.read()
    assert EntryKind.DRAINED not in [e.kind for e in entries]
    # a background incident for status to report, not a gang fault that would stop training
    assert entries[-1].kind == EntryKind.NOTE and entries[-1].payload["event"] == "drain_error"
    assert "checksum" in entries[-1].payload["detail"]


def test_tier0_copy_deleted_only_after_tier1_commit(run_dir: Path, tmp_path: Path, log: RunLog,
                                                    incarnation) -> None:
    nvme = tmp_path / "nvme"
    ck = incarnation(node_local_root=nvme)
    ids = [_save(ck, s) for s in (1, 2, 3)]
    local = (nvme, "run1")
    report = collect_run(run_dir, log=log, keep_last=2, now=0.0, local=local)
    assert report.retired == ()  # nothing is durable on tier 1 yet
    gen, holder = ck.id.generation, ck.id.holder
    drain_pending(run_dir, nvme, node="node0", log=log, generation=gen, holder=holder)
    finalize_tier1(run_dir, log=log, generation=gen, holder=holder)
    report = collect_run(run_dir, log=log, keep_last=2, now=0.0, local=local)
    assert report.retired == (ids[0],)
    assert sorted(p.name for p in (nvme / "run1" / "ckpt").iterdir()) == ids[1:]


def _ck(step: int, *, drained: tuple[str, ...] = (), shared: bool = False):
    from hpcrun.checkpoint.tiers import CommittedCheckpoint
    tiers = {Tier.NODE_LOCAL} | ({Tier.SHARED} if shared else set())
    return CommittedCheckpoint(ckpt_id=f"c{step}", step=step, generation=1, manifest="m",
                               digest="d", bytes=1, nodes=("a", "b"), slot=step,
                               committed_at=0.0, tiers=frozenset(tiers),
                               drained=frozenset(drained))


def test_partially_drained_checkpoint_is_finished_before_the_newest() -> None:
    from hpcrun.checkpoint.drain import pending_drains
    # node a drained c2 while c3 committed: b finishes c2 first (tier 1 gets a whole checkpoint),
    # with c3 as the fallback when b's copy of c2 is gone
    cks = [_ck(1, drained=("a", "b"), shared=True), _ck(2, drained=("a",)), _ck(3)]
    assert [c.ckpt_id for c in pending_drains(cks, "b")] == ["c2", "c3"]
    assert [c.ckpt_id for c in pending_drains(cks, "a")] == ["c3"]
    # superseded: older than the newest checkpoint on tier 1
    cks = [_ck(1, drained=("a",)), _ck(2, drained=("a", "b"), shared=True), _ck(3)]
    assert [c.ckpt_id for c in pending_drains(cks, "b")] == ["c3"]
    assert pending_drains([_ck(1, drained=("a", "b"), shared=True)], "b") == []


def test_the_final_drains_wait_follows_the_bytes_left_and_the_measured_rate(
        log: RunLog) -> None:
    """The bytes left are the newest tier-0 checkpoint's shards on nodes that have not drained
    it; the rate is the median of the DRAINED entries' measurements (a prior before any); the
    wait is twice their quotient, at least 10 s, at most what is left of the grace."""
    from hpcrun.checkpoint.drain import (
        DRAIN_RATE_PRIOR,
        drain_rate,
        drain_wait_s,
        pending_bytes,
    )

    cks = [replace(_ck(1, drained=("a", "b"), shared=True), bytes=800),
           replace(_ck(2, drained=("a",)), bytes=1000)]
    assert pending_bytes(cks) == 500 and pending_bytes(cks, "b") == 500
    assert pending_bytes(cks, "a") == 0 and pending_bytes(cks[:1]) == 0
    gen = log.claim("h").generation
    assert drain_rate(log.read()) == DRAIN_RATE_PRIOR
    for nbytes, seconds in ((4e8, 2.0), (0, 0.0), (3e8, 1.0), (1e8, 1.0)):
        log.publish(EntryKind.DRAINED, generation=gen, holder="h",
                    payload={"ckpt_id": "c", "node": "a", "bytes": int(nbytes),
                             "seconds": seconds})
    log.publish(EntryKind.DRAINED, generation=gen, holder="h",
                payload={"ckpt_id": "c", "node": "b"})  # written before the measurement
    assert drain_rate(log.read()) == 2e8  # the median of 2e8, 3e8, 1e8
    assert drain_wait_s(4_000_000_000, 2e8, cap_s=120.0) == 40.0
    assert drain_wait_s(1_000, 2e8, cap_s=120.0) == 10.0  # the floor
    assert drain_wait_s(4_000_000_000, 2e8, cap_s=25.0) == 25.0  # the grace left
    assert drain_wait_s(4_000_000_000, 2e8, cap_s=-3.0) == 0.0


@pytest.mark.parametrize("last", [False, True])
def test_background_round_drains_one_and_the_last_round_everything(
        run_dir: Path, tmp_path: Path, log: RunLog, incarnation, last: bool) -> None:
    nvme = tmp_path / "nvme"
    ck = incarnation(node_local_root=nvme)
    older, newest = _save(ck, 1), _save(ck, 2)
    gen, holder = ck.id.generation, ck.id.holder
    # another node already drained the older one: finishing it comes first
    log.publish(EntryKind.DRAINED, generation=gen, holder=holder,
                payload={"ckpt_id": older, "node": "node1"})
    kw = {"node": "node0", "log": log, "generation": gen, "holder": holder}
    if last:  # an incarnation's last round leaves the newest (its stop commit) on tier 1 too
        assert drain_pending(run_dir, nvme, **kw, limit=None) == [older, newest]
    else:
        assert drain_pending(run_dir, nvme, **kw) == [older]


def test_a_superseded_checkpoint_drained_late_is_not_committed_on_tier_1(log: RunLog) -> None:
    """Node b drained the newest checkpoint in its background round and the older one in its
    last round; by then node 0 had committed the newest on tier 1: the older one stays off
    tier 1, so the newest is the last tier-1 commit."""
    holder = "h1"
    gen = log.claim(holder).generation
    ids = {step: f"g000001-s{step:010d}-job1.r0." for step in (250, 260)}

    def publish(kind: EntryKind, **payload: object) -> None:
        log.publish(kind, generation=gen, holder=holder, payload=payload)

    for step, ckpt_id in ids.items():
        publish(EntryKind.COMMIT, ckpt_id=ckpt_id, step=step, tier="node_local",
                manifest=f"ckpt/{ckpt_id}/manifest.json", digest="0" * 64, bytes=1,
                nodes=["a", "b"], generation=gen, run_id="run1")
    for ckpt_id, node in ((ids[250], "a"), (ids[260], "b"), (ids[260], "a")):
        publish(EntryKind.DRAINED, ckpt_id=ckpt_id, node=node)
    assert finalize_tier1(Path("run1"), log=log, generation=gen, holder=holder) == [ids[260]]
    publish(EntryKind.DRAINED, ckpt_id=ids[250], node="b")  # b's last round, begun earlier
    assert finalize_tier1(Path("run1"), log=log, generation=gen, holder=holder) == []
    shared = [decode_as(e, CommitPayload).step for e in log.read()
              if e.kind == EntryKind.COMMIT and e.payload["tier"] == "shared"]
    assert shared == [260]
