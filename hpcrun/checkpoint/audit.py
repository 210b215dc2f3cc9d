"""Verify a run's committed checkpoints on the tiers where they are committed (``ckpt verify``).

:func:`plan_audit` is pure: for each committed checkpoint and tier it decides, from what is
present on disk and what retention may remove, whether to read the copy back or what to say
without reading it. :func:`verify_run` lists the tiers, reads back what the plan says and
returns one :class:`TierVerdict` per copy. Only a copy that should be there and is missing, or
that fails its checks, is a failure:

- a checkpoint whose directory retention could have removed (any ``keep_last`` ≥ 2 allows it:
  :func:`~hpcrun.checkpoint.retention.select_shared_victims` with K = 2) is *retired*;
- a tier-0 copy that is gone is *gone* (node-local storage is purged at job end and lost with
  its node; retention removes it once tier 1 holds it or a newer one);
- a node-local-only checkpoint whose node's tier 0 this machine cannot reach is *not verifiable
  from the login node*.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from hpcrun.checkpoint.drain import verify_checkpoint
from hpcrun.checkpoint.retention import select_local_victims, select_shared_victims
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier, node_local_root, shared_root
from hpcrun.storage import LOCAL_STORAGE, Storage

RETENTION_FLOOR = 2
"""The smallest ``keep_last`` retention accepts: what it may remove under any setting."""


class AuditVerdict(StrEnum):
    """What ``ckpt verify`` found for one copy of a checkpoint."""

    OK = "ok"
    FAILED = "FAILED"
    RETIRED = "retired"
    GONE = "gone"
    UNREACHABLE = "not verifiable"


@dataclass(frozen=True, kw_only=True, slots=True)
class TierVerdict:
    """One copy of a checkpoint (on one tier, for tier 0 on one node) and what was found."""

    ckpt_id: str
    """The checkpoint."""
    tier: Tier
    """The tier of the copy."""
    node: str = ""
    """For tier 0: the node holding the copy."""
    verdict: AuditVerdict = AuditVerdict.OK
    """The finding; only FAILED is damage."""
    detail: str = ""
    """What was found, for people."""
    bytes_read: int = 0
    """Shard bytes read back and checked."""

    @property
    def where(self) -> str:
        return f"{self.tier}:{self.node}" if self.node else str(self.tier)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadBack:
    """A copy to read back and check."""

    ckpt: CommittedCheckpoint
    """The checkpoint."""
    tier: Tier
    """Its tier."""
    node: str = ""
    """For tier 0: the node whose copy to read."""


Planned = TierVerdict | ReadBack


def plan_audit(committed: Sequence[CommittedCheckpoint], *, shared_present: Collection[str],
               local_present: Mapping[str, Collection[str]] | None) -> list[Planned]:
    """What to read back, and what to report without reading (pure).

    Args:
        committed: the run's committed checkpoints, in commit order.
        shared_present: checkpoint directories under ``RUN_DIR/ckpt``.
        local_present: per node whose tier 0 this machine reaches, the checkpoint directories
            there; None when no node's tier 0 is reachable.
    """
    retired_shared = set(select_shared_victims(committed, keep_last=RETENTION_FLOOR))
    retired_local = set(select_local_victims(
        committed, [c.ckpt_id for c in committed], keep_last=RETENTION_FLOOR))
    out: list[Planned] = []
    for c in committed:
        if c.ckpt_id not in shared_present and c.ckpt_id in retired_shared:
            out.append(TierVerdict(ckpt_id=c.ckpt_id, tier=_first_tier(c),
                                   verdict=AuditVerdict.RETIRED,
                                   detail="removed by retention (older than the kept ones)"))
            continue
        if Tier.SHARED in c.tiers:
            out.append(_shared(c, c.ckpt_id in shared_present))
        if Tier.NODE_LOCAL in c.tiers:
            out += _node_local(c, local_present, c.ckpt_id in retired_local,
                               only=Tier.SHARED not in c.tiers,
                               manifest=c.ckpt_id in shared_present)
    return out


def _first_tier(c: CommittedCheckpoint) -> Tier:
    return Tier.SHARED if Tier.SHARED in c.tiers else Tier.NODE_LOCAL


def _shared(c: CommittedCheckpoint, present: bool) -> Planned:
    if present:
        return ReadBack(ckpt=c, tier=Tier.SHARED)
    return TierVerdict(ckpt_id=c.ckpt_id, tier=Tier.SHARED, verdict=AuditVerdict.FAILED, detail=(
        f"committed on the shared tier but ckpt/{c.ckpt_id} is missing, and retention keeps "
        "it; restore from a backup of the run directory"))


def _node_local(c: CommittedCheckpoint, local: Mapping[str, Collection[str]] | None,
                retired: bool, *, only: bool, manifest: bool) -> list[Planned]:
    if only and not manifest:
        return [TierVerdict(ckpt_id=c.ckpt_id, tier=Tier.NODE_LOCAL, verdict=AuditVerdict.FAILED,
                            detail=f"its manifest ckpt/{c.ckpt_id}/manifest.json is missing "
                                   "from the run directory, and retention keeps it")]
    if local is None or not set(c.nodes) & set(local):
        return [TierVerdict(ckpt_id=c.ckpt_id, tier=Tier.NODE_LOCAL,
                            verdict=AuditVerdict.UNREACHABLE,
                            detail="node-local only, not verifiable from the login node")] \
            if only else []
    return [_node_copy(c, node, local[node], retired) for node in c.nodes if node in local]


def _node_copy(c: CommittedCheckpoint, node: str, present: Collection[str],
               retired: bool) -> Planned:
    if c.ckpt_id in present:
        return ReadBack(ckpt=c, tier=Tier.NODE_LOCAL, node=node)
    if retired:
        return TierVerdict(ckpt_id=c.ckpt_id, tier=Tier.NODE_LOCAL, node=node,
                           verdict=AuditVerdict.RETIRED,
                           detail="removed by retention once tier 1 held it or a newer one")
    return TierVerdict(ckpt_id=c.ckpt_id, tier=Tier.NODE_LOCAL, node=node,
                       verdict=AuditVerdict.GONE,
                       detail="no longer on the node (tier 0 is purged at job end and lost "
                              "with its node)")


def verify_run(run_dir: Path, committed: Sequence[CommittedCheckpoint], *,
               local_roots: Mapping[str, Path] | None = None, only: str | None = None,
               progress: Callable[[int], None] = lambda n: None,
               storage: Storage = LOCAL_STORAGE) -> list[TierVerdict]:
    """Verify every committed checkpoint on the tiers where it is committed.

    Args:
        committed: every committed checkpoint of the run, in commit order (retention's
            choices depend on all of them).
        only: verify just this checkpoint id.
        local_roots: node -> that node's node-local root, for the nodes whose tier 0 this
            machine reaches (the local backend's emulated nodes, or one node named by the
            operator); None when none is reachable.
        progress: called with the bytes of each shard once it is checked.
    """
    run_id = Path(run_dir).name
    local = None if local_roots is None else {
        node: set(storage.listdir(node_local_root(root, run_id)))
        for node, root in local_roots.items()}
    planned = plan_audit(committed, shared_present=set(storage.listdir(shared_root(run_dir))),
                         local_present=local)
    planned = [p for p in planned if only is None or _id(p) == only]
    return [p if isinstance(p, TierVerdict) else
            _read_back(run_dir, p, local_roots or {}, progress, storage) for p in planned]


def _read_back(run_dir: Path, p: ReadBack, roots: Mapping[str, Path],
               progress: Callable[[int], None], storage: Storage) -> TierVerdict:
    local = (roots[p.node], p.node) if p.node else None
    result = verify_checkpoint(run_dir, p.ckpt, local=local, progress=progress, storage=storage)
    return TierVerdict(ckpt_id=p.ckpt.ckpt_id, tier=p.tier, node=p.node,
                       verdict=AuditVerdict.OK if result.ok else AuditVerdict.FAILED,
                       detail="; ".join(result.problems), bytes_read=result.bytes_read)


def _id(p: Planned) -> str:
    return p.ckpt_id if isinstance(p, TierVerdict) else p.ckpt.ckpt_id
