"""The restore shell: who reads which manifest, which bytes, and who talks to whom.

1. rank 0 reads the top manifest (digest-checked against its COMMIT entry) and broadcasts it;
2. every rank sends its node leader what its state needs (:class:`~.readplan.Need`); the leader
   reads only the sub-manifests its node needs and sends each rank its
   :class:`~.readplan.RankPlan`;
3. each rank reads only its planned datasets, into the Checkpointer's reused, pre-touched
   buffer, and verifies them; the gang agrees every rank verified before any state changes;
4. replicated pieces are exchanged inside the node; each rank copies its pieces into its
   state's tensors in place.

A shard not on this node's tier 0 (another node's, not drained yet or wanted without a trip to
the shared filesystem; a lost node's, held by its ring partner) is read from the gang node that
has it, by byte range through that node's partner server: the peer tier (``peers``), before
tier 1. When some rank
cannot reach a shard it needs even so, or the manifest predates per-node planning, the gang
restores that checkpoint through the exchange path instead (:func:`~.restore.plan_gather`: each
old shard read once, the ranks all-gather the pieces).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpcrun.checkpoint import commit as protocol
from hpcrun.checkpoint import hierarchy
from hpcrun.checkpoint.collective import Collectives
from hpcrun.checkpoint.identity import CheckpointIdentity, TierLayout
from hpcrun.checkpoint.keys import Placement
from hpcrun.checkpoint.manifest import ShardRecord, node_manifest_refs
from hpcrun.checkpoint.rawio import aligned_buffer
from hpcrun.checkpoint.readpipe import RestorePhases
from hpcrun.checkpoint.readplan import (
    Need,
    RankPlan,
    guess_nodes,
    plan_node,
    uncovered,
    wanted_nodes,
)
from hpcrun.checkpoint.restore import (
    LANDED,
    assemble,
    build_tensors,
    land_in_place,
    plan_gather,
    read_assigned,
    read_planned,
)
from hpcrun.checkpoint.shards import ShardSource
from hpcrun.checkpoint.stage import StagingBuffer
from hpcrun.checkpoint.state import Layout, TensorLeaf
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier
from hpcrun.control.entries import FaultPayload
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError, CorruptCheckpointError, HpcrunError, ReshardError
from hpcrun.storage import Storage
from hpcrun.vocab import FaultClass

_log = logging.getLogger(__name__)

PeerSource = Callable[[str, ShardRecord], Sequence[tuple[Tier, ShardSource]]]
"""``(checkpoint id, shard record)`` → that shard's copies on the gang's nodes, nearest first:
the restore's peer tier, for a shard this node's tier 0 lacks (the runtime provides it:
:class:`hpcrun.checkpoint.peer.read.PeerShards`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Loaded:
    """One checkpoint read and assembled on this rank."""

    ckpt_id: str
    """Checkpoint."""
    step: int
    """Its step."""
    extra: Mapping[str, Any]
    """The save's extra values."""
    tensors: dict[str, torch.Tensor]
    """This rank's tensors by key (its state's own tensors where they fit)."""
    meta: dict[str, Any]
    """This rank's meta tree."""
    shared: bool
    """Whether some rank read from the shared tier."""
    files_read: int = 0
    """Shard files this rank opened."""
    by_tier: Mapping[Tier, int] = field(default_factory=dict)
    """Data bytes this rank read from each tier (``peer``: from other nodes)."""
    phases: RestorePhases = field(default_factory=RestorePhases)
    """Where this rank's time went (faults, read, checksum, copy)."""

    @property
    def bytes_read(self) -> int:
        """Data bytes this rank read from shard files."""
        return sum(self.by_tier.values())


@dataclass(kw_only=True, slots=True)
class RestoreShell:
    """One rank's side of a restore (see the module docstring)."""

    identity: CheckpointIdentity
    """Run and fencing token (for incident entries)."""
    tiers: TierLayout
    """Where this node's tiers are."""
    layout: Layout
    """This rank's place in the gang."""
    log: RunLog
    """The run log."""
    comm: Collectives
    """The Checkpointer's collectives (host group)."""
    storage: Storage
    """Filesystem seam (manifests)."""
    buffer: StagingBuffer
    """The Checkpointer's reused, pre-touched staging buffer (restore reads into it)."""
    peers: PeerSource | None = None
    """The peer tier: copies of a shard on the gang's other nodes (None: no peer reads)."""
    overwritten: set[str] = field(default_factory=set)
    """Keys of state tensors a refused checkpoint was read into (straight into the tensor);
    a later restore must fill them again (see :meth:`Checkpointer.restore`)."""

    def load(self, ckpt: CommittedCheckpoint, need: Need, leaves: Mapping[str, TensorLeaf], *,
             in_place: bool = True) -> Loaded | None:
        """COLLECTIVE: ``ckpt`` read into this rank's tensors, or None when it is not usable.
        ``in_place=False`` reads every byte through the buffer, leaving the tensors untouched
        until the checkpoint verified (for the last candidate: nothing older would refill a
        tensor a refused read had written, and the run must start fresh from its own init)."""
        top = self._top(ckpt)
        if top is None:
            return None
        if not isinstance(top.get("tensors"), dict) or not top.get("node_manifests"):
            return self._exchange(ckpt, leaves)
        plan = self._plan(ckpt, top, need)
        if not self.comm.all_true(plan is not None):
            return None
        assert plan is not None
        if self.comm.any_true(bool(plan.error)):
            raise ReshardError(plan.error or "another rank cannot place the checkpoint on this "
                               "layout; its ReshardError names the tensor")
        if not self.comm.all_true(all(self._candidates(ckpt, s) for s in plan.files.values())):
            return self._exchange(ckpt, leaves)
        return self._read(ckpt, top, plan, leaves, in_place=in_place)

    # -- manifests -------------------------------------------------------------------------

    def _top(self, ckpt: CommittedCheckpoint) -> dict[str, Any] | None:
        top = None
        if self.layout.rank == 0:
            try:
                top = hierarchy.read_top_manifest(self.tiers.run_dir, ckpt, storage=self.storage)
                _check_top(top, ckpt)
            except (HpcrunError, OSError) as exc:
                top = None
                self.incident(ckpt, str(exc))
        return self.comm.broadcast_object(top)

    def _plan(self, ckpt: CommittedCheckpoint, top: Mapping[str, Any],
              need: Need) -> RankPlan | None:
        needs = self.comm.node_gather_object(need)
        plans: list[RankPlan | None] | None = None
        if needs is not None:
            try:
                plans = list(self._plan_node(ckpt, top, needs))
            except (HpcrunError, OSError) as exc:
                self.incident(ckpt, str(exc))
                plans = [None] * len(needs)
        return self.comm.node_scatter_object(plans)

    def _plan_node(self, ckpt: CommittedCheckpoint, top: Mapping[str, Any],
                   needs: Sequence[Need]) -> list[RankPlan]:
        """Node leader: read the sub-manifests the node needs (its own first), plan its ranks."""
        old_nodes, tensors = tuple(top["nodes"]), dict(top["tensors"])
        listed = [rel.removeprefix("manifests/").removesuffix(".json")
                  for rel, _ in node_manifest_refs(top)]
        records: dict[int, ShardRecord] = {}
        loaded: set[str] = set()
        todo = wanted_nodes(old_nodes, [n.rank for n in needs])
        while todo:
            for node in todo:
                shards = hierarchy.read_node_shards(self.tiers.run_dir, ckpt.ckpt_id, top, node,
                                                    storage=self.storage)
                records.update((s.rank, s) for s in shards)
                loaded.add(node)
            gaps = uncovered(records, tensors, needs, len(old_nodes))
            if not gaps:
                break
            todo = [n for n in guess_nodes(gaps, tensors, old_nodes) if n not in loaded] or \
                [n for n in listed if n not in loaded]
        return plan_node(records, needs, ckpt_id=ckpt.ckpt_id, checksum=str(top["checksum"]),
                         old_world=len(old_nodes), new_world=self.layout.world_size)

    # -- bytes -----------------------------------------------------------------------------

    def _read(self, ckpt: CommittedCheckpoint, top: Mapping[str, Any], plan: RankPlan,
              leaves: Mapping[str, TensorLeaf], *, in_place: bool) -> Loaded | None:
        pos = self.comm.node_ranks().index(self.layout.rank)
        plan, into = land_in_place(plan, leaves, pos) if in_place else (plan, {})
        t0 = time.perf_counter()
        try:
            self.buffer.reserve(plan.size, touch=False)  # the reads fault a new buffer in
            buf = self.buffer.view(0, plan.size)
        except CheckpointError:  # above the staging limit: this restore gets its own buffer
            buf = aligned_buffer(plan.size, touch=False)
        fault_s = time.perf_counter() - t0
        counts: dict[Tier, int] = {}
        phases = RestorePhases()
        try:
            counts, phases = read_planned(plan, buf,
                                          lambda j: self._candidates(ckpt, plan.files[j]), into)
            ok = True
        except (HpcrunError, OSError) as exc:
            self.incident(ckpt, str(exc))
            ok = False
        if not self.comm.all_true(ok):
            # tensors read into in place hold bytes of a checkpoint the gang refused
            self.overwritten.update(t.key for t, ps in plan.targets
                                    if any(p.holder == LANDED for p in ps))
            return None
        t1 = time.perf_counter()
        shared = self.comm.node_all_gather_bytes(buf[:plan.shared[pos]], plan.shared)
        tensors, meta = build_tensors(plan, buf, shared, leaves)
        copy_s = time.perf_counter() - t1
        return Loaded(ckpt_id=ckpt.ckpt_id, step=int(top["step"]), extra=dict(top["extra"]),
                      tensors=tensors, meta=meta,
                      shared=self.comm.any_true(Tier.SHARED in counts),
                      files_read=len(plan.files), by_tier=counts,
                      phases=phases.plus(fault_s=fault_s, copy_s=copy_s))

    def _candidates(self, ckpt: CommittedCheckpoint,
                    shard: ShardRecord) -> list[tuple[Tier, Path | ShardSource]]:
        """Where this rank may read ``shard``, preferred first: this node's tier 0, else the
        peer tier (a copy on this node's disk or another gang node's, the owner's tier 0 or
        its partner's copy: node-to-node, sparing the shared filesystem), then tier 1 when
        the checkpoint is committed there."""
        paths = self.tiers.paths(ckpt.ckpt_id, run_id=self.identity.run_id)
        local = paths.node_local / shard.path if paths.node_local is not None else None
        out: list[tuple[Tier, Path | ShardSource]] = []
        if local is not None and local.exists():
            out.append((Tier.NODE_LOCAL, local))
        elif local is not None and self.peers is not None:
            out.extend(self.peers(ckpt.ckpt_id, shard))
        if Tier.SHARED in ckpt.tiers or local is None:
            out.append((Tier.SHARED, paths.shared / shard.path))
        return out

    # -- exchange path ---------------------------------------------------------------------

    def _exchange(self, ckpt: CommittedCheckpoint,
                  leaves: Mapping[str, TensorLeaf]) -> Loaded | None:
        m = None
        if self.layout.rank == 0:
            try:
                m = protocol.read_manifest(self.tiers.run_dir, ckpt, storage=self.storage)
            except (HpcrunError, OSError) as exc:
                self.incident(ckpt, str(exc))
        m = self.comm.broadcast_object(m)
        buf, counts, ok, phases = None, dict[Tier, int](), False, RestorePhases()
        plan = plan_gather(m, self.layout.world_size) if m is not None else None
        if m is not None and plan is not None:
            try:
                buf, counts, phases = read_assigned(
                    m, plan, self.layout.rank, lambda j: self._candidates(ckpt, m.shards[j]))
                ok = True
            except (HpcrunError, OSError) as exc:
                self.incident(ckpt, str(exc))
        if not self.comm.all_true(ok) or m is None or plan is None or buf is None:
            return None
        t0 = time.perf_counter()
        gathered = self.comm.all_gather_bytes(buf, plan.sizes)
        rows = {k: leaf for k, leaf in leaves.items()
                if leaf.placement in (Placement.ROW, Placement.CHUNK)}
        tensors, meta = assemble(m, plan, gathered, rank=self.layout.rank,
                                 world_size=self.layout.world_size, rows=rows)
        phases = phases.plus(copy_s=time.perf_counter() - t0)
        return Loaded(ckpt_id=m.ckpt_id, step=m.step, extra=dict(m.extra), tensors=tensors,
                      meta=meta, shared=self.comm.any_true(Tier.SHARED in counts),
                      files_read=len(plan.files[self.layout.rank]), by_tier=counts,
                      phases=phases)

    def incident(self, ckpt: CommittedCheckpoint, detail: str) -> None:
        """A checkpoint this rank could not use: FAULT ``storage_error`` (background)."""
        _log.warning("checkpoint %s not restorable on rank %d: %s", ckpt.ckpt_id,
                     self.layout.rank, detail)
        self.log.append_entry(FaultPayload(
            fault=FaultClass.STORAGE_ERROR, node=self.layout.node, rank=self.layout.rank,
            step=ckpt.step, signature="ckpt:verify", ckpt_id=ckpt.ckpt_id,
            detail=detail[:2000],
            background=True),  # an incident: the restore falls back, training goes on
            generation=self.identity.generation, holder=self.identity.holder)


def _check_top(top: Mapping[str, Any], ckpt: CommittedCheckpoint) -> None:
    """The fields restore planning relies on, checked (the manifest is untrusted)."""
    nodes, tensors = top.get("nodes"), top.get("tensors", {})
    ok = (top.get("ckpt_id") == ckpt.ckpt_id and isinstance(nodes, list) and nodes
          and all(isinstance(n, str) for n in nodes) and isinstance(top.get("step"), int)
          and isinstance(top.get("extra"), dict) and isinstance(top.get("checksum"), str)
          and isinstance(tensors, dict)
          and all(isinstance(v, int) and not isinstance(v, bool) for v in tensors.values()))
    if not ok:
        raise CorruptCheckpointError(f"top manifest of {ckpt.ckpt_id} lacks or mistypes ckpt_id, "
                                     "nodes, step, extra, checksum or tensors; it will not be "
                                     "restored (restore falls back to an older checkpoint)")
