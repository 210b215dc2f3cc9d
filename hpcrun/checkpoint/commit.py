"""The publish protocol's values: shard reports, refusals, the COMMIT entry, reading back.

Order, each step only after the previous one succeeded (:mod:`hpcrun.checkpoint.hierarchy` does
steps 2-4, node by node and then across nodes):

1. every rank reports its shard (record with byte counts and checksums, non-finite keys, error);
2. each node's leader refuses on any non-finite value (FAULT ``nonfinite``) or write failure
   (FAULT ``storage_error``), verifies its node's shards and writes its sub-manifest;
3. the coordinator (rank 0) checks every rank and row is covered once across the nodes and
   writes the top manifest (canonical JSON, durable rename) into the shared run directory;
4. commit = :meth:`hpcrun.control.log.RunLog.publish` of a COMMIT entry, which is void, and
   raises :class:`~hpcrun.errors.StaleGenerationError`, if a newer generation fenced first.

A manifest without a COMMIT entry that counts is staging debris; nothing ever restores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpcrun.checkpoint.identity import CheckpointIdentity
from hpcrun.checkpoint.manifest import (
    Manifest,
    ShardRecord,
    check_coverage,
    decode_manifest,
    digest_bytes,
    node_manifest_refs,
    parse_json,
)
from hpcrun.checkpoint.tiers import MANIFEST_NAME, CommittedCheckpoint, Tier, manifest_relpath
from hpcrun.control.entries import CommitPayload, FaultPayload
from hpcrun.control.log import RunLog
from hpcrun.errors import CorruptCheckpointError
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import FaultClass

FAULT_STAGES = ("staging", "shard_write", "before_manifest", "before_commit", "after_commit")
"""Named points of the protocol where a fault hook is called (for crash tests)."""


class Outcome(StrEnum):
    """How a save ended."""

    COMMITTED = "committed"
    NONFINITE = "nonfinite"
    FAILED = "failed"
    STALE = "stale"


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardReport:
    """What one rank's background writer reports (gathered on the training thread)."""

    rank: int
    """Writer rank."""
    record: ShardRecord | None
    """The shard written, None when nothing was written."""
    nonfinite: tuple[str, ...] = ()
    """Keys holding NaN or Inf."""
    error: str = ""
    """Why the write failed."""
    write_s: float = 0.0
    """Seconds spent writing."""
    timed_out: bool = False
    """The write failed because a storage operation outlived its deadline (a hung tier)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitOutcome:
    """Rank 0's verdict, broadcast to every rank."""

    outcome: Outcome
    """How the save ended."""
    message: str = ""
    """Why it did not commit."""
    bytes: int = 0
    """Bytes of all shards."""
    slot: int = -1
    """Slot of the COMMIT entry."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitProgress:
    """The run's progress at a checkpoint's step, published with its COMMIT: a PROGRESS entry
    (the step, the gang's tokens) and, when the state holds a data loader, a CURSOR entry."""

    tokens: int
    """Tokens the gang accepted up to the step."""
    cursor: Mapping[str, Any] | None = None
    """The data cursor envelope at the step (taken when the save started)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointInfo:
    """Identity of a checkpoint being committed (everything but its shards)."""

    ckpt_id: str
    """Checkpoint ID."""
    identity: CheckpointIdentity
    """Run, spec, dataset, contract and fencing token of the writer."""
    step: int
    """Step captured."""
    parent: str | None
    """Previous committed checkpoint."""
    nodes: tuple[str, ...]
    """Node of each rank."""
    checksum: str
    """Checksum algorithm."""
    created: float
    """Wall time."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Caller's extra values."""
    progress: CommitProgress | None = None
    """What the commit publishes beside the COMMIT (rank 0's; None: nothing)."""


def refusal(reports: Sequence[ShardReport], step: int) -> tuple[Outcome, str] | None:
    """Why the gathered reports cannot commit (pure); None when they may."""
    bad = {r.rank: list(r.nonfinite) for r in reports if r.nonfinite}
    if bad:
        return Outcome.NONFINITE, (
            f"refusing to commit step {step}: non-finite values (NaN/Inf) in "
            f"{ {k: v[:4] for k, v in bad.items()} } (rank: keys); roll back to the previous "
            "checkpoint and lower the learning rate or inspect the data")
    failed = [f"rank {r.rank}: {r.error}" for r in reports if r.error or r.record is None]
    if failed:
        return Outcome.FAILED, f"shard writes failed at step {step}: {'; '.join(failed[:4])}"
    return None


def commit_entry(*, run_id: str, ckpt_id: str, generation: int, step: int, tier: Tier,
                 digest: str, total_bytes: int, nodes: Sequence[str]) -> CommitPayload:
    """The COMMIT entry of a checkpoint on ``tier``: every commit path builds it here.

    Args:
        run_id: run the checkpoint belongs to.
        ckpt_id: the checkpoint.
        generation: generation that saved it (not necessarily the one publishing this entry:
            a shared-tier commit may come from a later incarnation).
        step: step it holds.
        tier: tier it is committed on.
        digest: digest of its top manifest's bytes.
        total_bytes: bytes of all its shards.
        nodes: nodes that wrote its shards.
    """
    return CommitPayload(ckpt_id=ckpt_id, tier=tier, step=step,
                         manifest=manifest_relpath(ckpt_id), digest=digest, bytes=total_bytes,
                         nodes=tuple(nodes), run_id=run_id, generation=generation)


def abandon_on_timeout(log: RunLog, info: CheckpointInfo, detail: str) -> CommitOutcome:
    """A hung tier: this checkpoint is abandoned (never committed) and training goes on; the
    incident is a background ``storage_timeout`` fault, not a fault of the gang."""
    log.append_entry(FaultPayload(
        fault=FaultClass.STORAGE_TIMEOUT, node=info.nodes[0] if info.nodes else "",
        step=info.step, signature="ckpt:storage_timeout", detail=detail[:2000],
        ckpt_id=info.ckpt_id, background=True),
        generation=info.identity.generation, holder=info.identity.holder)
    return CommitOutcome(outcome=Outcome.FAILED, message=f"checkpoint abandoned: {detail}")


def record_fault(log: RunLog, info: CheckpointInfo, *, kind: FaultClass, detail: str,
                 rank: int = 0, node: str = "") -> None:
    """Append a FAULT entry (an observation: it never publishes state)."""
    log.append_entry(FaultPayload(
        fault=kind, node=node or (info.nodes[rank] if info.nodes else ""), rank=rank,
        step=info.step, signature=f"ckpt:{kind.value}", detail=detail[:2000],
        ckpt_id=info.ckpt_id), generation=info.identity.generation,
        holder=info.identity.holder)


def read_committed_json(run_dir: Path, ckpt: CommittedCheckpoint, *,
                        storage: Storage = LOCAL_STORAGE) -> Any:
    """The top manifest of a committed checkpoint, parsed, after checking its commit digest.

    Raises:
        CorruptCheckpointError: missing, altered since its commit, or not JSON.
    """
    path = Path(run_dir) / manifest_relpath(ckpt.ckpt_id)
    if not storage.exists(path):
        raise CorruptCheckpointError(f"manifest {path} of committed checkpoint {ckpt.ckpt_id} "
                                     "is missing (deleted by GC or lost)")
    data = storage.read_bytes(path)
    if ckpt.digest and digest_bytes(data) != ckpt.digest:
        raise CorruptCheckpointError(f"manifest {path} changed since its commit (digest "
                                     f"{digest_bytes(data)[:20]}…, committed {ckpt.digest[:20]}…); "
                                     "it will not be restored")
    return parse_json(data, f"manifest {path}")


def read_manifest(run_dir: Path, ckpt: CommittedCheckpoint, *,
                  storage: Storage = LOCAL_STORAGE) -> Manifest:
    """Load and verify the manifest of a committed checkpoint (digest, schema, paths, coverage).

    Raises:
        CorruptCheckpointError: missing, altered since commit, malformed or incomplete.
    """
    path = Path(run_dir) / manifest_relpath(ckpt.ckpt_id)
    raw = read_committed_json(run_dir, ckpt, storage=storage)
    subs: list[Any] = []
    for rel, digest in node_manifest_refs(raw):
        sub = storage.read_bytes(path.parent / rel)
        if digest_bytes(sub) != digest:
            raise CorruptCheckpointError(f"sub-manifest {rel} of {ckpt.ckpt_id} fails its digest")
        subs.extend(parse_json(sub, f"sub-manifest {rel}").get("shards", []))
    m = decode_manifest(raw, subs)
    if m.ckpt_id != ckpt.ckpt_id or (problems := check_coverage(m)):
        raise CorruptCheckpointError(f"manifest of {ckpt.ckpt_id} is inconsistent: "
                                     f"{m.ckpt_id if m.ckpt_id != ckpt.ckpt_id else problems[:3]}")
    return m


__all__ = ["FAULT_STAGES", "MANIFEST_NAME", "CheckpointInfo", "CommitOutcome", "Outcome",
           "ShardReport", "commit_entry", "read_manifest",
           "record_fault", "refusal"]
