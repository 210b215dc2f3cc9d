"""The run record's append-only log on the shared filesystem.

``RUN_DIR/log/000000123.json`` holds entry 123. An entry is created atomically at the next free
slot (:meth:`hpcrun.storage.Storage.create_exclusive`); when the slot is taken the writer tries the
next. Nothing is ever rewritten, so concurrent writers (the job's agents, ``hpcrun cancel`` on the
login node) cannot overwrite each other, and the order of slots is the order of events. flock is
not used: it is node-local or absent on parallel filesystems.

Entries are untrusted input when read back: a malformed one is reported and skipped, never
guessed at. Readers and writers agree on one view of the slots (:func:`view_slots`): the log is
the run of slot files from 0 on, each within :data:`MAX_SLOT_GAP` of the previous one (writers
never leave a gap); a slot-named file past that (``log/999999999.json``) is debris beyond the
log's end. Debris (that, a malformed file or a directory at a slot) is listed in
:attr:`RunLog.debris`, never fences or blocks an append, and never stops a reader.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    LOG_SCHEMA_VERSION,
    DebrisKind,
    EntryKind,
    EntryPayload,
    FencePayload,
    LogEntry,
)
from hpcrun.control.fencing import NO_FENCE, Fence, apply_entry
from hpcrun.errors import RecordError, StaleGenerationError, StorageError
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = ["LOG_SCHEMA_VERSION", "MAX_SLOT_GAP", "SLOT_DIGITS", "DebrisKind", "EntryKind",
           "LogDebris", "LogEntry", "RunLog", "SlotView", "new_holder", "parse_slot", "slot_name",
           "view_slots"]

SLOT_DIGITS = 9
_SLOT_RE = re.compile(rf"^(\d{{{SLOT_DIGITS}}})\.json$")
_NUMBERED_RE = re.compile(r"^(\d+)\.json$")
MAX_SLOT_GAP = 1024
"""A slot file more than this many slots past the previous one is beyond the log's end."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LogDebris:
    """A file in ``log/`` that is not a well-formed entry."""

    name: str
    """Its name under ``log/``."""
    kind: DebrisKind
    """What it is."""
    detail: str
    """What was found, for people."""

    def describe(self) -> str:
        return f"log/{self.name}: {self.detail}"


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotView:
    """The log's slots and the slot-named files that are not part of it."""

    slots: tuple[tuple[int, str], ...]
    """(slot, file name) of the log, in slot order."""
    debris: tuple[LogDebris, ...]
    """Files named like slots that lie outside the log."""

    @property
    def last_slot(self) -> int:
        """The log's last slot (-1 when empty): the next append goes after it."""
        return self.slots[-1][0] if self.slots else -1


def view_slots(names: Iterable[str], *, max_gap: int = MAX_SLOT_GAP) -> SlotView:
    """Split a listing of ``log/`` into the log's slots and debris beyond its end (pure).

    Names that are not numbered ``.json`` files (writers' temporary ``.*.new`` files) are
    neither. A slot more than ``max_gap`` past the previous one ends the log: it and every
    slot after it are debris, whatever they hold.
    """
    numbered = sorted((int(m.group(1)), name) for name in names
                      if (m := _NUMBERED_RE.match(name)))
    slots: list[tuple[int, str]] = []
    debris: list[LogDebris] = []
    ended = False
    for slot, name in numbered:
        end = slots[-1][0] if slots else -1
        if not _SLOT_RE.match(name):
            debris.append(LogDebris(name=name, kind=DebrisKind.BAD_NAME, detail=(
                f"a numbered file that is not a slot name (slots have {SLOT_DIGITS} digits); "
                "not an entry, ignored")))
        elif ended or slot - end > max_gap:
            ended = True
            debris.append(LogDebris(name=name, kind=DebrisKind.BEYOND_END, detail=(
                f"slot {slot} lies {slot - end} slots past the log's last slot {end} (writers "
                "never leave a gap): not an entry, ignored by readers and writers")))
        else:
            slots.append((slot, name))
    return SlotView(slots=tuple(slots), debris=tuple(debris))


def slot_name(slot: int) -> str:
    return f"{slot:0{SLOT_DIGITS}d}.json"


def parse_slot(name: str) -> int | None:
    m = _SLOT_RE.match(name)
    return int(m.group(1)) if m else None


def _short(exc: Exception, limit: int = 80) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
        self.debris: list[LogDebris] = []
        """Debris the latest :meth:`read` found: outside the log, and among the slots read."""
        self.end = -1
        """The log's last slot at the latest :meth:`read`."""
        self._read_cache: dict[tuple[int, str], LogEntry] = {}
        """Entries already read, by slot and file name: an entry never changes once its slot
        is taken, so a later read of this object opens only the slots it has not seen (a
        rank's start reads the log three times: cadence, restore, partner copies)."""

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
        return view_slots(self._storage.listdir(self.log_dir)).last_slot

    def read(self, since_slot: int = 0) -> list[LogEntry]:
        """Every well-formed entry with slot >= ``since_slot``, in slot order.

        Malformed entries and directories at a slot are skipped and their slots listed in
        ``self.skipped``; they and the files beyond the log's end are listed in ``self.debris``.
        """
        names = self._storage.listdir(self.log_dir)
        # a log holds its first fence from its first append on: only an empty listing can mean
        # no log, and only then is it worth a stat (followers list the log every few seconds)
        if not names and not self._storage.exists(self.log_dir):
            raise RecordError(f"no run log at {self.log_dir}; is this a run directory? "
                              "Use `hpcrun list` to see runs")
        view = view_slots(names)
        self.debris, self.end = list(view.debris), view.last_slot
        out: list[LogEntry] = []
        for slot, name in view.slots:
            if slot < since_slot:
                continue
            entry = self._read_slot(slot, name)
            if entry is not None:
                out.append(entry)
        return out

    def read_before(self, slot: int) -> list[LogEntry]:
        """Every well-formed entry below ``slot``, in slot order: from what :meth:`seed` gave
        alone when it holds every slot below ``slot`` (no listing, nothing opened: what a
        rank's start needs of the log sits in its agent's node-local copy), else as
        :meth:`read` gives it."""
        given = {s: e for (s, _), e in self._read_cache.items() if s < slot}
        if slot >= 0 and len(given) == slot:
            return [given[s] for s in range(slot)]
        return [e for e in self.read() if slot < 0 or e.slot < slot]

    def seed(self, entries: Iterable[LogEntry]) -> None:
        """Take ``entries`` (read from this log by another process of the node) as read: a
        later :meth:`read` lists the log and opens only the slots it was not given."""
        for e in entries:
            self._read_cache[(e.slot, slot_name(e.slot))] = e

    def _read_slot(self, slot: int, name: str) -> LogEntry | None:
        """The entry at ``slot``, or None (debris noted, or moved aside since the listing)."""
        cached = self._read_cache.get((slot, name))
        if cached is not None:
            return cached
        entry = self._open_slot(slot, name)
        if entry is not None:
            self._read_cache[(slot, name)] = entry
        return entry

    def _open_slot(self, slot: int, name: str) -> LogEntry | None:
        try:
            raw = self._storage.read_bytes(self.log_dir / name)
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            if not isinstance(exc.__cause__, IsADirectoryError):
                raise
            self._note_debris(slot, name, DebrisKind.NOT_A_FILE,
                              "a directory at a slot, not an entry file; skipped")
            return None
        try:
            return LogEntry.from_bytes(slot, raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self._note_debris(slot, name, DebrisKind.MALFORMED,
                              f"{len(raw)} bytes that are not a log entry ({_short(exc)}); "
                              "skipped")
            return None

    def _note_debris(self, slot: int, name: str, kind: DebrisKind, detail: str) -> None:
        self.skipped.append(slot)
        self.debris.append(LogDebris(name=name, kind=kind, detail=detail))

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


LOG_COPY_SCHEMA_VERSION = 1


def write_log_copy(path: Path, entries: Iterable[LogEntry]) -> None:
    """Leave ``entries`` for the node's ranks in a node-local file (:func:`read_log_copy`).

    The agent has read the whole log already; its ranks seed their :class:`RunLog` from this
    copy instead of each opening every entry on the shared filesystem again. Not durable (a
    missing copy only costs the reads it spares): a temp file and a rename keep it whole.
    """
    body = {"schema_version": LOG_COPY_SCHEMA_VERSION,
            "entries": [[e.slot, e.to_bytes().decode()] for e in entries]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(body, separators=(",", ":")).encode())
    os.replace(tmp, path)


def read_log_copy(path: Path) -> list[LogEntry]:
    """The entries :func:`write_log_copy` left; none when the copy is missing or damaged."""
    try:
        body = json.loads(path.read_bytes())
        if body.get("schema_version") != LOG_COPY_SCHEMA_VERSION:
            return []
        return [LogEntry.from_bytes(int(slot), raw.encode()) for slot, raw in body["entries"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
