"""An incremental view of the run log for processes that watch it (agents, the local launcher)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    EntryPayload,
    FaultPayload,
    NodeExitNote,
    PayloadError,
    ProgressPayload,
    StatePayload,
    decode,
    decode_as,
)
from hpcrun.control.fencing import Fence, fold_fences
from hpcrun.control.log import EntryKind, LogEntry, RunLog
from hpcrun.control.states import TERMINAL as TERMINAL_STATES
from hpcrun.vocab import FaultClass

P = TypeVar("P", bound=EntryPayload)

FOLLOW_BASE_S = 0.2
"""How soon a follower lists the log again after a listing that found new entries."""
FOLLOW_CAP_S = 6.4
"""The longest a follower waits between two listings of a log that stopped changing.

Each quiet listing doubles the wait (0.2, 0.4, ... 6.4 s), so a run in steady training costs
every agent one listing per 6.4 s instead of five a second: at 2,048 nodes 320 listings a
second, within a metadata server's budget for one run (``docs/performance.md``,
shared-filesystem metadata). It bounds only what an agent whose own ranks keep running learns
from other nodes: an agent whose ranks fail, or that writes an entry and waits for the answer,
lists the log every tick (:meth:`LogView.refresh`). A survivor whose ranks did not fail on
their own rejoins a new fence up to 6.4 s later; in a gang the collectives usually fail first
(a peer's crash resets their connections)."""


def next_follow_s(current_s: float, *, changed: bool, base_s: float = FOLLOW_BASE_S,
                  cap_s: float = FOLLOW_CAP_S) -> float:
    """The wait before the next listing: the base after a change, else twice the last, capped."""
    return base_s if changed else min(cap_s, max(current_s, base_s) * 2)


class LogView:
    """Reads only new slots on each refresh and keeps the fencing fold current."""

    def __init__(self, log: RunLog, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.log = log
        self.entries: list[LogEntry] = []
        self.fence: Fence = fold_fences(())[0]
        self.valid: list[LogEntry] = []
        self._clock = clock
        self._wait_s = 0.0
        self._due = float("-inf")

    def follow(self) -> list[LogEntry]:
        """:meth:`refresh` when the follow pace says a listing is due, else nothing.

        The pace backs off while the log stays quiet (:func:`next_follow_s`) and drops back to
        :data:`FOLLOW_BASE_S` as soon as any refresh finds new entries.
        """
        if self._clock.monotonic() < self._due:
            return []
        return self.refresh()

    def refresh(self) -> list[LogEntry]:
        """Read new slots; return the new entries that count."""
        since = self.entries[-1].slot + 1 if self.entries else 0
        new = self.log.read(since_slot=since)
        self._wait_s = next_follow_s(self._wait_s, changed=bool(new))
        self._due = self._clock.monotonic() + self._wait_s
        if not new:
            return []
        self.entries.extend(new)
        before = len(self.valid)
        self.fence, self.valid = fold_fences(self.entries)
        return self.valid[before:]

    def valid_of(self, generation: int, holder: str, kind: str) -> list[LogEntry]:
        """Entries of ``kind`` written under the token ``(generation, holder)`` that count."""
        return [e for e in self.valid
                if e.kind == kind and e.generation == generation and e.holder == holder]

    def state(self) -> str | None:
        """The last state that counts."""
        states = decoded(self.valid, StatePayload)
        return states[-1].state.value if states else None

    def last_step(self) -> int | None:
        """The newest step a PROGRESS entry that counts reported."""
        steps = decoded(self.valid, ProgressPayload)
        return steps[-1].step if steps else None

    def terminal(self) -> str | None:
        st = self.state()
        return st if st in TERMINAL_STATES else None

    def fence_with_prefix(self, prefix: str) -> LogEntry | None:
        """The newest valid fence whose holder starts with ``prefix``."""
        found = [e for e in self.valid if e.kind == EntryKind.FENCE and e.holder.startswith(prefix)]
        return found[-1] if found else None


def decoded(entries: Iterable[LogEntry], cls: type[P]) -> list[P]:
    """The payloads of ``entries`` that are a ``cls``, in order; malformed ones are left out
    (as the record fold leaves them out)."""
    out = []
    for e in entries:
        if e.kind != cls.KIND:
            continue
        try:
            payload = decode(e)
        except PayloadError:
            continue
        if isinstance(payload, cls):
            out.append(payload)
    return out


def node_exits(entries: Iterable[LogEntry]) -> dict[str, str]:
    """node → status from ``node_exit`` notes."""
    return {n.node: n.status.value for n in decoded(entries, NodeExitNote)}


GANG_FAULTS = frozenset({FaultClass.HANG, FaultClass.NODE_FAILURE})


def fault_of(entry: LogEntry) -> FaultPayload | None:
    """The payload of a FAULT entry, or None when it is malformed.

    A class this version does not know (a word only a rank's exit report carries, such as
    ``stale``, or a newer writer's class) reads as ``unknown``, as the record fold reads it.
    """
    try:
        return decode_as(entry, FaultPayload)
    except PayloadError:
        if entry.payload.get("fault") in set(FaultClass):
            return None  # a known class, malformed elsewhere
        unknown = replace(entry, payload={**entry.payload, "fault": FaultClass.UNKNOWN.value})
        try:
            return decode_as(unknown, FaultPayload)
        except PayloadError:
            return None


def is_gang_fault(fault: FaultPayload) -> bool:
    """Whether a fault ends the gang: a rank's failure, a hang or a lost node.

    Background faults (a drain to the shared tier that failed and will be retried, a checkpoint
    that failed verification at restore, marked ``background``) do not: training goes on.
    """
    if fault.background:
        return False  # an incident the run survives (a restore that fell back)
    return fault.fault in GANG_FAULTS or (fault.rank is not None and fault.rank >= 0)


def gang_faults(entries: Iterable[LogEntry]) -> list[FaultPayload]:
    """The faults among ``entries`` that end the gang, in order (malformed ones left out)."""
    faults = (fault_of(e) for e in entries if e.kind == EntryKind.FAULT)
    return [f for f in faults if f is not None and is_gang_fault(f)]
