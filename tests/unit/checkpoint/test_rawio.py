"""Bulk writes: bytes land at their offsets whether or not the file was allocated first, and an
allocation never leaves the file longer than what was written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrun.checkpoint.rawio import CHUNK, Extent, aligned_buffer, preallocate, write_extents
from hpcrun.checkpoint.shards import ShardHeader, write_shard
from hpcrun.checkpoint.stage import (
    StageProgress,
    StagingBuffer,
    copy_staged,
    plan_pieces,
    prepare,
)
from hpcrun.checkpoint.state import flatten_state


def _data(n: int) -> np.ndarray:
    buf = aligned_buffer(n)
    buf[:] = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    return buf


@pytest.mark.parametrize("allocate", [0, 3 * CHUNK + 4096, 3 * CHUNK + 4096 + 1000])
def test_written_bytes_are_the_file_whether_or_not_it_was_allocated(
        tmp_path: Path, allocate: int) -> None:
    data = _data(3 * CHUNK + 4096 + 1000)  # several requests, an unaligned tail
    path = tmp_path / "f"
    path.touch()
    write_extents(path, [Extent(file_offset=0, buffer=data.data)], allocate=allocate)
    assert path.stat().st_size == data.size
    assert np.array_equal(np.fromfile(path, dtype=np.uint8), data)


def test_an_allocated_file_has_its_blocks_before_any_write(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert preallocate(fd, 8 << 20)  # ext4, xfs, tmpfs and overlayfs all allocate
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert st.st_size == 8 << 20 and st.st_blocks * 512 >= 8 << 20


def test_a_shard_allocated_up_front_is_as_long_as_one_written_without(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """The allocation covers only the large datasets' extents, so HDF5's file, which holds
    them and its metadata, is never left with trailing bytes."""
    state = {"w": torch.randn(512, 1024), "b": torch.randn(7), "e": torch.randn(3000, 33)}
    flat = flatten_state(state)
    header = ShardHeader(run_id="r", ckpt_id="c", generation=1, step=1, rank=0, world_size=1,
                         node="n")

    def shard(name: str) -> Path:
        buffer = StagingBuffer()
        staged = prepare(plan_pieces(flat, rank=0, world_size=1), b"{}", buffer)
        progress = StageProgress([sp.piece.nbytes for sp in staged])
        copy_staged(flat, staged, b"{}", buffer, progress)
        progress.seal()
        write_shard(tmp_path / name, header, buffer, staged)
        return tmp_path / name

    allocated = shard("a.h5")
    monkeypatch.setattr("hpcrun.checkpoint.rawio.preallocate", lambda fd, n: False)
    plain = shard("b.h5")
    assert allocated.stat().st_size == plain.stat().st_size
    assert allocated.read_bytes() == plain.read_bytes()
