"""Typed payloads of ``note`` entries: observations for people and tools, one class per event.

A note never publishes run state; the record reads only ``created`` (the owner). The runtime
reads ``node_exit`` notes to learn how each node's gang ended. Part of the log vocabulary
re-exported by :mod:`hpcrun.control.entries`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from hpcrun.control.payload import EntryKind, EntryPayload, FieldReader, present
from hpcrun.vocab import CheckpointFormat

__all__ = [
    "BatchSkippedNote",
    "CreatedNote",
    "DebrisKind",
    "DependencyNote",
    "DrainErrorNote",
    "FaultInjectedNote",
    "KnownGoodNote",
    "LogDebrisMovedNote",
    "LogDebrisNote",
    "NoRestoreNote",
    "NodeExitNote",
    "NodeStatus",
    "NoteEvent",
    "NotePayload",
    "PartnerCopyNote",
    "PeerLostNote",
    "ReplicaCheckOffNote",
    "RequeueLeftToSlurmNote",
    "RequeueSentNote",
    "RestoreFellBackNote",
    "SalvageNote",
    "SegmentNote",
    "TrackerNote",
    "UnknownNote",
    "decode_note",
]


class NoteEvent(StrEnum):
    """What a ``note`` entry observed."""

    CREATED = "created"                              # the run directory was created
    NODE_EXIT = "node_exit"                          # one node's gang ended (status, attempt)
    PEER_LOST = "peer_lost"                          # ranks failed only as echoes of a peer
    REQUEUE_SENT = "requeue_sent"                    # the supervisor asked for a requeue
    REQUEUE_LEFT_TO_SLURM = "requeue_left_to_slurm"  # stopped on SIGTERM: Slurm requeues
    DRAIN_ERROR = "drain_error"                      # a drain to the shared tier failed
    FAULT_INJECTED = "fault_injected"                # a drill injected a fault
    RESTORE_FELL_BACK = "restore_fell_back"          # a restore skipped unreadable checkpoints
    LOG_DEBRIS = "log_debris"                        # a file in log/ that is not an entry
    LOG_DEBRIS_MOVED = "log_debris_moved"            # `hpcrun doctor` moved debris aside
    SEGMENT = "segment"                              # a stop with committed progress ended
    DEPENDENCY = "dependency"                        # the run waits for upstream runs
    KNOWN_GOOD = "known_good"                        # a replica check passed after a commit
    BATCH_SKIPPED = "batch_skipped"                  # a suspect step's update was dropped
    REPLICA_CHECK_OFF = "replica_check_off"          # no rank has a replica to compare with
    PARTNER_COPY = "partner_copy"                    # a node's tier-0 shards copied to its partner
    TRACKER = "tracker"                              # the run's experiment-tracker run
    NO_RESTORE = "no_restore"                        # steps ran with no state registered
    INIT_FROM = "init_from"                          # a run started from an outside checkpoint
    DDP_REBUILDS = "ddp_rebuilds"                    # a bitwise run's DDP rebuilds its buckets
    SALVAGE = "salvage"                              # survivors drain before a requeue


class DebrisKind(StrEnum):
    """What a file in ``log/`` that is not a well-formed entry is."""

    MALFORMED = "malformed"    # a slot file whose bytes are not a log entry
    NOT_A_FILE = "not_a_file"  # a directory (or other non-file) at a slot
    BEYOND_END = "beyond_end"  # a slot file far past the log's end
    BAD_NAME = "bad_name"      # a numbered .json name that is not a slot name


class NodeStatus(StrEnum):
    """How a rank ended (its exit report's ``status``) or a node's ranks ended (``node_exit``
    notes)."""

    SUCCEEDED = "succeeded"  # finished every step
    PREEMPTED = "preempted"  # stopped at an agreed step boundary after committing
    FAILED = "failed"        # crashed, hung, or lost a peer

    @classmethod
    def read(cls, value: object) -> NodeStatus:
        """Parse a logged status (untrusted): anything unknown counts as a failure."""
        return cls(value) if isinstance(value, str) and value in set(cls) else cls.FAILED


@dataclass(frozen=True, kw_only=True, slots=True)
class NotePayload(EntryPayload):
    """Base of the note payloads: the ``event`` field names the class."""

    KIND: ClassVar[EntryKind] = EntryKind.NOTE
    EVENT: ClassVar[NoteEvent]

    def to_payload(self) -> dict[str, Any]:
        return {**self.extra, "event": self.EVENT.value, **self.fields()}

    @classmethod
    def reader(cls, raw: Mapping[str, Any]) -> FieldReader:
        f = FieldReader(f"{cls.EVENT.value} note", raw)
        f.used.add("event")
        return f


@dataclass(frozen=True, kw_only=True, slots=True)
class CreatedNote(NotePayload):
    """The run directory was created."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.CREATED
    owner: str
    """User who created the run (cancel authority)."""
    run_id: str = ""
    """Run id."""
    spec_id: str = ""
    """Digest of the frozen spec."""

    def fields(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "spec_id": self.spec_id, "owner": self.owner}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"run_id": f.text("run_id", ""), "spec_id": f.text("spec_id", ""),
                "owner": f.text("owner")}


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeExitNote(NotePayload):
    """One node's gang ended."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.NODE_EXIT
    node: str
    """The node."""
    status: NodeStatus
    """How its gang ended."""
    attempt: int
    """In-allocation attempt that ended."""

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, "status": self.status.value, "attempt": self.attempt}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "status": f.choice("status", NodeStatus),
                "attempt": f.integer("attempt")}


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerLostNote(NotePayload):
    """Ranks on a node failed only because a peer elsewhere was lost."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.PEER_LOST
    node: str
    """The node whose ranks echoed."""
    ranks: tuple[int, ...]
    """Ranks that failed as echoes."""

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": list(self.ranks)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "ranks": f.integers("ranks")}


@dataclass(frozen=True, kw_only=True, slots=True)
class RequeueSentNote(NotePayload):
    """The supervisor carried out a requeue operation."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.REQUEUE_SENT
    op_id: str
    """The requeue operation."""
    detail: str
    """What the requeuer did."""

    def fields(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "detail": self.detail}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"op_id": f.text("op_id"), "detail": f.text("detail")}


@dataclass(frozen=True, kw_only=True, slots=True)
class SalvageNote(NotePayload):
    """The supervisor requeues a gang that lost nodes: before the allocation ends, every
    surviving node drains its own shards of the newest tier-0 checkpoint and the partner copies
    it holds of the lost nodes' shards, so that checkpoint becomes whole on tier 1."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.SALVAGE
    lost: tuple[str, ...]
    """The nodes lost with their tier 0."""

    def fields(self) -> dict[str, Any]:
        return {"lost": list(self.lost)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"lost": f.texts("lost")}


@dataclass(frozen=True, kw_only=True, slots=True)
class RequeueLeftToSlurmNote(NotePayload):
    """The gang stopped on SIGTERM: Slurm ends (and may requeue) the job, not hpcrun."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.REQUEUE_LEFT_TO_SLURM
    detail: str
    """Why."""

    def fields(self) -> dict[str, Any]:
        return {"detail": self.detail}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"detail": f.text("detail")}


@dataclass(frozen=True, kw_only=True, slots=True)
class SegmentNote(NotePayload):
    """An allocation ended in a preemption or time-limit stop that committed progress: a
    segment of a long run, not a fault (the record counts them against
    ``budgets.max_segments``)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.SEGMENT
    step_from: int
    """Newest committed step when the allocation started."""
    step_to: int
    """Step of the checkpoint the stop committed."""
    reason: str
    """Why the allocation stopped."""

    def fields(self) -> dict[str, Any]:
        return {"step_from": self.step_from, "step_to": self.step_to, "reason": self.reason}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"step_from": f.integer("step_from"), "step_to": f.integer("step_to"),
                "reason": f.text("reason")}


@dataclass(frozen=True, kw_only=True, slots=True)
class DependencyNote(NotePayload):
    """The run's allocation waits for upstream runs (``hpcrun submit --after``)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.DEPENDENCY
    after: tuple[str, ...]
    """The upstream runs as ``RUN:ok`` or ``RUN:any``."""
    flag: str | None = None
    """The ``--dependency`` value submitted (None: every upstream had already ended well)."""
    dirs: tuple[str, ...] = ()
    """The upstream run directories, in the order of ``after`` (where the run's first start
    reads how they ended)."""

    def fields(self) -> dict[str, Any]:
        return {"after": list(self.after), "dirs": list(self.dirs), **present(flag=self.flag)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"after": f.texts("after"), "flag": f.text("flag", None),
                "dirs": f.texts("dirs", ())}


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainErrorNote(NotePayload):
    """A drain to the shared tier failed; it is retried next round."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.DRAIN_ERROR
    node: str
    """Node whose drain failed."""
    detail: str
    """The error."""
    step: int | None = None
    """Step of the checkpoint, when one was being drained."""
    ckpt_id: str | None = None
    """The checkpoint, when one was being drained."""

    def fields(self) -> dict[str, Any]:
        return {"node": self.node, "detail": self.detail,
                **present(step=self.step, ckpt_id=self.ckpt_id)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"node": f.text("node"), "detail": f.text("detail"),
                "step": f.integer("step", None), "ckpt_id": f.text("ckpt_id", None)}


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultInjectedNote(NotePayload):
    """A drill injected a fault from outside the run (its ground truth for the verdict)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.FAULT_INJECTED
    fault: str
    """The drill's fault name."""
    node: str
    """Node it hit."""
    step: int
    """Step the run was at."""

    def fields(self) -> dict[str, Any]:
        return {"fault": self.fault, "node": self.node, "step": self.step}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"fault": f.text("fault"), "node": f.text("node"), "step": f.integer("step")}


RESTORE_FELL_BACK_TEXT = "restore fell back"
"""The ``note`` text of a restore fallback (older logs carry it without an ``event``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreFellBackNote(NotePayload):
    """A restore skipped checkpoints it could not read and restored an older one."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.RESTORE_FELL_BACK
    restored: str
    """Checkpoint restored."""
    skipped: tuple[str, ...]
    """Newer checkpoints skipped, newest first."""

    def fields(self) -> dict[str, Any]:
        return {"note": RESTORE_FELL_BACK_TEXT, "restored": self.restored,
                "skipped": list(self.skipped)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        f.used.add("note")
        return {"restored": f.text("restored"), "skipped": f.texts("skipped")}


@dataclass(frozen=True, kw_only=True, slots=True)
class LogDebrisNote(NotePayload):
    """An incident: a file in ``log/`` that is not a well-formed entry (reported once)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.LOG_DEBRIS
    name: str
    """Its name under ``log/``."""
    kind: DebrisKind
    """What it is."""
    detail: str
    """What was found, for people."""

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "detail": self.detail}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"name": f.text("name"), "kind": f.choice("kind", DebrisKind),
                "detail": f.text("detail", "")}


@dataclass(frozen=True, kw_only=True, slots=True)
class LogDebrisMovedNote(NotePayload):
    """``hpcrun doctor`` moved debris out of ``log/``; its incidents are closed."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.LOG_DEBRIS_MOVED
    names: tuple[str, ...]
    """Names under ``log/`` that were moved."""
    to: tuple[str, ...]
    """Where each went, relative to the run directory."""

    def fields(self) -> dict[str, Any]:
        return {"names": list(self.names), "to": list(self.to)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"names": f.texts("names"), "to": f.texts("to", ())}


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownGoodNote(NotePayload):
    """A committed checkpoint is known-good: a replica agreement check at or after its step
    passed."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.KNOWN_GOOD
    ckpt_id: str
    """The checkpoint."""
    step: int
    """Its step."""
    checked_step: int
    """Step of the replica check that passed (>= ``step``)."""

    def fields(self) -> dict[str, Any]:
        return {"ckpt_id": self.ckpt_id, "step": self.step, "checked_step": self.checked_step}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"ckpt_id": f.text("ckpt_id"), "step": f.integer("step"),
                "checked_step": f.integer("checked_step")}


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSkippedNote(NotePayload):
    """A suspect step replayed to the same result and the spec says ``skip_batch``: its update
    was dropped (the batch stays consumed)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.BATCH_SKIPPED
    step: int
    """The step whose update was dropped."""
    batch: str
    """The global batch it consumed ("?" when the batch does not say)."""
    detail: str = ""
    """Why, for people."""

    def fields(self) -> dict[str, Any]:
        return {"step": self.step, "batch": self.batch, "detail": self.detail}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"step": f.integer("step"), "batch": f.text("batch"),
                "detail": f.text("detail", "")}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicaCheckOffNote(NotePayload):
    """The SDC replica check found no replicas (a sharded model whose mesh has no replicate
    dims): it is off for this incarnation; the canary and loss checks stay on."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.REPLICA_CHECK_OFF
    detail: str = ""
    """Why, for people."""

    def fields(self) -> dict[str, Any]:
        return {"detail": self.detail}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"detail": f.text("detail", "")}


@dataclass(frozen=True, kw_only=True, slots=True)
class DdpRebuildsNote(NotePayload):
    """A ``data.contract: bitwise`` run registered a DistributedDataParallel that rebuilds its
    gradient buckets after its first step: a resume on 3 or more ranks reduces that step with
    another layout, so its bits differ (docs/recovery.md, "Bitwise resume and DDP buckets")."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.DDP_REBUILDS
    modules: tuple[str, ...] = ()
    """The state keys holding such a module."""

    def fields(self) -> dict[str, Any]:
        return {"modules": list(self.modules)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"modules": tuple(f.texts("modules", ()))}


@dataclass(frozen=True, kw_only=True, slots=True)
class PartnerCopyNote(NotePayload):
    """One node's tier-0 shards of a checkpoint, copied to (and held by) its partner node."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.PARTNER_COPY
    ckpt_id: str
    """The checkpoint."""
    owner: str
    """Node whose shards were copied."""
    held_by: str
    """Node holding the copy on its tier 0."""
    bytes: int
    """Shard bytes the holder verified and keeps."""
    complete: bool
    """Every shard of ``owner`` arrived and matched the manifest's checksums."""
    detail: str = ""
    """Why the copy is incomplete, when it is."""

    def fields(self) -> dict[str, Any]:
        return {"ckpt_id": self.ckpt_id, "owner": self.owner, "held_by": self.held_by,
                "bytes": self.bytes, "complete": self.complete, **present(
                    detail=self.detail or None)}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"ckpt_id": f.text("ckpt_id"), "owner": f.text("owner"),
                "held_by": f.text("held_by"), "bytes": f.integer("bytes"),
                "complete": f.flag("complete"), "detail": f.text("detail", "")}


@dataclass(frozen=True, kw_only=True, slots=True)
class InitFromNote(NotePayload):
    """A run with no checkpoint of its own started from a DCP or safetensors checkpoint
    (``checkpoint.init_from`` / ``ctx.restore(init_from=...)``)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.INIT_FROM
    path: str
    """The source as given."""
    format: CheckpointFormat
    """Its format."""
    digest: str
    """``sha256:<hex>`` over its files' names and bytes."""
    tensors: int
    """Tensors loaded into the run's state."""

    def fields(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format.value, "digest": self.digest,
                "tensors": self.tensors}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"path": f.text("path"), "format": f.choice("format", CheckpointFormat),
                "digest": f.text("digest"), "tensors": f.integer("tensors")}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrackerNote(NotePayload):
    """The experiment-tracker run an incarnation's rank 0 logs to (``observe.tracker``): one
    per hpcrun run, found again by every later incarnation."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.TRACKER
    tracker: str
    """``tensorboard``, ``wandb`` or ``mlflow``."""
    run_ref: str
    """The tracker's id of the run."""
    location: str
    """Where the tracker keeps it (a log dir or a tracking URI)."""
    watermark: int
    """Newest step the tracker held: when the incarnation opened it, or when it closed it."""
    closed: bool = False
    """Written when the incarnation closed the tracker (else when it opened it)."""

    def fields(self) -> dict[str, Any]:
        return {"tracker": self.tracker, "run_ref": self.run_ref, "location": self.location,
                "watermark": self.watermark, "closed": self.closed}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"tracker": f.text("tracker"), "run_ref": f.text("run_ref"),
                "location": f.text("location"), "watermark": f.integer("watermark"),
                "closed": f.flag("closed", False)}


@dataclass(frozen=True, kw_only=True, slots=True)
class NoRestoreNote(NotePayload):
    """An incarnation finished its first step without ``ctx.restore`` / ``hpcrun.lite.restore``:
    no state is registered, so no checkpoint will be committed and a preemption loses all
    progress (rank 0 writes it once per incarnation)."""

    EVENT: ClassVar[NoteEvent] = NoteEvent.NO_RESTORE
    step: int
    """The first step the ranks reported."""

    def fields(self) -> dict[str, Any]:
        return {"step": self.step}

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"step": f.integer("step")}


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownNote(NotePayload):
    """A note of an event this version does not know; ``extra`` holds the rest of it."""

    event: str | None = None
    """The event as written (None when the note has none)."""

    def to_payload(self) -> dict[str, Any]:
        return {**self.extra, **present(event=self.event)}

    def fields(self) -> dict[str, Any]:
        return present(event=self.event)

    @classmethod
    def reader(cls, raw: Mapping[str, Any]) -> FieldReader:
        return FieldReader("note entry", raw)

    @classmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        return {"event": f.text("event", None)}


_BY_EVENT: dict[str, type[NotePayload]] = {cls.EVENT.value: cls for cls in (
    CreatedNote, NodeExitNote, PeerLostNote, RequeueSentNote, RequeueLeftToSlurmNote,
    DrainErrorNote, FaultInjectedNote, RestoreFellBackNote, LogDebrisNote, LogDebrisMovedNote,
    SegmentNote, DependencyNote, KnownGoodNote, BatchSkippedNote, PartnerCopyNote,
    InitFromNote)}


_BY_EVENT[NoteEvent.TRACKER.value] = TrackerNote
_BY_EVENT[NoteEvent.NO_RESTORE.value] = NoRestoreNote
_BY_EVENT[NoteEvent.REPLICA_CHECK_OFF.value] = ReplicaCheckOffNote
_BY_EVENT[NoteEvent.DDP_REBUILDS.value] = DdpRebuildsNote
_BY_EVENT[NoteEvent.SALVAGE.value] = SalvageNote


def decode_note(raw: Mapping[str, Any]) -> NotePayload:
    """The typed payload of a note; :class:`UnknownNote` for an event this version lacks.

    Raises:
        PayloadError: a known event's payload is malformed.
    """
    event = raw.get("event")
    if event is None and raw.get("note") == RESTORE_FELL_BACK_TEXT:
        event = NoteEvent.RESTORE_FELL_BACK.value  # written before notes carried an event
    cls = _BY_EVENT.get(event) if isinstance(event, str) else None
    return (cls or UnknownNote).from_payload(raw)
