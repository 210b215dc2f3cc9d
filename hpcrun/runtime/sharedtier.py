"""The shared tier as the runtime writes to it: under a deadline, with drill faults injected at
the storage seam.

Every drain operation on the shared tier goes through :func:`shared_tier_storage`: a
:class:`~hpcrun.storage.DeadlineStorage` with the site's ``shared_tier.deadline_s``, around a
:class:`~hpcrun.storage.FaultyStorage` when the drill asked for one. A timeout is recorded as a
background ``storage_timeout`` fault (the run survives it) and the drain is retried next round;
the blocked operation stays in its own thread, so neither training nor the agent hangs on it.

Storage faults are part of the fault-injection schedule (``--inject``):
``storage@mode=stall|fail,while=PATH[,ops=rename+makedirs]``. ``fail`` makes the named
operations fail while ``PATH`` exists; ``stall`` makes them open the FIFO at ``PATH`` for reading,
a real blocking wait until the drill opens it for writing (or removes it).

The ``shared-fs-stall`` drill (``fsstall@step=N,seconds=S``) stalls the whole shared tier
instead: from step N every operation of the gang's ranks and agents on the run directory blocks
for ``S`` seconds (:data:`~hpcrun.storage.SHARED_TIER_STALL`). Each rank arms its own process and
leaves a node-local mark (:func:`start_shared_tier_stall`) from which its agent arms its own
(``node/rankwatch.py``), so every process of the node stalls at once, as on a real cluster.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from hpcrun.control.entries import FaultPayload
from hpcrun.control.log import RunLog
from hpcrun.errors import ConfigError, SpecError
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.storage import (
    FAULTABLE_OPS,
    LOCAL_STORAGE,
    SHARED_TIER_STALL,
    DeadlineStorage,
    FaultyStorage,
    StallGate,
    Storage,
)
from hpcrun.vocab import FaultClass

__all__ = ["SHARED_FS_STALL", "STORAGE_FAULT_KIND", "StorageInjection", "arm_from_mark",
           "parse_storage_injection", "shared_tier_storage", "site_deadline_s",
           "stall_mark", "start_shared_tier_stall"]

SHARED_FS_STALL = "shared-fs-stall"
"""The drill's name of a whole-tier stall (its ``fault_injected`` note)."""

STORAGE_FAULT_KIND = "storage"
"""The ``--inject`` kind handled here (rank faults ignore it)."""

DEFAULT_DEADLINE_S = 300.0
"""Deadline of one shared-tier operation when the site sets none."""

_STUCK: set[threading.Thread] = set()
"""Operations of this process still blocked past their deadline (shared by every round)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageInjection:
    """A drill's storage fault."""

    mode: str
    """``fail`` or ``stall``."""
    while_path: str
    """The fault is active while this path exists (a FIFO for ``stall``)."""
    ops: tuple[str, ...] = FAULTABLE_OPS
    """Storage operations it affects."""


def parse_storage_injection(text: str) -> StorageInjection | None:
    """The ``storage@...`` part of an injection schedule, or None (pure).

    Raises:
        SpecError: the part is malformed (named, with the expected form).
    """
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind, _, args = part.partition("@")
        if kind != STORAGE_FAULT_KIND:
            continue
        fields = dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
        ops = tuple(fields.get("ops", "+".join(FAULTABLE_OPS)).split("+"))
        if fields.get("mode") not in ("fail", "stall") or not fields.get("while") \
                or not set(ops) <= set(FAULTABLE_OPS):
            raise SpecError(f"fault injection part {part!r}: expected storage@mode=fail|stall,"
                            f"while=PATH[,ops=OP+OP] with OP among {', '.join(FAULTABLE_OPS)}")
        return StorageInjection(mode=fields["mode"], while_path=fields["while"], ops=ops)
    return None


def site_deadline_s(run_dir: Path) -> float:
    """The site's shared-tier deadline from the run's site snapshot (default when unset)."""
    from hpcrun.launch.site import load_site_snapshot

    try:
        tier = load_site_snapshot(run_dir).shared_tier
    except ConfigError:
        return DEFAULT_DEADLINE_S
    return tier.deadline_s if tier is not None else DEFAULT_DEADLINE_S


def shared_tier_storage(*, deadline_s: float, injection: StorageInjection | None, log: RunLog,
                        node: str, generation: int, holder: str,
                        inner: Storage = LOCAL_STORAGE) -> Storage:
    """The storage one drain round uses on the shared tier; a timeout is logged as a background
    ``storage_timeout`` fault of ``node`` under the round's fencing token."""
    if injection is not None:
        inner = FaultyStorage(inner, mode=injection.mode, while_path=injection.while_path,
                              ops=injection.ops)

    def record(message: str) -> None:
        log.append_entry(FaultPayload(fault=FaultClass.STORAGE_TIMEOUT, node=node,
                                      signature="storage:timeout", detail=message[:2000],
                                      background=True),
                         generation=generation, holder=holder)

    return DeadlineStorage(inner, deadline_s=deadline_s, stuck=_STUCK, on_timeout=record)


def stall_mark(inc: Incarnation) -> Path:
    """The node-local mark a rank leaves when it starts a shared-tier stall (for its agent)."""
    return inc.heartbeat_dir() / ".fsstall"


def start_shared_tier_stall(inc: Incarnation, seconds: float, *,
                            gate: StallGate = SHARED_TIER_STALL) -> None:
    """A rank's part of the ``fsstall`` drill: mark the node for its agent (node-local), then
    stall this process's operations on the run directory for ``seconds``."""
    mark = stall_mark(inc)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"{seconds}\n")
    gate.arm(inc.run_dir, seconds)


def arm_from_mark(inc: Incarnation, *, gate: StallGate = SHARED_TIER_STALL) -> bool:
    """An agent's part: when its ranks left the mark, stall this process too for the seconds it
    names (and take the mark away); whether it did."""
    mark = stall_mark(inc)
    try:
        seconds = float(mark.read_text())
        mark.unlink()
    except (OSError, ValueError):
        return False
    gate.arm(inc.run_dir, seconds)
    return True
