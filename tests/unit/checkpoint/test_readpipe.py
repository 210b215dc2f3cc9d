"""The restore read pipeline: bytes land where they belong, bit for bit, and damage is refused."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrun.checkpoint import readpipe
from hpcrun.checkpoint.rawio import ALIGN
from hpcrun.checkpoint.readpipe import (
    ReadMode,
    Wanted,
    choose_direct,
    faster_mode,
    plan_chunks,
    read_verified,
    readahead_hints,
    resident_pages,
)
from hpcrun.checkpoint.shards import checksum
from tests.unit.checkpoint.test_save_restore import _shard_files

SIZES = (0, 1, 4095, 4096, 4097, 3 * 8192 + 17, 100_000)


def _file(tmp_path: Path, sizes: tuple[int, ...]) -> tuple[Path, list[tuple[int, bytes]]]:
    """A file holding one random extent per size at aligned offsets, and those extents."""
    rng = np.random.default_rng(7)
    parts, blob, pos = [], bytearray(), 0
    for n in sizes:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        parts.append((pos, data))
        blob += data + b"\0" * (-(pos + n) % ALIGN)
        pos = len(blob)
    path = tmp_path / "extents.bin"
    path.write_bytes(bytes(blob) + b"\0" * ALIGN)
    return path, parts


@pytest.mark.parametrize("offset_dest", [0, 64], ids=["aligned-dest", "tensor-like-dest"])
@pytest.mark.parametrize("algorithm", ["xxh3", "sha256"])
def test_uneven_extents_land_bit_for_bit_over_chunk_boundaries(tmp_path, offset_dest,
                                                               algorithm) -> None:
    path, parts = _file(tmp_path, SIZES)
    raw = np.zeros(sum(len(d) for _, d in parts) + offset_dest + len(parts) * ALIGN, np.uint8)
    items, pos = [], offset_dest
    for off, data in parts:
        items.append(Wanted(offset=off, dest=raw[pos:pos + len(data)],
                            digest=checksum(algorithm, data)))
        pos += len(data) + 7  # destinations not block-aligned: the bounce path
    bad, phases = read_verified(path, items, algorithm=algorithm, chunk=8192)
    assert bad == []
    for w, (_, data) in zip(items, parts, strict=True):
        assert w.dest.tobytes() == data
    assert phases.direct_bytes + phases.buffered_bytes == sum(len(d) for _, d in parts)


def test_a_corrupted_chunk_is_detected_and_named(tmp_path) -> None:
    path, parts = _file(tmp_path, (5 * 8192, 3 * 8192, 9000))
    items = [Wanted(offset=o, dest=np.zeros(len(d), np.uint8), digest=checksum("xxh3", d))
             for o, d in parts]
    blob = bytearray(path.read_bytes())
    blob[parts[1][0] + 8192 + 5] ^= 0x01  # the second chunk of the second extent
    path.write_bytes(bytes(blob))
    bad, _ = read_verified(path, items, algorithm="xxh3", chunk=8192)
    assert bad == [1]


def test_chunk_plan_covers_every_byte_once_in_file_order() -> None:
    dests = [np.zeros(n, np.uint8) for n in (0, 10, 8192, 20000)]
    items = [Wanted(offset=i * 65536, dest=d, digest="") for i, d in enumerate(dests)]
    chunks = plan_chunks(items, 8192)
    assert [len(c.view) for c in chunks] == [10, 8192, 8192, 8192, 3616]
    assert [c.file_offset for c in chunks][-3:] == [3 * 65536, 3 * 65536 + 8192,
                                                    3 * 65536 + 16384]


def test_read_mode_follows_page_cache_residency(tmp_path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(64 * 4096))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.read(fd, 64 * 4096)  # now cached
        chunks = plan_chunks([Wanted(offset=0, dest=np.zeros(64 * 4096, np.uint8), digest="")],
                             16 * 4096)
        warm = resident_pages(fd, 64 * 4096)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cold = resident_pages(fd, 64 * 4096)
    finally:
        os.close(fd)
    assert warm is not None and cold is not None
    assert choose_direct(chunks, warm) == [False] * 4  # cached: a memcpy from the cache
    assert choose_direct(chunks, cold) == [True] * 4  # not cached: O_DIRECT
    assert choose_direct(chunks, None) == [True] * 4


def _odd_state(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {
        "big_bf16": torch.randn(1031, 263, generator=g).to(torch.bfloat16),  # > 64 KiB, uneven
        "big_f32": torch.randn(40_013, generator=g),
        "i64": torch.randint(-9, 9, (12_345,), generator=g),
        "u8": torch.randint(0, 255, (70_001,), generator=g, dtype=torch.uint8),
        "empty": torch.empty(0, 7, dtype=torch.bfloat16),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "small_f16": torch.randn(33, generator=g).half()}}


def test_restore_lands_every_dtype_in_the_states_own_tensors(incarnation) -> None:
    saved = _odd_state(1)
    incarnation().save(1, saved, blocking=True)
    target = {"model": {k: torch.zeros_like(v) for k, v in saved["model"].items()}}
    ptrs = {k: v.data_ptr() for k, v in target["model"].items()}
    result = incarnation().restore(target)
    assert result is not None and result.step == 1
    for k, v in saved["model"].items():
        got = target["model"][k]
        assert got.dtype == v.dtype and got.shape == v.shape and got.data_ptr() == ptrs[k], k
        assert got.view(-1).view(torch.uint8).tolist() == v.view(-1).view(torch.uint8).tolist()
    ph = result.phases
    assert ph["read_s"] > 0 and ph["direct_bytes"] + ph["buffered_bytes"] == result.bytes_read
    assert ph["copy_s"] >= 0 and ph["fault_s"] >= 0


def test_a_refused_checkpoint_read_in_place_is_overwritten_by_the_older_one(
        run_dir, incarnation) -> None:
    ck = incarnation()
    ck.save(1, _odd_state(1), blocking=True)
    second = ck.save(2, _odd_state(2), blocking=True)
    _flip_in(_shard_files(run_dir, second.ckpt_id)[0], "model/big_f32")
    target = {"model": {k: torch.zeros_like(v) for k, v in _odd_state(0)["model"].items()}}
    result = incarnation().restore(target)
    assert result is not None and result.step == 1 and result.skipped == (second.ckpt_id,)
    for k, v in _odd_state(1)["model"].items():
        assert torch.equal(target["model"][k], v), k  # nothing of checkpoint 2 is left


def test_a_refused_checkpoint_with_nothing_older_leaves_the_init_for_a_fresh_start(
        run_dir, incarnation) -> None:
    only = incarnation().save(1, _odd_state(1), blocking=True)
    _flip_in(_shard_files(run_dir, only.ckpt_id)[0], "model/u8")
    init = {k: torch.full_like(v, 7) for k, v in _odd_state(0)["model"].items()}
    target = {"model": {k: v.clone() for k, v in init.items()}}
    assert incarnation().restore(target) is None
    assert all(torch.equal(target["model"][k], v) for k, v in init.items())


def _flip_in(shard: Path, h5path: str) -> None:
    with h5py.File(shard, "r") as f:
        offset = f[h5path].id.get_offset()
    data = bytearray(shard.read_bytes())
    data[offset + 1000] ^= 0x40
    shard.write_bytes(bytes(data))


def test_buffered_cold_reads_are_chosen_only_when_measured_clearly_faster() -> None:
    assert faster_mode({ReadMode.DIRECT: 1.0e9, ReadMode.BUFFERED: 1.2e9}) is ReadMode.BUFFERED
    assert faster_mode({ReadMode.DIRECT: 1.0e9, ReadMode.BUFFERED: 1.04e9}) is ReadMode.DIRECT
    assert faster_mode({ReadMode.DIRECT: 2.0e9, ReadMode.BUFFERED: 1.0e9}) is ReadMode.DIRECT
    assert faster_mode({}) is ReadMode.DIRECT


def test_readahead_is_asked_only_for_buffered_cold_chunks_ahead() -> None:
    chunks = plan_chunks([Wanted(offset=0, dest=np.zeros(6 * 4096, np.uint8), digest="")], 4096)
    hints = readahead_hints(chunks, [True, True, False, True, True, True], ahead=2)
    assert hints == [None, (3 * 4096, 4096), None, (5 * 4096, 4096), None, None]


@pytest.mark.parametrize("cache", [{}, {"preset": ReadMode.BUFFERED}], ids=["probe", "known"])
def test_cold_chunks_land_bit_for_bit_whichever_mode_the_probe_picks(tmp_path, monkeypatch,
                                                                     cache) -> None:
    path, parts = _file(tmp_path, (40 * 8192, 3 * 8192 + 5, 9 * 8192))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        dev = os.fstat(fd).st_dev
    finally:
        os.close(fd)
    modes = {dev: cache["preset"]} if cache else {}
    monkeypatch.setattr(readpipe, "_COLD_MODE", modes)
    raw = np.zeros(sum(len(d) for _, d in parts) + 64, np.uint8)
    items, pos = [], 64
    for off, data in parts:
        items.append(Wanted(offset=off, dest=raw[pos:pos + len(data)],
                            digest=checksum("xxh3", data)))
        pos += len(data)
    bad, phases = read_verified(path, items, algorithm="xxh3", chunk=8192)
    assert bad == []
    assert [w.dest.tobytes() for w in items] == [d for _, d in parts]
    assert phases.direct_bytes + phases.buffered_bytes == sum(len(d) for _, d in parts)
    if cache:
        assert phases.direct_bytes == 0, "the device's kept mode is buffered"
    elif readpipe._O_DIRECT and phases.direct_bytes:
        assert modes.get(dev) in set(ReadMode), "the probe's choice is kept for the device"
