"""The run log's checkpoint payloads: validated progress, a commit on a tier, a node's drain
to the shared tier, and the data cursor at a committed step.

Part of the vocabulary of :mod:`hpcrun.control.entries` (which re-exports them and decodes
them); the checkpoint plane writes them through its commit and drain, and the record folds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcrun.control.payload import EntryKind, EntryPayload, FieldReader, present
from hpcrun.vocab import WRITTEN_TIERS, Tier

__all__ = ["CommitPayload", "CursorPayload", "DrainedPayload", "ProgressPayload"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ProgressPayload(EntryPayload):
    """Validated progress: a step whose checkpoint committed."""

    KIND: ClassVar[EntryKind] = EntryKind.PROGRESS
    step: int
    """Optimizer step."""
    tokens: int | None = None
    """Tokens accepted up to ``step`` (the previous count stands when absent)."""

    def fields(self) -> dict[str, Any]:
        return {"step": self.step, **present(tokens=self.tokens)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"step": f.integer("step"), "tokens": f.integer("tokens", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitPayload(EntryPayload):
    """A checkpoint committed on one tier."""

    KIND: ClassVar[EntryKind] = EntryKind.COMMIT
    ckpt_id: str
    """Checkpoint id, unique within the run."""
    tier: Tier
    """Tier it is committed on."""
    step: int
    """Step it holds."""
    manifest: str
    """Manifest path relative to the run directory."""
    digest: str = ""
    """Digest of the manifest's bytes."""
    bytes: int = 0
    """Total bytes of its shards."""
    nodes: tuple[str, ...] = ()
    """Nodes that wrote shards."""
    run_id: str | None = None
    """Run it belongs to (absent in shared-tier commits written before schema 1 had it)."""
    generation: int | None = None
    """Generation that saved it (same caveat)."""

    def fields(self) -> dict[str, Any]:
        return {"ckpt_id": self.ckpt_id, "tier": self.tier.value, "step": self.step,
                "manifest": self.manifest, "digest": self.digest, "bytes": self.bytes,
                "nodes": list(self.nodes),
                **present(run_id=self.run_id, generation=self.generation)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"ckpt_id": f.text("ckpt_id"), "tier": f.choice("tier", Tier, only=WRITTEN_TIERS),
                "step": f.integer("step"), "manifest": f.text("manifest"),
                "digest": f.text("digest", ""), "bytes": f.integer("bytes", 0),
                "nodes": f.texts("nodes", ()), "run_id": f.text("run_id", None),
                "generation": f.integer("generation", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainedPayload(EntryPayload):
    """One node copied its shards of a checkpoint to the shared tier."""

    KIND: ClassVar[EntryKind] = EntryKind.DRAINED
    ckpt_id: str
    """Checkpoint drained."""
    node: str
    """Node that drained it."""
    bytes: int = 0
    """Shard bytes this node copied (0 in entries that predate the field)."""
    seconds: float = 0.0
    """How long the copy and its verification took: with ``bytes``, the measured drain rate
    the final drain's wait follows (:func:`hpcrun.checkpoint.drain.drain_wait_s`)."""

    def fields(self) -> dict[str, Any]:
        return {"ckpt_id": self.ckpt_id, "node": self.node, "bytes": self.bytes,
                "seconds": round(self.seconds, 6)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"ckpt_id": f.text("ckpt_id"), "node": f.text("node"),
                "bytes": f.integer("bytes", 0), "seconds": f.number("seconds", 0.0)}


@dataclass(frozen=True, kw_only=True, slots=True)
class CursorPayload(EntryPayload):
    """The data cursor at a committed step."""

    KIND: ClassVar[EntryKind] = EntryKind.CURSOR
    step: int
    """Committed step."""
    cursor: Mapping[str, Any]
    """The data plane's cursor envelope (opaque here)."""

    def fields(self) -> dict[str, Any]:
        return {"step": self.step, "cursor": dict(self.cursor)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"step": f.integer("step"), "cursor": f.mapping("cursor")}
