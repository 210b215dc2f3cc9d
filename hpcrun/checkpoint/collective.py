"""The few collectives the checkpoint plane uses, always from the training thread.

With one rank (or no process group) each is the identity, so single-process runs and unit tests
need no ``torch.distributed``. With NCCL the tensor collectives run on the current CUDA device.
Background threads never call these: a collective from a second thread on the training group
can interleave with the training loop's own collectives and deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hpcrun.errors import CheckpointError


class Collectives:
    """Collectives over ``group`` (the default group when None) of ``world_size`` ranks."""

    def __init__(self, group: Any, world_size: int) -> None:
        self.group = group
        self.world_size = world_size
        self._dist: Any = None
        if world_size > 1:
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_initialized():
                raise CheckpointError(
                    f"world_size is {world_size} but torch.distributed is not initialized; "
                    "call init_process_group first or pass a layout of world_size 1")
            if dist.get_world_size(group) != world_size:
                raise CheckpointError(
                    f"layout world_size {world_size} differs from the process group size "
                    f"{dist.get_world_size(group)}; pass the group the layout describes")
            self._dist = dist

    def _device(self) -> torch.device:
        if self._dist is not None and self._dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, by rank (in-memory transfer only; nothing is persisted)."""
        if self._dist is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        if self._dist is None:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, group_src=src, group=self.group)
        return box[0]

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank."""
        if self._dist is None:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._device())
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank."""
        return not self.all_true(not flag)

    def all_gather_bytes(self, mine: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        """Every rank's uint8 buffer; ``sizes[r]`` is rank r's length, known to all ranks.

        This is the peer exchange of restore: each rank read only its own files, and the ranks
        share what they read instead of each opening everyone's files.
        """
        if self._dist is None:
            return [mine]
        width = max(max(sizes, default=0), 1)
        dev = self._device()
        send = torch.zeros(width, dtype=torch.uint8, device=dev)
        send[: mine.size] = torch.from_numpy(mine).to(dev)
        recv = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(self.world_size)]
        self._dist.all_gather(recv, send, group=self.group)
        return [r[:n].cpu().numpy() for r, n in zip(recv, sizes, strict=True)]
