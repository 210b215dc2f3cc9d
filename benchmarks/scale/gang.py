"""An in-process gang of N simulated ranks around one real rank 0 (the collective seam).

:class:`SimulatedGang` is a :class:`~hpcrun.checkpoint.collective.Collectives` whose rank 0 is a
real :class:`~hpcrun.checkpoint.Checkpointer`; the other ranks' contributions to each collective
are made here, by the same functions their own Checkpointers would run:

- a node's shard reports: rank 0's real shard record with the rank, node, path and rows of the
  other rank (every simulated rank holds the same tensors, one row block of each);
- the other node leaders' ``(NodeSummary, write_s)``: :func:`hierarchy.summarize_node` over
  node 1's records, with the key-table digest the last verdict broadcast (as their
  Checkpointers do), shifted to each node's ranks and rows. Their sub-manifest writes are
  counted, not stored: nothing restores them here;
- restore needs and plans of rank 0's node: the real :func:`readplan.need_of` shape.

What crosses the wire to rank 0 is pickled and unpickled, as ``gather_object`` does, and the time
spent making other nodes' summaries (work their own leaders do in parallel) is kept apart.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hpcrun.checkpoint import hierarchy
from hpcrun.checkpoint.collective import Collectives
from hpcrun.checkpoint.commit import ShardReport
from hpcrun.checkpoint.manifest import ShardRecord, digest_bytes
from hpcrun.checkpoint.readplan import Need
from hpcrun.checkpoint.shards import shard_relpath


def node_name(rank: int, per_node: int) -> str:
    return f"n{rank // per_node:05d}"


class SimulatedGang(Collectives):
    """N ranks, ``per_node`` per node, of which rank 0 is the real one."""

    def __init__(self, ranks: int, per_node: int, rows: int) -> None:
        super().__init__(None, 1, rank=0, node=node_name(0, per_node))
        self.world_size, self.per_node, self.rows = ranks, per_node, rows
        self._nodes = tuple(node_name(r, per_node) for r in range(ranks))
        self.known_keys = ""
        self.others_s = 0.0
        """Seconds spent making other nodes' contributions (their leaders' work)."""
        self.leader_ops = 0
        """Sub-manifest writes the other leaders made (counted, not stored)."""
        self.marks: dict[str, float] = {}
        """``perf_counter`` when rank 0 entered named collectives (latest call)."""
        self.wire_bytes = 0
        """Bytes of the last summaries gather, pickled."""
        self.on_mark: Callable[[str], None] | None = None
        """Called with each mark's name (the benchmark snapshots its counters there)."""
        self._ckpt_id = ""
        self._template: ShardRecord | None = None
        self._node1: tuple[tuple[str, str], hierarchy.NodeSummary] | None = None

    # -- whole gang: rank 0 is the source and every rank agrees ----------------------------

    def all_gather_object(self, obj: Any) -> list[Any]:
        raise NotImplementedError("the hierarchical path gathers by node, never across the gang")

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        self._mark("broadcast")
        if isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[2], str):
            self.known_keys = obj[2]  # the verdict: later summaries elide the key table
        return obj

    def all_true(self, flag: bool) -> bool:
        return flag

    def all_gather_bytes(self, mine: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        raise NotImplementedError("restore never exchanges sharded bytes on this layout")

    # -- nodes -----------------------------------------------------------------------------

    def node_gather_object(self, obj: Any) -> list[Any] | None:
        ranks = self.node_ranks()
        if isinstance(obj, ShardReport):
            assert obj.record is not None, obj.error
            self._template = obj.record
            self._mark("gather")
            return [obj, *(replace(obj, rank=r, record=self.record(obj.record, r))
                           for r in ranks[1:])]
        if isinstance(obj, Need):
            return [obj, *(self.need(obj, r) for r in ranks[1:])]
        raise TypeError(f"unexpected node gather of {type(obj).__name__}")

    def node_scatter_object(self, objs: Sequence[Any] | None) -> Any:
        self._mark("scatter")
        assert objs is not None
        return objs[0]

    def node_all_gather_bytes(self, mine: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        return [mine, *(np.zeros(n, dtype=np.uint8) for n in sizes[1:])]

    def leaders_gather_object(self, obj: Any) -> list[Any] | None:
        summary, write_s = obj
        t0 = time.perf_counter()
        others = [self.summary(summary, n) for n in range(1, self.num_nodes)]
        wire = pickle.dumps([obj, *((s, write_s) for s in others)],
                            protocol=pickle.HIGHEST_PROTOCOL)
        self.wire_bytes = len(wire)
        self.others_s += time.perf_counter() - t0
        self._mark("receive")
        received: list[Any] = pickle.loads(wire)
        self._mark("received")
        return received

    # -- the other ranks -------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.per_node)

    def _mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()
        if self.on_mark is not None:
            self.on_mark(name)

    def record(self, mine: ShardRecord, rank: int) -> ShardRecord:
        """Rank ``rank``'s shard record, shaped like rank 0's (its rows, node and path)."""
        node = node_name(rank, self.per_node)
        shift = rank * self.rows
        return replace(mine, rank=rank, node=node, path=shard_relpath(node, rank), datasets=tuple(
            replace(d, row_start=d.row_start + shift, row_stop=d.row_stop + shift)
            if d.placement == "row" else d for d in mine.datasets))

    def need(self, mine: Need, rank: int) -> Need:
        shift = rank * self.rows
        return Need(rank=rank, rows={k: (a + shift, b + shift, g)
                                     for k, (a, b, g) in mine.rows.items()})

    def summary(self, node0: hierarchy.NodeSummary, node: int) -> hierarchy.NodeSummary:
        """What node ``node``'s leader sends: the same ``summarize_node`` rank 0 ran.

        Node 1's leader's summary is computed for real over its ranks' records; the others
        are that summary with its ranks and rows shifted and a digest of their own (every node
        holds the same tensors, so their summaries differ in nothing else).
        """
        del node0
        if self._node1 is None or self._node1[0] != (self._ckpt_id, self.known_keys):
            assert self._template is not None
            ranks = range(self.per_node, min(self.world_size, 2 * self.per_node))
            records = [self.record(self._template, r) for r in ranks]
            _, real = hierarchy.summarize_node(self._ckpt_id, node_name(ranks[0], self.per_node),
                                               records, known_keys=self.known_keys)
            self._node1 = ((self._ckpt_id, self.known_keys), real)
        one = self._node1[1]
        shift = (node - 1) * self.per_node
        name = node_name(node * self.per_node, self.per_node)
        self.leader_ops += 2  # write_node_manifest: makedirs + write_atomic
        return replace(one, node=name, path=f"manifests/{name}.json",
                       digest=digest_bytes(f"{self._ckpt_id}/{name}".encode()),
                       ranks=tuple(r + shift for r in one.ranks if r + shift < self.world_size),
                       starts=one.starts + shift * self.rows, stops=one.stops + shift * self.rows)

    def prepare(self, ckpt_id: str) -> None:
        """The checkpoint the next save commits (every rank derives it without talking)."""
        self._ckpt_id = ckpt_id
