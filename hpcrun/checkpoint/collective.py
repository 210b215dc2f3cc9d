"""The few collectives the checkpoint plane uses, always from the training thread.

With one rank (or no process group) each is the identity, so single-process runs and unit tests
need no ``torch.distributed``. Checkpoint collectives run on the host (CPU) group the
``Checkpointer`` is given; with NCCL the tensor collectives run on the current CUDA device.
Background threads never call these: a collective from a second thread on the training group
can interleave with the training loop's own collectives and deadlock.

Large gangs talk mostly inside a node: the ranks of a node form a subgroup whose leader is the
node's lowest rank, and the leaders form one more subgroup (rank 0 leads it). The subgroups are
created once, on first use, by every rank for every subgroup in the same order, with the
backend of the host group. A subclass may replace every method (an in-process simulated gang in
``benchmarks/scale`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hpcrun.errors import CheckpointError


class Collectives:
    """Collectives over ``group`` (the default group when None) of ``world_size`` ranks."""

    def __init__(self, group: Any, world_size: int, *, rank: int = 0, node: str = "") -> None:
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.node = node
        self._dist: Any = None
        self._nodes: tuple[str, ...] | None = None
        self._node_group: Any = None
        self._leader_group: Any = None
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

    # -- whole gang ------------------------------------------------------------------------

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

        Restore uses it only when some rank cannot reach a shard it needs (a tier-0 copy on
        another node that was not drained yet): the ranks that can read it share it.
        """
        return _all_gather_bytes(self._dist, self.group, self.world_size, self._device(),
                                 mine, sizes)

    # -- nodes -----------------------------------------------------------------------------

    def nodes(self) -> tuple[str, ...]:
        """The node of every rank, by rank (gathered once)."""
        if self._nodes is None:
            self._nodes = tuple(self.all_gather_object(self.node))
        return self._nodes

    def node_ranks(self) -> tuple[int, ...]:
        """Ranks on this rank's node, ascending (the first is the node's leader)."""
        nodes = self.nodes()
        return tuple(r for r, n in enumerate(nodes) if n == nodes[self.rank])

    def is_leader(self) -> bool:
        """Whether this rank leads its node (its lowest rank)."""
        return self.node_ranks()[0] == self.rank

    def node_gather_object(self, obj: Any) -> list[Any] | None:
        """On the node leader: every node rank's ``obj`` in rank order; None elsewhere."""
        if len(self.node_ranks()) == 1:
            return [obj]
        group = self._groups()[0]
        out: list[Any] | None = [None] * len(self.node_ranks()) if self.is_leader() else None
        self._dist.gather_object(obj, out, group_dst=0, group=group)
        return out

    def node_scatter_object(self, objs: Sequence[Any] | None) -> Any:
        """This rank's item of the leader's ``objs`` (one per node rank, in rank order)."""
        if len(self.node_ranks()) == 1:
            assert objs is not None
            return objs[0]
        box: list[Any] = [None]
        self._dist.scatter_object_list(box, list(objs) if objs is not None else None,
                                       group_src=0, group=self._groups()[0])
        return box[0]

    def node_all_gather_bytes(self, mine: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        """Every node rank's uint8 buffer (``sizes`` by position in :meth:`node_ranks`)."""
        if len(self.node_ranks()) == 1:
            return [mine]
        return _all_gather_bytes(self._dist, self._groups()[0], len(sizes), self._device(),
                                 mine, sizes)

    def leaders_gather_object(self, obj: Any) -> list[Any] | None:
        """LEADERS ONLY: on rank 0 every node leader's ``obj`` by node order; None elsewhere."""
        leaders = _leaders(self.nodes())
        if len(leaders) == 1:
            return [obj]
        out: list[Any] | None = [None] * len(leaders) if self.rank == 0 else None
        self._dist.gather_object(obj, out, group_dst=0, group=self._groups()[1])
        return out

    def _groups(self) -> tuple[Any, Any]:
        """(this rank's node group, the leaders' group), created once by every rank."""
        if self._node_group is None:
            self._node_group, self._leader_group = _new_groups(self._dist, self.group,
                                                               self.nodes(), self.rank)
        return self._node_group, self._leader_group


def _leaders(nodes: Sequence[str]) -> list[int]:
    """The lowest rank of each node, ascending (rank 0 is always the first)."""
    first: dict[str, int] = {}
    for r, n in enumerate(nodes):
        first.setdefault(n, r)
    return sorted(first.values())


def _new_groups(dist: Any, group: Any, nodes: Sequence[str], rank: int) -> tuple[Any, Any]:
    """Every rank creates every subgroup of size > 1, in the same order (torch requires it)."""
    if len(set(nodes)) == 1:
        return group, None  # one node: the node group is the gang's own group
    backend = dist.get_backend(group)

    def glob(ranks: Sequence[int]) -> list[int]:
        return [r if group is None else dist.get_global_rank(group, r) for r in ranks]

    def make(ranks: Sequence[int]) -> Any:
        # A subgroup's name is a hash of its ranks: creating the same one twice would collide
        # in the store, so each is created once per process and reused by later Checkpointers.
        key = (id(dist.group.WORLD), backend, tuple(glob(ranks)))
        if key not in _SUBGROUPS:
            _SUBGROUPS[key] = dist.new_group(list(key[2]), backend=backend,
                                             use_local_synchronization=True)
        return _SUBGROUPS[key]

    mine = None
    for node in dict.fromkeys(nodes):
        ranks = [r for r, n in enumerate(nodes) if n == node]
        if len(ranks) > 1:
            made = make(ranks)
            mine = made if rank in ranks else mine
    leaders = _leaders(nodes)
    lead = make(leaders)
    return mine, lead if rank in leaders else None


_SUBGROUPS: dict[tuple[int, str, tuple[int, ...]], Any] = {}


def _all_gather_bytes(dist: Any, group: Any, size: int, dev: torch.device, mine: np.ndarray,
                      sizes: Sequence[int]) -> list[np.ndarray]:
    if dist is None or size == 1:
        return [mine]
    width = max(max(sizes, default=0), 1)
    send = torch.zeros(width, dtype=torch.uint8, device=dev)
    send[: mine.size] = torch.from_numpy(mine).to(dev)
    recv = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(size)]
    dist.all_gather(recv, send, group=group)
    return [r[:n].cpu().numpy() for r, n in zip(recv, sizes, strict=True)]
