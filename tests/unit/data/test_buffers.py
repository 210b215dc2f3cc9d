"""Batch arrays are recycled only once nothing holds them: a held batch never changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcrun.data import DataPipeline
from hpcrun.data.buffers import BufferPool


def test_a_set_is_handed_out_again_only_when_nothing_references_it() -> None:
    pool = BufferPool((2, 3), [("a", "int64"), ("b", "int32")], keep=2)
    first = pool.take()
    view = first["a"][:, 1]  # a view keeps its base in use
    del first
    second = pool.take()
    assert not np.shares_memory(second["a"], view)
    del view, second
    again = pool.take()
    assert pool.allocated == 2  # both sets recycled, nothing new
    assert again["b"].shape == (2, 3)


@pytest.mark.parametrize(("executor", "as_torch", "seq_len"),
                         [("thread", False, 16), ("thread", True, 16), ("process", True, 16),
                          ("process", False, 2048)])  # 160 KiB batches: the pooled copy
def test_batches_the_caller_holds_are_never_overwritten(two_source_manifest: Path,
                                                        executor: str, as_torch: bool,
                                                        seq_len: int) -> None:
    pipe = DataPipeline(two_source_manifest, seed=7, global_batch=4, seq_len=seq_len,
                        workers=1, executor=executor, prefetch_batches=2, as_torch=as_torch)
    held = [next(pipe) for _ in range(3)]
    copies = [{k: _numpy(v).copy() for k, v in b.items() if k != "batch"} for b in held]
    for _ in range(12):  # dropped at once: their buffers are recycled
        next(pipe)
    for batch, copy in zip(held, copies, strict=True):
        for name, value in copy.items():
            assert np.array_equal(_numpy(batch[name]), value), name
    pipe.close()


def _numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else value


def test_recycling_keeps_allocations_bounded(two_source_manifest: Path) -> None:
    pipe = DataPipeline(two_source_manifest, seed=7, global_batch=4, seq_len=16, workers=2,
                        prefetch_batches=2)
    for _ in range(40):
        next(pipe)
    buffers = pipe._read._buffers
    assert buffers is not None and buffers.allocated <= buffers.keep + 1
    pipe.close()
