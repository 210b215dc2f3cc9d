"""Where checkpoints live, and which are committed where (a pure fold over the run log).

Tier 0 (``node_local``): ``<node_local_root>/<run_id>/ckpt/<ckpt_id>/<node>/rank-00003.h5``; fast,
lost with the node, usually purged at job end. Tier 1 (``shared``):
``<run_dir>/ckpt/<ckpt_id>/<node>/rank-00003.h5`` on the parallel filesystem. The manifest is
always in the shared run directory: ``<run_dir>/ckpt/<ckpt_id>/manifest.json``.

A checkpoint is committed on a tier only through a COMMIT entry that counts under
:func:`hpcrun.control.fencing.fold_fences`; directories on disk prove nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from hpcrun.control.entries import (
    CommitPayload,
    DrainedPayload,
    EntryKind,
    EntryPayload,
    LogEntry,
    PayloadError,
    decode,
)
from hpcrun.control.fencing import fold_fences
from hpcrun.errors import CheckpointError
from hpcrun.vocab import Tier

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CKPT_DIR = "ckpt"
MANIFEST_NAME = "manifest.json"


def checkpoint_id(*, generation: int, step: int, holder: str) -> str:
    """The ID every rank derives for a save, without talking: generation, step, incarnation."""
    return f"g{generation:06d}-s{step:010d}-{holder[:8] or 'x'}"


def check_id(ckpt_id: str) -> str:
    """Return ``ckpt_id`` if it is a safe directory name; raise CheckpointError if not."""
    if not _ID_RE.match(ckpt_id):
        raise CheckpointError(f"checkpoint id {ckpt_id!r} is not a plain name; the log entry "
                              "is corrupt or forged")
    return ckpt_id


def shared_root(run_dir: Path) -> Path:
    """Tier 1 (and manifests): ``<run_dir>/ckpt``."""
    return Path(run_dir) / CKPT_DIR


def node_local_root(root: Path, run_id: str) -> Path:
    """Tier 0 of one node: ``<node_local_root>/<run_id>/ckpt``."""
    return Path(root) / run_id / CKPT_DIR


def manifest_relpath(ckpt_id: str) -> str:
    """Manifest path relative to the run directory (as recorded in COMMIT entries)."""
    return f"{CKPT_DIR}/{check_id(ckpt_id)}/{MANIFEST_NAME}"


@dataclass(frozen=True, kw_only=True, slots=True)
class CommittedCheckpoint:
    """A checkpoint with at least one COMMIT entry that counts."""

    ckpt_id: str
    """Checkpoint ID."""
    step: int
    """Step captured."""
    generation: int
    """Generation that committed it first."""
    manifest: str
    """Manifest path relative to the run directory."""
    digest: str
    """Digest of the manifest bytes, as committed."""
    bytes: int
    """Bytes of all shards."""
    nodes: tuple[str, ...]
    """Nodes holding shards."""
    slot: int
    """Slot of its first COMMIT entry (log order = commit order)."""
    committed_at: float
    """Wall time of its first commit."""
    tiers: frozenset[Tier] = frozenset()
    """Tiers it is committed on."""
    shared_at: float | None = None
    """Wall time of its tier-1 commit, if any."""
    drained: frozenset[str] = frozenset()
    """Nodes whose DRAINED entry counts."""
    run_id: str | None = None
    """Run it belongs to, as its first commit says (None in commits that predate the field)."""


def _counted_payloads(entries: Iterable[LogEntry]) -> Iterator[tuple[LogEntry, EntryPayload]]:
    """Entries that count under generation fencing, decoded; malformed ones are left out."""
    _, valid = fold_fences(entries)
    for e in valid:
        if e.kind not in (EntryKind.COMMIT, EntryKind.DRAINED):
            continue
        try:
            yield e, decode(e)
        except PayloadError:
            continue


def fold_checkpoints(entries: Iterable[LogEntry]) -> list[CommittedCheckpoint]:
    """Committed checkpoints in commit order, from log entries in slot order (pure).

    Only entries that count under generation fencing are used; malformed payloads are ignored.
    """
    found: dict[str, CommittedCheckpoint] = {}
    drained: dict[str, set[str]] = {}
    for e, p in _counted_payloads(entries):
        if isinstance(p, DrainedPayload):
            drained.setdefault(p.ckpt_id, set()).add(p.node)
        if not isinstance(p, CommitPayload) or not _ID_RE.match(p.ckpt_id):
            continue
        old = found.get(p.ckpt_id)
        if old is None:
            old = CommittedCheckpoint(
                ckpt_id=p.ckpt_id, step=p.step, generation=e.generation, manifest=p.manifest,
                digest=p.digest, bytes=p.bytes, nodes=p.nodes, slot=e.slot, committed_at=e.ts,
                run_id=p.run_id)
        shared_at = e.ts if p.tier == Tier.SHARED and old.shared_at is None else old.shared_at
        found[p.ckpt_id] = replace(old, tiers=old.tiers | {p.tier}, shared_at=shared_at)
    return [replace(c, drained=frozenset(drained.get(c.ckpt_id, ()))) for c in found.values()]


@dataclass(frozen=True, kw_only=True, slots=True)
class TierPaths:
    """Directories of one checkpoint on each tier, for one node."""

    shared: Path
    """``<run_dir>/ckpt/<ckpt_id>``."""
    node_local: Path | None = None
    """``<node_local_root>/<run_id>/ckpt/<ckpt_id>``, when this node has a tier 0."""


def tier_paths(run_dir: Path, ckpt_id: str, *, local_root: Path | None,
               run_id: str) -> TierPaths:
    check_id(ckpt_id)
    local = node_local_root(local_root, run_id) / ckpt_id if local_root is not None else None
    return TierPaths(shared=shared_root(run_dir) / ckpt_id, node_local=local)
