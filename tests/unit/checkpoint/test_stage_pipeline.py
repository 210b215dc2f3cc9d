"""Staging and writing overlap: the writer writes each piece once it lands, and a failed
staging leaves nothing a restore could take."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrun.checkpoint.keys import SMALL_DATASET
from hpcrun.checkpoint.shards import ShardHeader, write_shard
from hpcrun.checkpoint.stage import (
    StageProgress,
    StagingBuffer,
    copy_order,
    copy_staged,
    plan_pieces,
    prepare,
    row_slices,
)
from hpcrun.checkpoint.state import flatten_state
from hpcrun.errors import CheckpointError
from tests.unit.checkpoint.test_save_restore import _shard_files, _state

HEADER = ShardHeader(run_id="r", ckpt_id="c", generation=1, step=1, rank=0, world_size=1,
                     node="n")


def _big_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"a": torch.randn(300, 257, generator=g).bfloat16(), "norm": torch.ones(33),
            "b": torch.randn(70_001, generator=g), "c": torch.randint(0, 9, (50_000,)),
            "scalar": torch.tensor(2.5)}


def test_small_pieces_are_copied_first_then_the_large_in_file_order() -> None:
    flat = flatten_state(_big_state())
    staged = prepare(plan_pieces(flat, rank=0, world_size=1), b"{}", StagingBuffer())
    order = copy_order(staged)
    sizes = [staged[k].piece.nbytes for k in order]
    small = sum(n < SMALL_DATASET for n in sizes)
    assert sorted(order) == list(range(len(staged)))
    assert all(n < SMALL_DATASET for n in sizes[:small])
    assert order[small:] == sorted(order[small:])


def test_row_slices_cover_a_piece_in_order_at_about_the_asked_size() -> None:
    flat = flatten_state(_big_state())
    pieces = {p.key: p for p in plan_pieces(flat, rank=0, world_size=1)}
    big = pieces["a"]  # 300 rows of 514 bytes
    slices = row_slices(big, nbytes=10_000)
    assert slices[0] == (0, 19, 19 * 514) and slices[-1][1:] == (300, big.nbytes)
    assert all(b == c for (_, b, _), (c, _, _) in itertools.pairwise(slices))
    assert row_slices(pieces["scalar"]) == [(0, 1, pieces["scalar"].nbytes)]
    assert row_slices(pieces["norm"]) == [(0, 33, 132)]  # small: one slice


def test_a_shard_written_while_its_pieces_land_late_holds_every_byte(tmp_path: Path) -> None:
    state = _big_state()
    flat = flatten_state(state)
    buffer = StagingBuffer()
    staged = prepare(plan_pieces(flat, rank=0, world_size=1), b'{"m": 1}', buffer)
    sizes = [sp.piece.nbytes for sp in staged]
    progress = StageProgress(sizes)

    class SlowProgress(StageProgress):
        def land(self, index: int, upto: int | None = None) -> None:
            time.sleep(0.02)  # the writer is always waiting for the next slice
            progress.land(index, upto)

    copier = threading.Thread(target=lambda: (copy_staged(
        flat, staged, b'{"m": 1}', buffer, SlowProgress(sizes)), progress.seal()))
    copier.start()
    record = write_shard(tmp_path / "s.h5", HEADER, buffer, staged, progress=progress)
    copier.join()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        for key, t in state.items():
            got = torch.from_numpy(np.ascontiguousarray(f[key][()])).view(t.dtype)
            assert torch.equal(got.view(t.shape), t), key
    assert {d.key for d in record.datasets} >= set(state)


def test_an_abandoned_staging_fails_the_writer_and_leaves_no_shard(tmp_path: Path) -> None:
    flat = flatten_state(_big_state())
    buffer = StagingBuffer()
    staged = prepare(plan_pieces(flat, rank=0, world_size=1), b"{}", buffer)
    progress = StageProgress([sp.piece.nbytes for sp in staged])
    progress.land(0)
    progress.abandon()
    with pytest.raises(CheckpointError, match="staging failed"):
        write_shard(tmp_path / "s.h5", HEADER, buffer, staged, progress=progress)
    assert not (tmp_path / "s.h5").exists()


def test_a_failure_in_staging_commits_nothing_and_the_next_save_works(run_dir,
                                                                      incarnation) -> None:
    def hook(stage: str, step: int) -> None:
        if stage == "staging" and step == 2:
            raise RuntimeError("injected at staging")

    ck = incarnation(fault_hook=hook)
    ck.save(1, _state(1), blocking=True)
    with pytest.raises(RuntimeError, match="injected at staging"):
        ck.save(2, _state(2), blocking=True)
    third = ck.save(3, _state(3), blocking=True)
    assert third is not None and third.committed
    restored = incarnation().restore(_state(5))
    assert restored is not None and restored.step == 3
    assert not any(p.name.startswith("rank-") for p in (run_dir / "ckpt").rglob("*")
                   if "-s2-" in str(p)), "no shard of the failed save was renamed into place"
    assert _shard_files(run_dir, third.ckpt_id)


@pytest.mark.parametrize("blocking", [False, True])
def test_only_a_blocking_save_writes_while_it_stages(run_dir, incarnation,
                                                     blocking: bool) -> None:
    """A periodic save's pause is the copy alone (its writer starts once staging is over); a
    blocking save, which holds the rank to the end anyway, writes while it stages."""
    writer_started = threading.Event()
    seen: list[bool] = []

    def hook(stage: str, step: int) -> None:
        if stage == "staging":  # the copy is done, staging not yet sealed
            seen.append(writer_started.wait(timeout=5.0 if blocking else 0.0))

    ck = incarnation(fault_hook=hook)
    write = ck._write

    def watched(*args, **kwargs):
        writer_started.set()
        return write(*args, **kwargs)

    ck._write = watched
    ck.save(1, _state(1), blocking=blocking)
    result = ck.wait() if not blocking else ck.results[-1]
    assert result.committed and seen == [blocking]
    assert incarnation().restore(_state(5)).step == 1
