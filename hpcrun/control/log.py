"""The run record's append-only log on the shared filesystem.

``RUN_DIR/log/000000123.json`` holds entry 123. An entry is created atomically at the next free
slot (:meth:`hpcrun.storage.Storage.create_exclusive`); when the slot is taken the writer tries the
next. Nothing is ever rewritten, so concurrent writers (the job's agents, ``hpcrun cancel`` on the
login node) cannot overwrite each other, and the order of slots is the order of events. flock is
not used: it is node-local or absent on parallel filesystems.

Entries are untrusted input when read back: a malformed one is reported and skipped, never
guessed at.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    LOG_SCHEMA_VERSION,
    EntryKind,
    EntryPayload,
    FencePayload,
    LogEntry,
)
from hpcrun.control.fencing import NO_FENCE, Fence, apply_entry
from hpcrun.errors import RecordError, StaleGenerationError
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = ["LOG_SCHEMA_VERSION", "SLOT_DIGITS", "EntryKind", "LogEntry", "RunLog", "new_holder",
           "parse_slot", "slot_name"]

SLOT_DIGITS = 9
_SLOT_RE = re.compile(rf"^(\d{{{SLOT_DIGITS}}})\.json$")


def slot_name(slot: int) -> str:
    return f"{slot:0{SLOT_DIGITS}d}.json"


def parse_slot(name: str) -> int | None:
    m = _SLOT_RE.match(name)
    return int(m.group(1)) if m else None


def new_holder(prefix: str = "") -> str:
    """A fresh incarnation id."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


class RunLog:
    """Append and read a run's log. Effectful shell around the pure fold in ``fencing``."""

    def __init__(self, run_dir: str | os.PathLike[str], *, storage: Storage = LOCAL_STORAGE,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "log"
        self._storage = storage
        self._clock = clock
        self._next_hint = 0
        self._fold_cache: tuple[int, Fence] = (-1, NO_FENCE)
        self.skipped: list[int] = []

    def append(self, kind: str, *, generation: int, holder: str,
               payload: Mapping[str, Any] | None = None) -> LogEntry:
        """Append an entry at the next free slot and return it (with its slot)."""
        entry = LogEntry(slot=-1, kind=str(kind), generation=generation, holder=holder,
                         ts=self._clock.now(), writer=f"{socket.gethostname()}:{os.getpid()}",
                         payload=dict(payload or {}))
        data = entry.to_bytes()
        # Every slot below this writer's hint is taken (slots are taken in order), so trying
        # the hint first is safe and spares a directory listing per append on a long log; on
        # a collision, list once to jump past the other writers.
        slot = self._next_hint
        if slot == 0 or not self._storage.create_exclusive(self.log_dir / slot_name(slot), data):
            slot = max(slot, self._last_slot() + 1)
            while not self._storage.create_exclusive(self.log_dir / slot_name(slot), data):
                slot += 1
        self._next_hint = slot + 1
        return LogEntry(slot=slot, kind=entry.kind, generation=generation, holder=holder,
                        ts=entry.ts, writer=entry.writer, payload=entry.payload)

    def append_entry(self, payload: EntryPayload, *, generation: int,
                     holder: str) -> LogEntry:
        """Append a typed payload (see :mod:`hpcrun.control.entries`); as :meth:`append`."""
        return self.append(payload.entry_kind, generation=generation, holder=holder,
                           payload=payload.to_payload())

    def _last_slot(self) -> int:
        slots = [s for s in map(parse_slot, self._storage.listdir(self.log_dir)) if s is not None]
        return max(slots, default=-1)

    def read(self, since_slot: int = 0) -> list[LogEntry]:
        """Every well-formed entry with slot >= ``since_slot``, in slot order.

        Malformed entries are skipped and their slots listed in ``self.skipped``.
        """
        if not self._storage.exists(self.log_dir):
            raise RecordError(f"no run log at {self.log_dir}; is this a run directory? "
                              "Use `hpcrun list` to see runs")
        out: list[LogEntry] = []
        for name in self._storage.listdir(self.log_dir):
            slot = parse_slot(name)
            if slot is None or slot < since_slot:
                continue
            try:
                out.append(LogEntry.from_bytes(slot, self._storage.read_bytes(self.log_dir / name)))
            except ValueError:  # MalformedEntryError, and UnicodeDecodeError from the bytes
                self.skipped.append(slot)
        return out

    def claim(self, holder: str) -> LogEntry:
        """Claim the next generation for ``holder``; raise if another claim won the race.

        Returns the fence entry. The restore point must be chosen from entries before its slot.
        """
        current, _ = self._fold_through(None)
        fence = self.append_entry(FencePayload(), generation=current.generation + 1,
                                  holder=holder)
        if not self._fold_through(fence.slot)[1]:
            raise StaleGenerationError(
                f"lost the race for generation {fence.generation}: another incarnation fenced "
                f"first (this fence at slot {fence.slot} is void); exit and let the winner run"
            )
        return fence

    def publish(self, kind: str, *, generation: int, holder: str,
                payload: Mapping[str, Any] | None = None) -> LogEntry:
        """Append a fenced entry and confirm it counts; raise StaleGenerationError when void.

        The entry's validity is decided by its slot alone; the re-read only tells the writer.
        """
        entry = self.append(kind, generation=generation, holder=holder, payload=payload)
        if not self._fold_through(entry.slot)[1]:
            raise StaleGenerationError(
                f"{kind} entry at slot {entry.slot} is void: generation {generation} was fenced "
                "out by a newer incarnation; this worker must stop publishing"
            )
        return entry

    def publish_entry(self, payload: EntryPayload, *, generation: int,
                      holder: str) -> LogEntry:
        """Publish a typed payload (see :mod:`hpcrun.control.entries`); as :meth:`publish`.

        Raises:
            StaleGenerationError: the entry is void (this generation was fenced out).
        """
        return self.publish(payload.entry_kind, generation=generation, holder=holder,
                            payload=payload.to_payload())

    def _fold_through(self, slot: int | None) -> tuple[Fence, bool]:
        """Fence in force after the newest entry, and whether the entry at ``slot`` counts.

        Entries are immutable and slots are taken in order, so the fold continues from the last
        slot this object folded and reads only newer entries (a publish stays cheap on long logs).
        """
        done, current = self._fold_cache
        if slot is not None and slot <= done:
            done, current = -1, NO_FENCE
        counts = False
        for entry in self.read(since_slot=done + 1):
            current, ok = apply_entry(current, entry)
            counts = counts or (ok and entry.slot == slot)
            done = entry.slot
        self._fold_cache = (done, current)
        return current, counts
