"""Partner copies of node-local checkpoints: who holds whose shards, and what to do next (pure).

After a tier-0 commit each gang node's agent copies its node's shards to its *partner*, the
next node of the active gang (a ring: node i -> node i+1, the last to the first). When a node
is lost, the restore reads its shards from the node holding a complete, verified copy (the peer
tier, :mod:`hpcrun.checkpoint.peer.read`), before falling back to tier 1.

The run log says which copies exist: a ``partner_copy`` note per copy (checkpoint, whose shards,
held by which node, bytes, complete or not), counted only under generation fencing. A copy is
used only when its newest note says complete; directories on disk prove nothing.

On a holder's tier 0 the copies live under ``<node_local_root>/<run_id>/partner/<ckpt_id>/
<owner>/rank-00003.h5``, beside its own shards under ``<node_local_root>/<run_id>/ckpt/``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.checkpoint.tiers import CommittedCheckpoint, check_id
from hpcrun.control.entries import LogEntry, PartnerCopyNote, PayloadError, decode
from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import EntryKind
from hpcrun.errors import CheckpointError
from hpcrun.vocab import Tier

PARTNER_DIR = "partner"
"""Subdirectory of a node's run-scoped tier 0 holding the copies it keeps for its partner."""
KEEP_PARTNER_COPIES = 2
"""Checkpoints a holder keeps per partner (the newest ones; older copies are deleted)."""

_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHARD_RE = re.compile(r"^rank-[0-9]{5,9}\.h5$")


def ring_partner(gang: Sequence[str], node: str) -> str | None:
    """The node that holds ``node``'s copies: the next one of the gang, in node-rank order.

    None when ``node`` is not in the gang or the gang has a single node (no one to hold them).
    """
    if node not in gang or len(gang) < 2:
        return None
    return gang[(list(gang).index(node) + 1) % len(gang)]


def check_relpath(rel: str) -> tuple[str, str, str]:
    """``<ckpt_id>/<owner>/rank-00003.h5`` split and checked; a path that could escape the
    copy directory (``..``, absolute, extra parts, odd names) raises CheckpointError."""
    parts = rel.split("/")
    if len(parts) != 3 or not _NODE_RE.match(parts[1]) or not _SHARD_RE.match(parts[2]):
        raise CheckpointError(f"partner copy path {rel!r} is not <ckpt_id>/<node>/"
                              "rank-NNNNN.h5; the request is malformed or forged")
    check_id(parts[0])
    return parts[0], parts[1], parts[2]


def partner_root(node_local_root: Path, run_id: str) -> Path:
    """Where a node keeps the copies it holds for its partner."""
    return Path(node_local_root) / run_id / PARTNER_DIR


@dataclass(frozen=True, kw_only=True, slots=True)
class PartnerCopy:
    """The newest word the log has on one copy of one node's shards."""

    ckpt_id: str
    """Checkpoint."""
    owner: str
    """Node whose shards these are (the node that wrote them)."""
    held_by: str
    """Node holding the copy."""
    bytes: int
    """Shard bytes copied."""
    complete: bool
    """Every shard of the owner copied and verified against the manifest's checksums."""
    slot: int
    """Slot of that note."""


def fold_partner_copies(entries: Iterable[LogEntry]) -> dict[tuple[str, str, str], PartnerCopy]:
    """``(ckpt_id, owner, held_by)`` -> its newest note, from notes that count under fencing
    (pure; malformed notes are left out)."""
    _, valid = fold_fences(entries)
    out: dict[tuple[str, str, str], PartnerCopy] = {}
    for e in valid:
        if e.kind != EntryKind.NOTE or e.payload.get("event") != PartnerCopyNote.EVENT.value:
            continue
        try:
            p = decode(e)
        except PayloadError:
            continue
        if isinstance(p, PartnerCopyNote):
            out[(p.ckpt_id, p.owner, p.held_by)] = PartnerCopy(
                ckpt_id=p.ckpt_id, owner=p.owner, held_by=p.held_by, bytes=p.bytes,
                complete=p.complete, slot=e.slot)
    return out


def complete_copy(copies: dict[tuple[str, str, str], PartnerCopy], ckpt_id: str, owner: str,
                  *, holders: Collection[str]) -> PartnerCopy | None:
    """A complete copy of ``owner``'s shards of ``ckpt_id`` held by one of ``holders`` (the
    newest note first), or None."""
    found = [c for (ck, ow, held), c in copies.items()
             if ck == ckpt_id and ow == owner and held in holders and held != owner
             and c.complete]
    return max(found, key=lambda c: c.slot, default=None)


def pending_push(committed: Sequence[CommittedCheckpoint],
                 copies: dict[tuple[str, str, str], PartnerCopy], *, node: str,
                 partner: str) -> CommittedCheckpoint | None:
    """The checkpoint ``node`` should copy to ``partner`` now: the newest tier-0 commit that
    holds ``node``'s shards, unless ``partner`` already holds a complete copy of it (an older
    one is superseded and never copied)."""
    mine = [c for c in committed if Tier.NODE_LOCAL in c.tiers and node in c.nodes]
    if not mine:
        return None
    newest = mine[-1]
    held = copies.get((newest.ckpt_id, node, partner))
    return None if held is not None and held.complete else newest


def retired_copies(held: Iterable[str], *, keep: int = KEEP_PARTNER_COPIES) -> list[str]:
    """Checkpoint directories a holder deletes for one partner: all but the newest ``keep``
    (checkpoint ids order by generation, then step)."""
    return sorted(held)[:-keep] if keep > 0 else sorted(held)
