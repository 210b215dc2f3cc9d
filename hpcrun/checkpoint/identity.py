"""Who writes a checkpoint and where its tiers are: the two values a Checkpointer is built on.

:class:`CheckpointIdentity` is the one definition of the fields every checkpoint of an
incarnation shares (run, spec digest, dataset, resume contract, fencing token); the commit's
:class:`~hpcrun.checkpoint.commit.CheckpointInfo` carries it and the manifest records it.
:class:`TierLayout` says where a rank's shards go: node-local tier 0 when the node has one, the
shared tier (the run directory) always.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcrun.checkpoint.tiers import Tier, TierPaths, tier_paths
from hpcrun.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointIdentity:
    """What every checkpoint an incarnation writes has in common."""

    run_id: str
    """Run (the run directory's name)."""
    spec_id: str
    """Digest of the run spec."""
    dataset_id: str = ""
    """Dataset ID the data cursor refers to ("" without a dataset manifest)."""
    contract: str = "exact-order"
    """Resume contract the run declared."""
    generation: int
    """Generation of the writer (its fencing token)."""
    holder: str
    """Incarnation of the writer, paired with ``generation``."""

    def __post_init__(self) -> None:
        if not self.run_id or not self.holder:
            raise ConfigError(f"checkpoint identity needs a run id and a holder, found "
                              f"run_id={self.run_id!r} holder={self.holder!r}; build it from "
                              "the incarnation's fence")


@dataclass(frozen=True, kw_only=True, slots=True)
class TierLayout:
    """Where one node's checkpoint tiers are."""

    run_dir: Path
    """Run directory on the shared filesystem: tier 1 is ``run_dir/ckpt``."""
    node_local_root: Path | None = None
    """This node's tier-0 directory, None when the run has no tier 0."""

    @property
    def write_tier(self) -> Tier:
        """Tier a save commits on first: node-local when there is one."""
        return Tier.NODE_LOCAL if self.node_local_root is not None else Tier.SHARED

    def paths(self, ckpt_id: str, *, run_id: str) -> TierPaths:
        """Checkpoint ``ckpt_id``'s directory on each tier."""
        return tier_paths(self.run_dir, ckpt_id, local_root=self.node_local_root, run_id=run_id)
