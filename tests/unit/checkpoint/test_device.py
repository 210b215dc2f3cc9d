"""Device staging and restore landing: the device-agnostic parts on CPU, the rest on CUDA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hpcrun.checkpoint.device import (
    DeviceCopies,
    HostLanding,
    copy_into,
    is_pinned,
    pinned_bytes,
)
from hpcrun.checkpoint.stage import (
    StagedPiece,
    StageProgress,
    StagingBuffer,
    copy_staged,
    has_device,
    plan_pieces,
    prepare,
    tensor_view,
)
from hpcrun.checkpoint.state import flatten_state
from hpcrun.errors import CheckpointError

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def stage(flat: Any, pieces: Any, meta: bytes, buffer: StagingBuffer) -> list[StagedPiece]:
    """What a save's staging does, its writer aside."""
    staged = prepare(pieces, meta, buffer, device=has_device(flat, pieces))
    copy_staged(flat, staged, meta, buffer, StageProgress([sp.piece.nbytes for sp in staged]))
    return staged


def test_pinned_bytes_are_aligned_and_sized() -> None:
    buf = pinned_bytes(10_000)
    assert buf.size == 10_000 and buf.ctypes.data % 4096 == 0
    buf[:] = 7  # writable host memory
    assert is_pinned(buf) == torch.cuda.is_available()


def test_landing_copies_in_place_with_copy_semantics() -> None:
    target = torch.zeros(4, 3)
    storage = target.data_ptr()
    host = torch.arange(12, dtype=torch.float32).view(4, 3)
    copy_into(target, host)
    assert torch.equal(target, host) and target.data_ptr() == storage
    with pytest.raises(CheckpointError, match=r"shape \(3, 4\) but its target has \(4, 3\)"):
        HostLanding().copy_into(target, host.view(3, 4))


def test_cpu_state_keeps_the_plain_staging_path() -> None:
    state = {"w": torch.arange(64, dtype=torch.bfloat16).view(8, 8), "b": torch.ones(3)}
    flat = flatten_state(state)
    pieces = plan_pieces(flat, rank=0, world_size=1)
    buffer = StagingBuffer()
    staged = stage(flat, pieces, b"{}", buffer)
    assert not buffer.pinned, "CPU tensors never need pinned memory"
    for sp in staged[:-1]:
        got = tensor_view(buffer.view(sp.offset, sp.piece.nbytes), sp.piece)
        assert torch.equal(got, flat.leaves[sp.piece.key].tensor)


def test_side_stream_copies_refuse_a_host_tensor() -> None:
    with pytest.raises(CheckpointError, match="only CUDA devices"):
        DeviceCopies().copy(torch.empty(2), torch.ones(2))


@CUDA
def test_cuda_state_is_staged_into_pinned_memory_bit_for_bit() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(1024, 256, device="cuda", generator=gen).to(torch.bfloat16)
    state = {"w": w, "step": torch.tensor(3)}
    flat = flatten_state(state)
    pieces = plan_pieces(flat, rank=0, world_size=1)
    buffer = StagingBuffer()
    staged = stage(flat, pieces, b"{}", buffer)
    assert buffer.pinned
    for sp in staged[:-1]:
        got = tensor_view(buffer.view(sp.offset, sp.piece.nbytes), sp.piece)
        assert torch.equal(got, flat.leaves[sp.piece.key].tensor.cpu())
    before = w.cpu()
    w.add_(1)  # training goes on: the staged copy does not change
    [sw] = [sp for sp in staged if sp.piece.key == "w"]
    again = tensor_view(buffer.view(sw.offset, sw.piece.nbytes), sw.piece)
    assert torch.equal(again, before) and not torch.equal(again, w.cpu())


@CUDA
def test_restore_lands_on_the_device_in_place_without_extra_device_memory() -> None:
    target = torch.zeros(2048, 1024, device="cuda", dtype=torch.bfloat16)
    host = torch.from_numpy(np.arange(2048 * 1024, dtype=np.int16) % 97).view(
        torch.bfloat16).view(2048, 1024)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    storage = target.data_ptr()
    copy_into(target, host)
    assert target.data_ptr() == storage
    assert torch.cuda.max_memory_allocated() == before
    assert torch.equal(target.cpu(), host)
