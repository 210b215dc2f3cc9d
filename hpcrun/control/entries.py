"""The run log's vocabulary: entry kinds, the entry envelope, and one typed payload per kind.

Writers build a payload object and append it (:meth:`hpcrun.control.log.RunLog.publish_entry`);
readers turn an entry back into one with :func:`decode` (or :func:`decode_as`). The
checkpoint family's payloads live in :mod:`hpcrun.control.ckptentries` and the ``note`` events
in :mod:`hpcrun.control.notes`; every one is importable from here. Payloads are
frozen values; ``to_payload()`` gives the JSON object stored in the entry and
``from_payload()`` validates one read back, raising :class:`PayloadError` (a
:class:`~hpcrun.errors.RecordError`) with the field, the expectation and what was found.

Versioning: the payload shapes are part of log schema :data:`LOG_SCHEMA_VERSION`, which every
entry carries. Within a schema version, changes are additive only: a new optional field, a new
note event, a new entry kind. An older reader keeps what it does not know: unknown payload
fields in ``extra`` (written back unchanged), unknown note events as :class:`UnknownNote`,
unknown kinds as :class:`UnknownEntry` (the record fold ignores both). Optional fields are left
out when unset; readers treat an absent field and ``null`` alike. Golden files under
``tests/unit/control/golden/`` pin the bytes of every payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from hpcrun.control.ckptentries import (
    CommitPayload,
    CursorPayload,
    DrainedPayload,
    ProgressPayload,
)
from hpcrun.control.notes import (
    BatchSkippedNote,
    CreatedNote,
    DdpRebuildsNote,
    DebrisKind,
    DependencyNote,
    DrainErrorNote,
    FaultInjectedNote,
    InitFromNote,
    KnownGoodNote,
    LogDebrisMovedNote,
    LogDebrisNote,
    NodeExitNote,
    NodeStatus,
    NoteEvent,
    NotePayload,
    PartnerCopyNote,
    PeerLostNote,
    ReplicaCheckOffNote,
    RequeueLeftToSlurmNote,
    RequeueSentNote,
    RestoreFellBackNote,
    SalvageNote,
    SegmentNote,
    UnknownNote,
    decode_note,
)
from hpcrun.control.payload import (
    LOG_SCHEMA_VERSION,
    EntryKind,
    EntryPayload,
    FieldReader,
    MalformedEntryError,
    PayloadError,
    canonical_json,
    listed,
    present,
)
from hpcrun.vocab import Backend, FaultClass, RunState, Tier

__all__ = [
    "LOG_SCHEMA_VERSION",
    "ActionKind",
    "BatchSkippedNote",
    "CommitPayload",
    "CreatedNote",
    "CursorPayload",
    "DdpRebuildsNote",
    "DebrisKind",
    "DependencyNote",
    "DrainErrorNote",
    "DrainedPayload",
    "EntryKind",
    "EntryPayload",
    "FaultInjectedNote",
    "FaultPayload",
    "FencePayload",
    "HeartbeatPayload",
    "InitFromNote",
    "JobPayload",
    "KnownGoodNote",
    "LogDebrisMovedNote",
    "LogDebrisNote",
    "LogEntry",
    "MalformedEntryError",
    "NodeExitNote",
    "NodeStatus",
    "NoteEvent",
    "NotePayload",
    "OpPayload",
    "OpPhase",
    "PartnerCopyNote",
    "PayloadError",
    "PeerLostNote",
    "ProgressPayload",
    "QuarantinePayload",
    "ReplicaCheckOffNote",
    "RequeueLeftToSlurmNote",
    "RequeueSentNote",
    "RestoreFellBackNote",
    "ResultPayload",
    "SalvageNote",
    "SegmentNote",
    "StatePayload",
    "SupervisionClaimPayload",
    "UnknownEntry",
    "UnknownNote",
    "canonical_json",
    "decode",
    "decode_as",
]

class OpPhase(StrEnum):
    """Where an operation is: intent logged, carried out, or failed."""

    INTENT = "intent"
    DONE = "done"
    FAILED = "failed"


class ActionKind(StrEnum):
    """What an operation (``op`` entry) does."""

    SUBMIT = "submit"
    REQUEUE = "requeue"
    SET_BEGIN_TIME = "set_begin_time"
    EXCLUDE_NODES = "exclude_nodes"
    RELEASE = "release"
    CANCEL = "cancel"
    MARK_FAILED = "mark_failed"
    MARK_STATE = "mark_state"
    RECORD_FAULT = "record_fault"


@dataclass(frozen=True, kw_only=True, slots=True)
class LogEntry:
    """One entry of the run log."""

    slot: int
    """Position in the log; the order of events."""
    kind: str
    """An :class:`EntryKind` value (kept as str so newer kinds survive an older reader)."""
    generation: int
    """Generation of the writer (its fencing token), or -1 for an unfenced observation."""
    holder: str
    """Incarnation id of the writer, paired with ``generation``."""
    ts: float
    """Wall-clock time of writing."""
    writer: str
    """host:pid of the writer, for people."""
    payload: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific content (JSON values only); :func:`decode` types it."""
    schema_version: int = LOG_SCHEMA_VERSION
    """Version of the envelope and payload shapes."""

    def to_bytes(self) -> bytes:
        body = {k: getattr(self, k) for k in self.__slots__ if k != "slot"}  # type: ignore[attr-defined]
        body["payload"] = dict(self.payload)
        return canonical_json(body, allow_nan=True)

    @classmethod
    def from_bytes(cls, slot: int, raw: bytes) -> LogEntry:
        """Parse an entry read from disk.

        Raises:
            MalformedEntryError: not JSON, an unknown schema version, or fields of wrong types.
        """
        try:
            body = json.loads(raw)
        except ValueError as exc:  # also UnicodeDecodeError
            raise MalformedEntryError(f"log slot {slot} is not JSON ({exc})") from None
        if not isinstance(body, dict) or body.get("schema_version") != LOG_SCHEMA_VERSION:
            raise MalformedEntryError(f"log slot {slot} is not a log entry of schema_version "
                                      f"{LOG_SCHEMA_VERSION}")
        kind, gen, holder = body.get("kind"), body.get("generation"), body.get("holder")
        ts, writer, payload = body.get("ts"), body.get("writer"), body.get("payload")
        if not (isinstance(kind, str) and isinstance(gen, int) and isinstance(holder, str)
                and isinstance(ts, int | float) and isinstance(writer, str)
                and isinstance(payload, dict)):
            raise MalformedEntryError(f"log slot {slot}: entry fields have the wrong types")
        return cls(slot=slot, kind=kind, generation=gen, holder=holder, ts=float(ts),
                   writer=writer, payload=payload)


# -- payloads of each kind ----------------------------------------------------------------

P = TypeVar("P", bound=EntryPayload)


@dataclass(frozen=True, kw_only=True, slots=True)
class FencePayload(EntryPayload):
    """A claim of the next generation; the claim is the envelope's (generation, holder)."""

    KIND: ClassVar[EntryKind] = EntryKind.FENCE

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {}


@dataclass(frozen=True, kw_only=True, slots=True)
class StatePayload(EntryPayload):
    """A run state transition and why."""

    KIND: ClassVar[EntryKind] = EntryKind.STATE
    state: RunState
    """The new state."""
    reason: str = ""
    """One line for people."""
    attempt: int | None = None
    """In-allocation attempt (STARTING)."""
    restored_step: int | None = None
    """Step restored before the first validated step (RUNNING)."""
    restored_tier: Tier | None = None
    """Tier the restore read (RUNNING)."""
    op_id: str | None = None
    """Operation that decided the change (REQUEUED, login-node marks)."""
    delay_s: float | None = None
    """Backoff asked for before the requeued job may start (REQUEUED)."""
    not_before: float | None = None
    """Wall-clock time before which no new job may start (REQUEUED by the login node)."""
    exclude: tuple[str, ...] | None = None
    """Nodes the next allocation must avoid (REQUEUED by the login node)."""
    decided_at: float | None = None
    """When the change was decided, if earlier than the entry (a requeue Slurm did)."""
    nodes: tuple[str, ...] | None = None
    """Membership of the incarnation, when the state names it."""
    alloc_start: float | None = None
    """When the scheduler granted the allocation, by its clock (STARTING; Slurm's
    ``SLURM_JOB_START_TIME``): the allocation is charged from there, not from this entry."""
    held: int | None = None
    """Nodes the allocation holds, hot spares included (STARTING)."""

    def fields(self) -> dict[str, Any]:
        return {"state": self.state.value, "reason": self.reason, **present(
            attempt=self.attempt, restored_step=self.restored_step,
            restored_tier=self.restored_tier and self.restored_tier.value, op_id=self.op_id,
            delay_s=self.delay_s, not_before=self.not_before, exclude=listed(self.exclude),
            decided_at=self.decided_at, nodes=listed(self.nodes),
            alloc_start=self.alloc_start, held=self.held)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"state": f.choice("state", RunState), "reason": f.text("reason", ""),
                "attempt": f.integer("attempt", None),
                "restored_step": f.integer("restored_step", None),
                "restored_tier": f.choice("restored_tier", Tier, None),
                "op_id": f.text("op_id", None), "delay_s": f.number("delay_s", None),
                "not_before": f.number("not_before", None), "exclude": f.texts("exclude", None),
                "decided_at": f.number("decided_at", None), "nodes": f.texts("nodes", None),
                "alloc_start": f.number("alloc_start", None), "held": f.integer("held", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPayload(EntryPayload):
    """A scheduler job bound to the run."""

    KIND: ClassVar[EntryKind] = EntryKind.JOB
    job_id: str
    """Scheduler job id."""
    backend: Backend | str = Backend.SLURM
    """Backend that runs it (a name given is turned into the :class:`Backend` it names)."""
    op_id: str | None = None
    """Operation that submitted it (login node)."""
    restart_count: int | None = None
    """Slurm's restart count of the job when the incarnation started."""
    nodes: tuple[str, ...] | None = None
    """Nodes of the allocation."""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise PayloadError("job entry needs a non-empty job_id; pass the scheduler's id")
        if not isinstance(self.backend, Backend):
            try:
                object.__setattr__(self, "backend", Backend(self.backend))
            except ValueError:
                raise PayloadError(f"job entry: backend {self.backend!r} is not one of "
                                   f"{', '.join(b.value for b in Backend)}") from None

    def fields(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "backend": str(self.backend), **present(
            op_id=self.op_id, restart_count=self.restart_count, nodes=listed(self.nodes))}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"job_id": f.text("job_id"), "backend": f.choice("backend", Backend, Backend.SLURM),
                "op_id": f.text("op_id", None), "restart_count": f.integer("restart_count", None),
                "nodes": f.texts("nodes", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class OpPayload(EntryPayload):
    """One phase of an operation; the action's own fields and its outcome ride in ``extra``."""

    KIND: ClassVar[EntryKind] = EntryKind.OP
    op_id: str
    """Deterministic id of the operation."""
    action: ActionKind
    """What the operation does."""
    phase: OpPhase | None = None
    """Intent, done or failed (None: a record of an action carried out at once)."""
    pass_id: str | None = None
    """The login-node pass that wrote it (stored as ``pass``; see :mod:`hpcrun.control.lease`)."""
    base: int | None = None
    """Last slot of the record the pass planned from (intents)."""
    lease_until: float | None = None
    """Epoch seconds until which an intent holds the run (intents)."""
    error: str | None = None
    """Why it failed (phase ``failed``)."""
    job_id: str | None = None
    """Job the operation acts on or bound."""
    delay_s: float | None = None
    """Backoff before the job may start (requeue, submit)."""
    exclude: tuple[str, ...] | None = None
    """Nodes to avoid (requeue, submit)."""
    reason: str | None = None
    """Why, for people."""

    def fields(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "action": self.action.value, **present(
            phase=self.phase and self.phase.value, error=self.error, job_id=self.job_id,
            delay_s=self.delay_s, exclude=listed(self.exclude), reason=self.reason,
            base=self.base, lease_until=self.lease_until), **present(**{"pass": self.pass_id})}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"op_id": f.text("op_id"), "action": f.choice("action", ActionKind),
                "phase": f.choice("phase", OpPhase, None), "pass_id": f.text("pass", None),
                "base": f.integer("base", None), "lease_until": f.number("lease_until", None),
                "error": f.text("error", None), "job_id": f.text("job_id", None),
                "delay_s": f.number("delay_s", None), "exclude": f.texts("exclude", None),
                "reason": f.text("reason", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatPayload(EntryPayload):
    """One node's heartbeat summary."""

    KIND: ClassVar[EntryKind] = EntryKind.HEARTBEAT
    node: str
    """Node the beat is from."""
    ts: float | None = None
    """When it beat (the entry's time when absent)."""
    step: int | None = None
    """Step it was at."""

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, **present(ts=self.ts, step=self.step)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "ts": f.number("ts", None),
                "step": f.integer("step", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultPayload(EntryPayload):
    """A classified failure."""

    KIND: ClassVar[EntryKind] = EntryKind.FAULT
    fault: FaultClass
    """Its class."""
    node: str | None = None
    """Node it happened on, when known."""
    rank: int | None = None
    """Rank it happened on, when known."""
    step: int | None = None
    """Step it happened at, when known."""
    signature: str = ""
    """Stable fingerprint (exception type + site, exit code, signal) for repeat detection."""
    detail: str = ""
    """One line for people."""
    op_id: str | None = None
    """Operation that recorded it (login node)."""
    ckpt_id: str | None = None
    """Checkpoint concerned (checkpoint faults)."""
    background: bool = False
    """An incident the run survives (a restore fell back), not a fault of the gang."""
    culprit_ranks: tuple[int, ...] = ()
    """A hang's ranks that did not arrive at the collective the others entered (none: the
    evidence named nobody)."""
    culprit_nodes: tuple[str, ...] = ()
    """Their nodes."""

    def fields(self) -> dict[str, Any]:
        return {"fault": self.fault.value, "node": self.node, "rank": self.rank,
                "step": self.step, "signature": self.signature, "detail": self.detail,
                **present(op_id=self.op_id, ckpt_id=self.ckpt_id,
                          background=self.background or None,
                          culprit_ranks=list(self.culprit_ranks) or None,
                          culprit_nodes=list(self.culprit_nodes) or None)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"fault": f.choice("fault", FaultClass), "node": f.text("node", None),
                "rank": f.integer("rank", None), "step": f.integer("step", None),
                "signature": f.text("signature", ""), "detail": f.text("detail", ""),
                "op_id": f.text("op_id", None), "ckpt_id": f.text("ckpt_id", None),
                "background": f.flag("background", False),
                "culprit_ranks": tuple(f.integers("culprit_ranks", ())),
                "culprit_nodes": tuple(f.texts("culprit_nodes", ()))}


@dataclass(frozen=True, kw_only=True, slots=True)
class QuarantinePayload(EntryPayload):
    """A node excluded from later allocations."""

    KIND: ClassVar[EntryKind] = EntryKind.QUARANTINE
    node: str
    """The node."""
    reason: str | None = None
    """Why, for people."""

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, **present(reason=self.reason)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "reason": f.text("reason", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class ResultPayload(EntryPayload):
    """The run's terminal result, and the post-run manifest once written."""

    KIND: ClassVar[EntryKind] = EntryKind.RESULT
    state: RunState | None = None
    """Terminal state it records (also applied to the record)."""
    reason: str | None = None
    """Why, for people."""
    manifest: str | None = None
    """Post-run manifest path relative to the run directory."""
    manifest_sha256: str | None = None
    """SHA-256 of the manifest's bytes."""
    op_id: str | None = None
    """Operation that recorded it (login node)."""

    def fields(self) -> dict[str, Any]:
        return present(state=self.state and self.state.value, reason=self.reason,
                    manifest=self.manifest, manifest_sha256=self.manifest_sha256,
                    op_id=self.op_id)

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"state": f.choice("state", RunState, None), "reason": f.text("reason", None),
                "manifest": f.text("manifest", None),
                "manifest_sha256": f.text("manifest_sha256", None),
                "op_id": f.text("op_id", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisionClaimPayload(EntryPayload):
    """A surviving agent takes over supervising the job start from a node that was lost.

    Published under the fence in force (the incarnation whose supervisor vanished): a stale
    claimant's claim is void like any stale publish, and of two claims under one fence the
    earlier slot stands (:mod:`hpcrun.runtime.supervise.takeover`).
    """

    KIND: ClassVar[EntryKind] = EntryKind.SUPERVISE
    node: str
    """The claimant: the node whose agent supervises from now on."""
    replaces: str
    """The supervising node that was lost."""
    attempt: int
    """In-allocation attempt of the incarnation whose supervisor was lost."""
    reason: str = ""
    """One line for people."""

    def __post_init__(self) -> None:
        if not self.node or not self.replaces:
            raise PayloadError("a supervision claim names its claimant and the lost supervisor "
                               f"(node={self.node!r}, replaces={self.replaces!r}); pass both")

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, "replaces": self.replaces, "attempt": self.attempt,
                "reason": self.reason}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "replaces": f.text("replaces"),
                "attempt": f.integer("attempt"), "reason": f.text("reason", "")}


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownEntry(EntryPayload):
    """An entry of a kind this version does not know (a newer writer's); ``extra`` holds it."""

    kind: str
    """The entry's kind as written."""

    @property
    def entry_kind(self) -> str:
        return self.kind

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        raise PayloadError(f"{f.what}: a kind this version does not know is read by decode(), "
                           "which keeps it whole; from_payload() needs a known kind")


_BY_KIND: dict[str, type[EntryPayload]] = {cls.KIND.value: cls for cls in (
    FencePayload, StatePayload, JobPayload, OpPayload, HeartbeatPayload, ProgressPayload,
    CommitPayload, DrainedPayload, CursorPayload, FaultPayload, QuarantinePayload,
    ResultPayload, SupervisionClaimPayload)}


def decode(entry: LogEntry) -> EntryPayload:
    """The typed payload of ``entry``.

    Returns:
        The payload class of the entry's kind; :class:`UnknownEntry` for a kind this version
        does not know and :class:`UnknownNote` for a note event it does not know.

    Raises:
        PayloadError: the payload does not have its kind's shape.
    """
    if entry.kind == EntryKind.NOTE:
        return decode_note(entry.payload)
    cls = _BY_KIND.get(entry.kind)
    if cls is None:
        return UnknownEntry(kind=entry.kind, extra=dict(entry.payload))
    return cls.from_payload(entry.payload)


def decode_as(entry: LogEntry, cls: type[P]) -> P:
    """The typed payload of ``entry``, which must be a ``cls``.

    Raises:
        PayloadError: the entry is of another kind or event, or its payload is malformed.
    """
    payload = decode(entry)
    if not isinstance(payload, cls):
        raise PayloadError(f"log slot {entry.slot} holds a {type(payload).__name__}, expected "
                           f"a {cls.__name__}; select entries by kind before decoding")
    return payload
