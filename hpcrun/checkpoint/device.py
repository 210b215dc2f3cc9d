"""Device state to and from host memory: pinned reused buffers, a side stream, one event.

Staging (:func:`hpcrun.checkpoint.stage.copy_staged`) copies device tensors into the checkpoint's
host buffer through a :class:`DeviceCopies`: every copy is issued non-blocking on one dedicated
CUDA stream per device, after that stream waits for the training stream (so it copies the state
the optimizer step left), and one event per device marks the end. :meth:`DeviceCopies.wait` is
the exposed pause: the device-to-host copies, nothing else; the training stream itself is never
made to wait. Host memory is pinned (:func:`pinned_bytes`) so the copies run at the DMA
engines' speed and really are asynchronous (a copy into pageable memory blocks the host).

Restore lands bytes the other way with :func:`copy_into`: ``target.copy_(host)`` semantics,
in place (no device allocation), through pinned memory when the target is on a GPU.

CPU tensors never come here: they keep the plain ``copy_`` path, so CPU runs are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hpcrun.errors import CheckpointError


def on_device(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in accelerator memory (not the host)."""
    return t.device.type != "cpu"


def pinned_bytes(nbytes: int, *, align: int = 4096) -> np.ndarray:
    """A page-locked host buffer of ``nbytes`` bytes whose start is ``align``-aligned.

    The numpy array keeps the pinned tensor it views alive. Pinning needs CUDA; without it the
    buffer is ordinary (aligned) memory, so callers need no second path.
    """
    pin = torch.cuda.is_available()
    raw = torch.empty(nbytes + align, dtype=torch.uint8, pin_memory=pin)
    arr = raw.numpy()
    start = (-arr.ctypes.data) % align
    return arr[start:start + nbytes]


def is_pinned(buf: np.ndarray) -> bool:
    """Whether ``buf``'s memory is page-locked (False without CUDA)."""
    if not torch.cuda.is_available() or buf.size == 0:
        return False
    return bool(torch.from_numpy(buf[:1]).is_pinned())


class DeviceCopies:
    """Device-to-host copies issued on a side stream per device, awaited through one event each.

    Usage: :meth:`copy` for each (host view, device tensor) pair, then :meth:`wait` once.
    """

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}
        self._events: list[Any] = []

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Start copying device tensor ``src`` into host tensor ``dst`` (same shape, dtype)."""
        if src.device.type != "cuda":
            raise CheckpointError(f"cannot stage a tensor on {src.device}: only CUDA devices "
                                  "and the CPU are supported; move it in state_dict()")
        stream = self._stream(src.device)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        # The caching allocator must not hand src's memory to the training stream while the
        # side stream still reads it (state freed by the next step).
        src.record_stream(stream)

    def _stream(self, device: torch.device) -> Any:
        if device not in self._streams:
            stream = torch.cuda.Stream(device=device)
            # Copy the state the training stream's queued work (the optimizer step) leaves.
            stream.wait_stream(torch.cuda.current_stream(device))
            self._streams[device] = stream
        return self._streams[device]

    def wait(self) -> None:
        """Block until every copy issued so far has landed in host memory."""
        for stream in self._streams.values():
            event = torch.cuda.Event()
            event.record(stream)
            self._events.append(event)
        for event in self._events:
            event.synchronize()
        self._streams.clear()
        self._events.clear()


class HostLanding:
    """A reused pinned host buffer through which restored bytes land on the device in place."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def _view(self, nbytes: int) -> np.ndarray:
        if self._buf.size < nbytes:
            self._buf = pinned_bytes(nbytes)
        return self._buf[:nbytes]

    def copy_into(self, target: torch.Tensor, host: torch.Tensor) -> None:
        """``target.copy_(host)``, in place; a device target is filled from pinned memory.

        Peak extra device memory is zero: the bytes go straight into ``target``'s storage.
        The copy has finished when this returns (the pinned buffer is reused by the next call).

        Raises:
            CheckpointError: shapes differ (the checkpoint does not fit the target).
        """
        if tuple(target.shape) != tuple(host.shape):
            raise CheckpointError(f"restored tensor has shape {tuple(host.shape)} but its target "
                                  f"has {tuple(target.shape)}; the model does not match the "
                                  "checkpoint")
        if not on_device(target) or host.is_pinned():
            target.copy_(host, non_blocking=on_device(target))
            if on_device(target):
                torch.cuda.current_stream(target.device).synchronize()
            return
        src = host.contiguous()
        nbytes = src.numel() * src.element_size()
        staged = torch.from_numpy(self._view(nbytes)).view(src.dtype).view(src.shape)
        staged.copy_(src)
        target.copy_(staged, non_blocking=True)
        torch.cuda.current_stream(target.device).synchronize()


def copy_into(target: torch.Tensor, host: torch.Tensor, *,
              landing: HostLanding | None = None) -> None:
    """``target.copy_(host)`` in place, through pinned memory for a device target."""
    (landing or HostLanding()).copy_into(target, host)
