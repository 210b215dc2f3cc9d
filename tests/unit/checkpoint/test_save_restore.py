"""Single-rank save/restore: round trips, integrity, fencing, retention (real files)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrun.checkpoint import fold_checkpoints
from hpcrun.checkpoint.retention import collect_run
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.errors import NonFiniteError, StaleGenerationError

from .conftest import Model, same_state, trained


def _state(seed: int) -> dict:
    model, opt = trained(seed)
    return {"model": model, "optim": opt, "cursor": {"position": seed * 10, "epoch": 1}}


def _shard_files(run_dir: Path, ckpt_id: str) -> list[Path]:
    return sorted((run_dir / "ckpt" / ckpt_id).rglob("rank-*.h5"))


def test_round_trip_restores_every_state_family_and_rng(incarnation) -> None:
    saved = _state(1)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    ck = incarnation()
    res = ck.save(3, saved, extra={"tokens": 123}, blocking=True)
    assert res is not None and res.committed and res.bytes > 0 and res.pause_s >= 0
    expect_rng = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    fresh = _state(2)
    result = incarnation().restore(fresh)
    assert result is not None and (result.step, result.tier, result.extra) == (3, "shared",
                                                                             {"tokens": 123})
    assert same_state(saved["model"].state_dict(), fresh["model"].state_dict())
    assert same_state(saved["optim"].state_dict(), fresh["optim"].state_dict())
    assert fresh["cursor"] == {"position": 10, "epoch": 1}
    assert fresh["model"].emb.dtype == torch.bfloat16
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expect_rng


def test_shard_is_plain_hdf5_with_true_dtype_and_checksums(run_dir, incarnation) -> None:
    saved = _state(1)
    res = incarnation().save(1, saved, blocking=True)
    [path] = _shard_files(run_dir, res.ckpt_id)
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "hpcrun-shard" and f.attrs["schema_version"] == 2
        assert f.attrs["step"] == 1 and f.attrs["rank"] == 0
        emb = f["model/emb"]
        assert emb.dtype == np.uint16 and emb.attrs["dtype"] == "bfloat16"
        assert emb.attrs["checksum"].startswith("xxh3:")
        got = torch.from_numpy(emb[()]).view(torch.bfloat16)
        assert torch.equal(got, saved["model"].emb.detach())
        assert np.array_equal(f["model/lin.weight"][()], saved["model"].lin.weight.detach().numpy())


def test_fresh_start_returns_none(incarnation) -> None:
    assert incarnation().restore(_state(1)) is None


def test_stale_generation_cannot_publish(log: RunLog, incarnation) -> None:
    old = incarnation()
    old.save(1, _state(1), blocking=True)
    new = incarnation()  # a newer incarnation fences the old one out
    with pytest.raises(StaleGenerationError):
        old.save(2, _state(2), blocking=True)
    committed = fold_checkpoints(log.read())
    assert [c.step for c in committed] == [1]
    restored = _state(3)
    assert new.restore(restored).step == 1
    assert same_state(restored["model"].state_dict(), _state(1)["model"].state_dict())


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_shard_is_never_loaded_previous_restored(run_dir, log, incarnation,
                                                         damage: str) -> None:
    ck = incarnation()
    ck.save(1, _state(1), blocking=True)
    second = ck.save(2, _state(2), blocking=True)
    [path] = _shard_files(run_dir, second.ckpt_id)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) * 2 // 3] ^= 0x10  # inside a tensor's bytes
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))

    restored = _state(9)
    result = incarnation().restore(restored)
    assert result is not None and result.step == 1 and result.skipped == (second.ckpt_id,)
    assert same_state(restored["model"].state_dict(), _state(1)["model"].state_dict())
    faults = [e for e in log.read() if e.kind == EntryKind.FAULT]
    assert faults and faults[-1].payload["fault"] == "storage_error"
    assert faults[-1].payload["ckpt_id"] == second.ckpt_id


def test_nan_is_refused_with_a_nonfinite_fault(log, incarnation) -> None:
    ck = incarnation()
    ck.save(1, _state(1), blocking=True)
    bad = _state(2)
    with torch.no_grad():
        bad["model"].lin.weight[3, 4] = float("nan")
    with pytest.raises(NonFiniteError, match=r"lin\.weight"):
        ck.save(2, bad, blocking=True)
    assert [c.step for c in fold_checkpoints(log.read())] == [1]
    fault = [e for e in log.read() if e.kind == EntryKind.FAULT][-1]
    assert fault.payload["fault"] == "nonfinite" and fault.payload["step"] == 2


def test_sha256_checksums_selectable(run_dir, incarnation) -> None:
    res = incarnation(checksum="sha256").save(1, _state(1), blocking=True)
    [path] = _shard_files(run_dir, res.ckpt_id)
    with h5py.File(path, "r") as f:
        assert f["model/lin.weight"].attrs["checksum"].startswith("sha256:")
    assert incarnation().restore(_state(4)).step == 1


def test_skip_policy_skips_while_a_save_is_in_flight(incarnation) -> None:
    ck = incarnation(async_policy="skip")
    gate = threading.Event()
    ck._pool.submit(gate.wait)
    ck.save(1, _state(1))
    assert ck.save(2, _state(2)) is None and ck.skipped_steps == [2]
    assert ck.poll() is None
    gate.set()
    assert ck.wait().step == 1
    ck.save(3, _state(3))
    ck._inflight.future.result()
    ck.save(4, _state(4))
    assert ck.wait().step == 4
    assert [r.step for r in ck.results] == [1, 3, 4] and ck.skipped_steps == [2]


def test_block_policy_waits_for_the_in_flight_save(incarnation) -> None:
    ck = incarnation(async_policy="block")
    ck.save(1, _state(1))
    ck.save(2, _state(2))
    assert [r.step for r in ck.results] == [1] and ck.wait().step == 2


def test_retention_under_async_save_keeps_the_last_good(run_dir, log, incarnation) -> None:
    ck = incarnation(keep_last=2)
    ids = [ck.save(s, _state(s), blocking=True).ckpt_id for s in (1, 2, 3)]
    ck.wait()
    ck._gc.submit(lambda: None).result()  # retention has run
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == ids[1:]

    bad = _state(4)
    with torch.no_grad():
        bad["model"].lin.bias[0] = float("inf")
    ck.save(4, bad)  # async: in flight while a GC pass runs
    in_flight = ck._inflight.info.ckpt_id
    report = collect_run(run_dir, log=log, keep_last=2, now=1e12, older_than=0.0,
                         in_flight=[in_flight])
    assert report.retired == () and in_flight not in report.debris
    with pytest.raises(NonFiniteError):
        ck.wait()
    ck._gc.submit(lambda: None).result()  # retention has run
    assert {p.name for p in (run_dir / "ckpt").iterdir()} >= set(ids[1:])
    restored = _state(9)
    assert incarnation().restore(restored).ckpt_id == ids[2]
    assert same_state(restored["model"].state_dict(), _state(3)["model"].state_dict())


def test_gc_removes_old_debris_only(run_dir, log, incarnation) -> None:
    ck = incarnation()
    kept = ck.save(1, _state(1), blocking=True).ckpt_id
    debris = run_dir / "ckpt" / "g000001-s0000000099-deadbeef"
    (debris / "node0").mkdir(parents=True)
    young = collect_run(run_dir, log=log, keep_last=2, now=debris.stat().st_mtime + 10,
                        older_than=3600)
    assert young.debris == () and debris.exists()
    old = collect_run(run_dir, log=log, keep_last=2, now=debris.stat().st_mtime + 7200,
                      older_than=3600)
    assert old.debris == (debris.name,) and not debris.exists()
    assert (run_dir / "ckpt" / kept / "manifest.json").exists()


def test_uncommitted_manifest_is_never_restored(run_dir, log, incarnation) -> None:
    ck = incarnation()
    ck.save(1, _state(1), blocking=True)
    ck2 = incarnation(fault_hook=_raise_at("before_commit"))
    with pytest.raises(RuntimeError):
        ck2.save(2, _state(2), blocking=True)
    assert len(list((run_dir / "ckpt").iterdir())) == 2  # the manifest of step 2 exists...
    assert incarnation().restore(_state(5)).step == 1  # ...but only committed ones count


def test_every_stage_of_a_save_is_reported_with_that_saves_step(incarnation) -> None:
    # an asynchronous save reaches its later stages while training is further on: a drill's
    # "kill inside the save from step N" must see the save's step, not the trainer's
    seen: list[tuple[str, int]] = []
    ck = incarnation(fault_hook=lambda stage, step: seen.append((stage, step)))
    ck.save(7, _state(1), blocking=False)
    assert ck.wait() is not None
    assert {stage for stage, _ in seen} >= {"staging", "shard_write", "before_manifest",
                                            "before_commit"}
    assert {step for _, step in seen} == {7}


def _raise_at(stage: str):
    def hook(s: str, step: int) -> None:
        if s == stage:
            raise RuntimeError(f"injected at {s}")
    return hook


def test_model_registered_now_but_absent_is_an_error(incarnation) -> None:
    incarnation().save(1, {"model": Model(1)}, blocking=True)
    with pytest.raises(Exception, match="registered but the checkpoint has only"):
        incarnation().restore({"model": Model(2), "other": {}})


def test_restore_fills_the_states_own_tensors_in_place_and_counts_bytes(run_dir,
                                                                        incarnation) -> None:
    saved = {"model": {"w": torch.arange(12.0).view(3, 4),
                       "b": torch.ones(5, dtype=torch.int64)}}
    res = incarnation().save(1, saved, blocking=True)
    target_w, target_b = torch.zeros(3, 4), torch.zeros(5, dtype=torch.int64)
    target = {"model": {"w": target_w, "b": target_b}}
    result = incarnation().restore(target)
    assert result is not None and result.step == 1
    # the very tensors the state held now hold the checkpoint's values (no new memory)
    assert torch.equal(target_w, saved["model"]["w"]) and torch.equal(target_b, saved["model"]["b"])
    assert target["model"]["w"].data_ptr() == target_w.data_ptr()
    [shard] = _shard_files(run_dir, res.ckpt_id)
    with h5py.File(shard, "r") as f:
        data_bytes = sum(f[k].nbytes for k in ("model/w", "model/b", "__meta__"))
    assert result.bytes_read == data_bytes and result.files_read == 1
    # a state without a tensor of that shape gets a new one, with the same values
    other = {"model": {"w": torch.zeros(2, 2)}}
    incarnation().restore(other)
    assert torch.equal(other["model"]["w"], saved["model"]["w"])


@pytest.mark.parametrize("ops", [("rename",), ("write_atomic",)], ids=["shard", "manifest"])
def test_a_hung_shared_tier_abandons_the_checkpoint_and_the_next_commits(
        incarnation, run_dir: Path, log: RunLog, tmp_path: Path, ops: tuple[str, ...]) -> None:
    """A shard rename or the manifest write blocks in the kernel past the deadline: that save
    is abandoned with a background ``storage_timeout`` fault (not a gang fault), and once the
    tier answers the next save commits."""
    import os

    from hpcrun.storage import LOCAL_STORAGE, DeadlineStorage, FaultyStorage

    fifo = tmp_path / "hung-ost"
    os.mkfifo(fifo)
    stalled = FaultyStorage(LOCAL_STORAGE, mode="stall", while_path=str(fifo), ops=ops)
    ck = incarnation(storage=DeadlineStorage(stalled, deadline_s=0.5))
    res = ck.save(1, _state(1), blocking=True)
    assert res is not None and not res.committed
    assert "abandoned" in res.error and "deadline" in res.error
    faults = [e.payload for e in log.read() if e.kind == EntryKind.FAULT]
    assert [(f["fault"], f["background"]) for f in faults] == [("storage_timeout", True)]
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the tier answers again
    fifo.unlink()
    os.close(writer)
    res = ck.save(2, _state(2), blocking=True)
    assert res is not None and res.committed
    assert [c.step for c in fold_checkpoints(log.read())] == [2]


def test_a_restore_trusts_the_checksummed_bytes_and_verification_checks_hdf5s_account(
        run_dir, log, incarnation) -> None:
    """A restore proves a dataset by its bytes' checksum (it does not open each dataset's
    HDF5 header, a random read apiece on a cold file); ``verify`` also checks HDF5's account,
    so a file whose attributes were altered is refused there, never restored wrong."""
    from hpcrun.checkpoint import verify_checkpoint

    saved = {**_state(1), "big": {"w": torch.randn(512, 512)}}  # stored contiguous, not inline
    res = incarnation().save(1, saved, blocking=True)
    [path] = _shard_files(run_dir, res.ckpt_id)
    with h5py.File(path, "r") as f:
        assert f["big/w"].id.get_offset() is not None
        digest = f["big/w"].attrs["checksum"].encode()
    data = path.read_bytes()
    assert data.count(digest) == 1  # the attribute, altered in place (HDF5 would grow the file)
    path.write_bytes(data.replace(digest, digest[:-1] + (b"0" if digest[-1:] != b"0" else b"1")))
    restored = {**_state(9), "big": {"w": torch.zeros(512, 512)}}
    result = incarnation().restore(restored)
    assert result is not None and result.step == 1 and result.skipped == ()
    assert torch.equal(restored["big"]["w"], saved["big"]["w"])
    [ckpt] = fold_checkpoints(log.read())
    problems = verify_checkpoint(run_dir, ckpt).problems
    assert len(problems) == 1 and "attributes disagree with the manifest" in problems[0]
