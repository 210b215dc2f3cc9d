"""The checkpoint plane: a checkpoint is a distributed commit.

A reader sees the previous complete checkpoint or the new complete one, never a mixture, and a
stale worker can never publish one. See ``README.md`` in this package.

Names are imported on first use (PEP 562): most of this plane needs torch and h5py, and a
login-node command such as ``hpcrun status`` should not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrun.lazy import lazy_getattr

_WHERE = {
    "AsyncPolicy": "checkpointer", "Checkpointer": "checkpointer",
    "TierVerdict": "audit", "AuditVerdict": "audit", "verify_run": "audit",
    "CheckpointIdentity": "identity", "TierLayout": "identity",
    "FAULT_STAGES": "commit", "read_manifest": "commit",
    "DrainRound": "drain", "VerifyResult": "drain", "drain_pending": "drain",
    "drain_to_tier1": "drain", "finalize_tier1": "drain", "verify_checkpoint": "drain",
    "Manifest": "manifest",
    "GcReport": "retention", "collect_run": "retention",
    "Layout": "state", "RankLocal": "state", "RestoreResult": "state", "RowShard": "state",
    "SaveResult": "state",
    "CommittedCheckpoint": "tiers", "Tier": "tiers", "fold_checkpoints": "tiers",
}

__all__ = [
    "FAULT_STAGES",
    "AsyncPolicy",
    "AuditVerdict",
    "CheckpointIdentity",
    "Checkpointer",
    "CommittedCheckpoint",
    "DrainRound",
    "GcReport",
    "Layout",
    "Manifest",
    "RankLocal",
    "RestoreResult",
    "RowShard",
    "SaveResult",
    "Tier",
    "TierLayout",
    "TierVerdict",
    "VerifyResult",
    "collect_run",
    "drain_pending",
    "drain_to_tier1",
    "finalize_tier1",
    "fold_checkpoints",
    "read_manifest",
    "verify_checkpoint",
    "verify_run",
]


__getattr__ = lazy_getattr(__name__, {k: f"{__name__}.{v}" for k, v in _WHERE.items()},
                           globals())


if TYPE_CHECKING:
    from hpcrun.checkpoint.audit import AuditVerdict, TierVerdict, verify_run
    from hpcrun.checkpoint.checkpointer import AsyncPolicy, Checkpointer
    from hpcrun.checkpoint.commit import FAULT_STAGES, read_manifest
    from hpcrun.checkpoint.drain import (
        DrainRound,
        VerifyResult,
        drain_pending,
        drain_to_tier1,
        finalize_tier1,
        verify_checkpoint,
    )
    from hpcrun.checkpoint.identity import CheckpointIdentity, TierLayout
    from hpcrun.checkpoint.manifest import Manifest
    from hpcrun.checkpoint.retention import GcReport, collect_run
    from hpcrun.checkpoint.state import Layout, RankLocal, RestoreResult, RowShard, SaveResult
    from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier, fold_checkpoints
