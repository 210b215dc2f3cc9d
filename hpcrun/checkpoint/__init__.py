"""The checkpoint plane: a checkpoint is a distributed commit.

A reader sees the previous complete checkpoint or the new complete one, never a mixture, and a
stale worker can never publish one. See ``README.md`` in this package.
"""

from __future__ import annotations

from hpcrun.checkpoint.checkpointer import AsyncPolicy, Checkpointer
from hpcrun.checkpoint.commit import FAULT_STAGES, read_manifest
from hpcrun.checkpoint.drain import VerifyResult, drain_pending, finalize_tier1, verify_checkpoint
from hpcrun.checkpoint.manifest import Manifest
from hpcrun.checkpoint.retention import GcReport, collect_run
from hpcrun.checkpoint.state import (
    Layout,
    RankLocal,
    RestoreResult,
    RowShard,
    SaveResult,
)
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier, fold_checkpoints

__all__ = [
    "FAULT_STAGES",
    "AsyncPolicy",
    "Checkpointer",
    "CommittedCheckpoint",
    "GcReport",
    "Layout",
    "Manifest",
    "RankLocal",
    "RestoreResult",
    "RowShard",
    "SaveResult",
    "Tier",
    "VerifyResult",
    "collect_run",
    "drain_pending",
    "finalize_tier1",
    "fold_checkpoints",
    "read_manifest",
    "verify_checkpoint",
]
