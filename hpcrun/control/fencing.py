"""Generation fencing by log order (pure).

A fencing token is ``(generation, holder)``. An incarnation claims generation ``g + 1`` by
appending a ``fence`` entry; the claim is valid only when ``g`` is the generation in force at the
fence's slot, so of two racing claims for the same generation the earlier slot wins. Every other
entry counts only when its ``(generation, holder)`` equals the token in force at its slot: an entry
a stale writer appends after a newer fence is void, whatever that writer checked before writing.
There is no check-then-write anywhere: validity is a function of the log's order alone.

Entries written with :data:`UNFENCED` generation are observations (notes, login-node sightings of
the scheduler, operation intents) that anyone may append; they are always kept, and the record fold
must never let them publish checkpoints, progress, cursors or results.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hpcrun.control.entries import EntryKind, LogEntry

UNFENCED = -1
"""Generation of observation entries, which need no ownership."""

PUBLISH_KINDS = frozenset({
    EntryKind.COMMIT, EntryKind.DRAINED, EntryKind.PROGRESS, EntryKind.CURSOR, EntryKind.RESULT,
    EntryKind.STATE, EntryKind.SUPERVISE,
})
"""Kinds that publish run state: only ever valid under the token in force."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Fence:
    """The token in force: generation, who holds it, and the slot of its fence entry."""

    generation: int
    """Generation number (0 before any incarnation fenced)."""
    holder: str
    """Unique id of the incarnation holding it ("" before any fence)."""
    slot: int
    """Slot of the fence entry (-1 before any fence)."""


NO_FENCE = Fence(generation=0, holder="", slot=-1)


def is_valid_claim(current: Fence, entry: LogEntry) -> bool:
    """Whether fence ``entry`` validly claims the generation after ``current``."""
    return entry.kind == EntryKind.FENCE and entry.generation == current.generation + 1


def apply_entry(current: Fence, entry: LogEntry) -> tuple[Fence, bool]:
    """One step of the fold: the token in force after ``entry``, and whether ``entry`` counts."""
    if entry.kind == EntryKind.FENCE:
        if is_valid_claim(current, entry):
            return Fence(generation=entry.generation, holder=entry.holder, slot=entry.slot), True
        return current, False
    if entry.generation == UNFENCED:
        return current, entry.kind not in PUBLISH_KINDS
    return current, (entry.generation, entry.holder) == (current.generation, current.holder)


def fold_fences(entries: Iterable[LogEntry], start: Fence = NO_FENCE
                ) -> tuple[Fence, list[LogEntry]]:
    """Return the token in force after ``entries`` and the entries that count, in slot order.

    ``entries`` must be in slot order. Void entries (stale generation, lost fence claims) are
    dropped; :data:`UNFENCED` observations are kept unless their kind publishes. ``start`` is the
    token in force before the first of ``entries`` (to continue a fold incrementally).
    """
    current = start
    valid: list[LogEntry] = []
    for entry in entries:
        current, counts = apply_entry(current, entry)
        if counts:
            valid.append(entry)
    return current, valid


def is_effective(entries: Iterable[LogEntry], slot: int) -> bool:
    """Whether the entry at ``slot`` counts, given every entry up to and including it."""
    _, valid = fold_fences(e for e in entries if e.slot <= slot)
    return any(e.slot == slot for e in valid)
