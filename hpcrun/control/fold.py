"""The run record: a pure fold over the run log.

:func:`fold_record` takes entries and returns a :class:`RunRecord`; :func:`continue_fold` folds
newer entries into an earlier record (the snapshot :func:`hpcrun.control.record.read_record`
keeps). The fold keeps only entries valid under the fence in force at their slot
(:mod:`hpcrun.control.fencing`), and applies state changes leniently: an illegal transition found
in the log is listed in ``anomalies`` instead of crashing the reader (a terminal state is still
never left).
"""


from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpcrun.control.entries import (
    CommitPayload,
    CreatedNote,
    CursorPayload,
    DependencyNote,
    DrainedPayload,
    EntryKind,
    EntryPayload,
    FaultPayload,
    FencePayload,
    HeartbeatPayload,
    JobPayload,
    LogDebrisMovedNote,
    LogDebrisNote,
    LogEntry,
    OpPayload,
    PayloadError,
    ProgressPayload,
    QuarantinePayload,
    ResultPayload,
    SegmentNote,
    StatePayload,
    decode,
)
from hpcrun.control.fencing import UNFENCED, Fence, apply_entry
from hpcrun.control.lease import OpClaims, note_op_entry
from hpcrun.control.states import can_transition, is_terminal
from hpcrun.errors import FormatError
from hpcrun.vocab import Backend, FaultClass, RunState, Tier

__all__ = ["RECORD_SCHEMA_VERSION", "AllocationUse", "CheckpointRef", "FaultRecord", "RunRecord",
           "continue_fold", "fold_record", "latest_checkpoint"]

RECORD_SCHEMA_VERSION = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointRef:
    """A checkpoint committed on one tier (from a valid ``commit`` entry)."""

    ckpt_id: str
    """Checkpoint id, unique within the run."""
    step: int
    """Optimizer step the checkpoint holds."""
    tier: Tier
    """Tier it is committed on."""
    generation: int
    """Generation that committed it."""
    slot: int
    """Log slot of the commit entry."""
    manifest: str
    """Manifest path: relative to the run directory, or absolute on node-local storage."""
    bytes: int = 0
    """Total bytes of its shards."""
    nodes: tuple[str, ...] = ()
    """Nodes holding shards (node-local tier)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocationUse:
    """One allocation the run held: the single source of allocated time and node-hours."""

    job_id: str
    """Scheduler job that held it ("" when no job entry came first)."""
    start: float
    """When it was granted: the scheduler's start when the STARTING entry names it, else the
    first STARTING entry's time."""
    end: float | None = None
    """When it was given back; None while it is held."""
    nodes: int = 0
    """Nodes held, hot spares included (0: not named, an older log)."""
    spares: int = 0
    """Of those, hot spares (held, not in the gang the allocation started)."""
    queued_s: float = 0.0
    """Wait before it: from the submission or the previous allocation's end to its start."""
    requeued: bool = False
    """Given back for the run to go on in another allocation (a requeue, a preemption): its
    time after the gang's last work is recovery."""

    def seconds(self, now: float) -> float:
        """Its length, up to ``now`` while it is held."""
        end = self.end if self.end is not None else max(self.start, now)
        return max(0.0, end - self.start)


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultRecord:
    """A classified failure (from a ``fault`` entry)."""

    fault: FaultClass
    """Its class."""
    ts: float
    """When it was recorded."""
    slot: int = -1
    """Log slot of the entry (-1 for a fault not yet logged)."""
    generation: int = UNFENCED
    """Generation of the writer."""
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
    """Operation that recorded it (login-node reconcile), for idempotence."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """What the log says about a run, folded."""

    run_id: str
    """Run id (directory name)."""
    spec_id: str
    """Digest of the frozen spec."""
    state: RunState = RunState.PENDING
    """Current run state."""
    generation: int = 0
    """Generation in force (0 before any incarnation fenced)."""
    holder: str = ""
    """Holder of that generation."""
    fence_slot: int = -1
    """Slot of the fence in force; a restore point is chosen from slots before it."""
    job_ids: tuple[str, ...] = ()
    """Scheduler job ids bound to the run, oldest first."""
    job_backends: Mapping[str, Backend] = field(default_factory=dict)
    """job id -> backend that runs it."""
    restarts: int = 0
    """Gang restarts inside the current allocation."""
    requeues: int = 0
    """Requeues of the run so far."""
    membership: tuple[str, ...] = ()
    """Nodes of the current incarnation."""
    heartbeat: Mapping[str, Any] | None = None
    """``{"nodes": {node: {"step", "ts"}}, "last_ts": float}`` of the current generation."""
    step: int = 0
    """Last validated optimizer step."""
    tokens: int = 0
    """Tokens accepted up to ``step``."""
    checkpoints: tuple[CheckpointRef, ...] = ()
    """Committed checkpoints, in commit order."""
    drained: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """ckpt_id -> nodes that drained it to the shared tier."""
    cursor: Mapping[str, Any] | None = None
    """Latest committed data cursor ``{"step", "cursor"}``."""
    faults: tuple[FaultRecord, ...] = ()
    """Classified failures, oldest first."""
    quarantined: tuple[str, ...] = ()
    """Nodes excluded from later allocations."""
    result: Mapping[str, Any] | None = None
    """Terminal result payload."""
    last_slot: int = -1
    """Highest slot folded."""
    state_info: Mapping[str, Any] | None = None
    """Payload of the entry that set ``state`` (reason, and for REQUEUED not_before/exclude)."""
    ops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """op_id -> merged payloads of its counted ``op`` entries: ``phase`` (intent/done/failed),
    ``slot`` of the first, and the ``pass`` and ``lease_until`` of the newest intent."""
    op_claims: OpClaims = field(default_factory=OpClaims)
    """Which login-node pass holds the run (:mod:`hpcrun.control.lease`)."""
    owner: str | None = None
    """User who created the run."""
    anomalies: tuple[str, ...] = ()
    """Entries that were valid but made no sense (illegal transition, bad payload)."""
    skipped: tuple[int, ...] = ()
    """Slots whose files were malformed and skipped."""
    log_debris: Mapping[str, str] = field(default_factory=dict)
    """Open incidents of debris in ``log/`` (file name -> what was found), each reported once
    by a ``note`` entry (``event: log_debris``) until ``hpcrun doctor`` moves it aside."""
    segments: int = 0
    """Allocations that ended in a stop with committed progress (``segment`` notes)."""
    wall_s: float = 0.0
    """Allocated wall seconds of the allocations that ended (STARTING to REQUEUED, PREEMPTED
    or a terminal state)."""
    alloc_since: float | None = None
    """When the current allocation started (its :attr:`AllocationUse.start`); None between
    allocations."""
    allocations: tuple[AllocationUse, ...] = ()
    """Every allocation, oldest first; the last one is open while ``alloc_since`` is set."""
    queued_since: float | None = None
    """Since when the run waits for an allocation (its submission, a requeue)."""
    alloc_seen: float | None = None
    """Last heartbeat or progress of the current allocation (where an allocation that ended
    without a word ended)."""
    segment_from_step: int = 0
    """Newest committed checkpoint step when the current allocation started."""
    first_started: float | None = None
    """When the run's first STARTING was logged."""
    after: tuple[str, ...] = ()
    """Upstream runs this run waits for (``RUN:ok`` / ``RUN:any``, from a ``dependency``
    note)."""
    after_dirs: tuple[str, ...] = ()
    """Their run directories, in the same order."""

    @property
    def fence(self) -> Fence:
        """The fencing token in force."""
        return Fence(generation=self.generation, holder=self.holder, slot=self.fence_slot)

    def slurm_job_ids(self) -> tuple[str, ...]:
        """The job ids Slurm runs (local-backend jobs left out)."""
        return tuple(j for j in self.job_ids
                     if self.job_backends.get(j, Backend.SLURM) == Backend.SLURM)

    def op_done(self, op_id: str) -> bool:
        """Whether operation ``op_id`` is recorded as carried out."""
        return self.ops.get(op_id, {}).get("phase") == "done"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists on dumping); fast, unlike ``asdict``."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        body["checkpoints"] = [_slots_dict(c) for c in self.checkpoints]
        body["allocations"] = [_slots_dict(a) for a in self.allocations]
        body["faults"] = [_slots_dict(f) for f in self.faults]
        body["op_claims"] = self.op_claims.to_dict()
        return {"schema_version": RECORD_SCHEMA_VERSION, **body}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RunRecord:
        """Rebuild from :meth:`to_dict` output; raise ValueError/TypeError/KeyError when bad."""
        if raw.get("schema_version") != RECORD_SCHEMA_VERSION:
            raise FormatError(f"record snapshot has schema_version {raw.get('schema_version')!r}, "
                              f"expected {RECORD_SCHEMA_VERSION}; it is a cache and is rebuilt "
                              "from the log")
        body = {k: v for k, v in raw.items() if k != "schema_version"}
        body["state"] = RunState(body["state"])
        body["checkpoints"] = tuple(CheckpointRef(**{**c, "tier": Tier(c["tier"]),
                                                     "nodes": tuple(c["nodes"])})
                                    for c in body["checkpoints"])
        body["faults"] = tuple(FaultRecord(**{**f, "fault": FaultClass(f["fault"])})
                               for f in body["faults"])
        body["allocations"] = tuple(AllocationUse(**a) for a in body.get("allocations", ()))
        body["drained"] = {k: tuple(v) for k, v in body["drained"].items()}
        body["job_backends"] = {j: Backend(b) for j, b in body.get("job_backends", {}).items()}
        body["log_debris"] = dict(body.get("log_debris") or {})
        body["op_claims"] = OpClaims.from_dict(body.get("op_claims") or {})
        for key in ("job_ids", "membership", "quarantined", "anomalies", "skipped", "after",
                    "after_dirs"):
            body[key] = tuple(body.get(key, ()))
        return cls(**body)


def _slots_dict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


class _Acc:
    """Mutable accumulator of one fold (private; the fold is pure from outside)."""

    def __init__(self, rec: RunRecord) -> None:
        self.v: dict[str, Any] = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
        for key in ("job_ids", "membership", "checkpoints", "faults", "quarantined",
                    "anomalies", "skipped", "allocations"):
            self.v[key] = list(self.v[key])
        self.v["ops"] = {k: dict(v) for k, v in self.v["ops"].items()}
        self.v["drained"] = {k: list(v) for k, v in self.v["drained"].items()}

    def freeze(self) -> RunRecord:
        v = dict(self.v)
        for key in ("job_ids", "membership", "checkpoints", "faults", "quarantined",
                    "anomalies", "skipped", "allocations"):
            v[key] = tuple(v[key])
        v["drained"] = {k: tuple(n) for k, n in v["drained"].items()}
        return RunRecord(**v)

    def anomaly(self, entry: LogEntry, what: str) -> None:
        self.v["anomalies"].append(f"slot {entry.slot} ({entry.kind}): {what}")


def _set_state(acc: _Acc, entry: LogEntry, target: RunState,
               p: StatePayload | None = None) -> None:
    current = acc.v["state"]
    if is_terminal(current) and target != current:
        acc.anomaly(entry, f"{current.value} -> {target.value} ignored: terminal states are final")
        return
    if not can_transition(current, target):
        acc.anomaly(entry, f"illegal transition {current.value} -> {target.value} (applied)")
    if target == RunState.RECOVERING and current != target:
        acc.v["restarts"] += 1
    # a requeue nobody recorded (Slurm requeued a preempted or failed job by itself) shows as
    # a new start straight after PREEMPTED or RUNNING
    requeued = target == RunState.REQUEUED or (
        target == RunState.STARTING and current in (RunState.PREEMPTED, RunState.RUNNING))
    if requeued and current != target:
        acc.v["requeues"] += 1
        acc.v["restarts"] = 0
    _account_allocation(acc, entry, current, target, p)
    acc.v["state"] = target


_ALLOCATION_ENDS = frozenset({RunState.REQUEUED, RunState.PREEMPTED, RunState.SUCCEEDED,
                              RunState.FAILED, RunState.CANCELLED})


def _account_allocation(acc: _Acc, entry: LogEntry, current: RunState, target: RunState,
                        p: StatePayload | None) -> None:
    """Allocated wall time: an allocation runs from its start (the scheduler's, else its first
    STARTING) to the state that gives it back (a STARTING straight after RUNNING is a requeue
    nobody recorded: the old one ended at its last heartbeat)."""
    since = acc.v["alloc_since"]
    if since is not None and (target in _ALLOCATION_ENDS or (
            target == RunState.STARTING and current == RunState.RUNNING)):
        seen = acc.v["alloc_seen"]
        end = max(since, entry.ts if target != RunState.STARTING or seen is None else seen)
        _close_allocation(acc, end, queue_after=target not in _RUN_ENDS)
        since = None
    if since is None and target == RunState.STARTING:
        _open_allocation(acc, entry, p)


_RUN_ENDS = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


def _close_allocation(acc: _Acc, end: float, *, queue_after: bool) -> None:
    acc.v["wall_s"] += max(0.0, end - acc.v["alloc_since"])
    allocs = acc.v["allocations"]
    if allocs and allocs[-1].end is None:
        allocs[-1] = replace(allocs[-1], end=end, requeued=queue_after)
    acc.v["alloc_since"] = acc.v["alloc_seen"] = None
    acc.v["queued_since"] = end if queue_after else None


def _open_allocation(acc: _Acc, entry: LogEntry, p: StatePayload | None) -> None:
    start = entry.ts
    if p is not None and p.alloc_start is not None and p.alloc_start <= entry.ts:
        start = p.alloc_start
    held = (p.held if p is not None and p.held else 0) or len(acc.v["membership"])
    gang = len(p.nodes) if p is not None and p.nodes else held
    queued = acc.v["queued_since"]
    acc.v["allocations"].append(AllocationUse(
        job_id=acc.v["job_ids"][-1] if acc.v["job_ids"] else "", start=start, nodes=held,
        spares=max(0, held - gang),
        queued_s=max(0.0, start - queued) if queued is not None else 0.0))
    acc.v["alloc_since"] = start
    acc.v["queued_since"] = None
    if acc.v["first_started"] is None:
        acc.v["first_started"] = start
    acc.v["segment_from_step"] = max((c.step for c in acc.v["checkpoints"]), default=0)


def _on_state(acc: _Acc, e: LogEntry, p: StatePayload) -> None:
    before = acc.v["state"]
    _set_state(acc, e, p.state, p)
    if acc.v["state"] != before or acc.v["state_info"] is None:
        acc.v["state_info"] = {**p.to_payload(), "slot": e.slot, "ts": e.ts}
    if p.nodes:
        acc.v["membership"] = list(p.nodes)


def _on_fence(acc: _Acc, e: LogEntry, p: FencePayload) -> None:
    acc.v.update(generation=e.generation, holder=e.holder, fence_slot=e.slot, heartbeat=None)


def _on_job(acc: _Acc, e: LogEntry, p: JobPayload) -> None:
    if p.job_id not in acc.v["job_ids"]:
        acc.v["job_ids"].append(p.job_id)
        acc.v["restarts"] = 0
    acc.v["job_backends"] = {**acc.v["job_backends"], p.job_id: Backend(p.backend)}
    if not p.nodes and acc.v["alloc_since"] is None and acc.v["queued_since"] is None:
        acc.v["queued_since"] = e.ts  # submitted (no nodes yet): the wait for them starts
    if p.nodes:
        acc.v["membership"] = list(p.nodes)


def _on_progress(acc: _Acc, e: LogEntry, p: ProgressPayload) -> None:
    acc.v.update(step=p.step, tokens=acc.v["tokens"] if p.tokens is None else p.tokens)
    _seen(acc, e.ts)


def _seen(acc: _Acc, ts: float) -> None:
    if acc.v["alloc_since"] is not None:
        acc.v["alloc_seen"] = max(ts, acc.v["alloc_seen"] or ts)


def _on_commit(acc: _Acc, e: LogEntry, p: CommitPayload) -> None:
    acc.v["checkpoints"].append(CheckpointRef(
        ckpt_id=p.ckpt_id, step=p.step, tier=p.tier, generation=e.generation, slot=e.slot,
        manifest=p.manifest, bytes=p.bytes, nodes=p.nodes))


def _on_drained(acc: _Acc, e: LogEntry, p: DrainedPayload) -> None:
    nodes = acc.v["drained"].setdefault(p.ckpt_id, [])
    if p.node not in nodes:
        nodes.append(p.node)


def _on_cursor(acc: _Acc, e: LogEntry, p: CursorPayload) -> None:
    acc.v["cursor"] = {"step": p.step, "cursor": dict(p.cursor)}


def _on_fault(acc: _Acc, e: LogEntry, p: FaultPayload) -> None:
    acc.v["faults"].append(FaultRecord(
        fault=p.fault, ts=e.ts, slot=e.slot, generation=e.generation, node=p.node, rank=p.rank,
        step=p.step, signature=p.signature, detail=p.detail, op_id=p.op_id))


def _on_quarantine(acc: _Acc, e: LogEntry, p: QuarantinePayload) -> None:
    if p.node not in acc.v["quarantined"]:
        acc.v["quarantined"].append(p.node)


def _on_heartbeat(acc: _Acc, e: LogEntry, p: HeartbeatPayload) -> None:
    ts = e.ts if p.ts is None else p.ts
    prev = acc.v["heartbeat"] or {"nodes": {}, "last_ts": ts}
    nodes = {**prev["nodes"], p.node: {"step": p.step, "ts": ts}}
    acc.v["heartbeat"] = {"nodes": nodes, "last_ts": max(float(prev["last_ts"]), ts)}
    _seen(acc, ts)


def _on_result(acc: _Acc, e: LogEntry, p: ResultPayload) -> None:
    acc.v["result"] = p.to_payload()
    if p.state is not None:
        _set_state(acc, e, p.state)


def _on_op(acc: _Acc, e: LogEntry, p: OpPayload) -> None:
    claims, counts = note_op_entry(acc.v["op_claims"], p, slot=e.slot, ts=e.ts)
    if not counts:
        return  # an intent logged while another pass held the run: that pass leaves it
    acc.v["op_claims"] = claims
    prev = acc.v["ops"].get(p.op_id, {"slot": e.slot})
    acc.v["ops"][p.op_id] = {**prev, **p.to_payload(), "slot": prev["slot"]}


def _on_created(acc: _Acc, e: LogEntry, p: CreatedNote) -> None:
    acc.v["owner"] = p.owner


def _on_segment(acc: _Acc, e: LogEntry, p: SegmentNote) -> None:
    acc.v["segments"] += 1


def _on_dependency(acc: _Acc, e: LogEntry, p: DependencyNote) -> None:
    acc.v.update(after=tuple(p.after), after_dirs=tuple(p.dirs))


def _on_debris(acc: _Acc, e: LogEntry, p: LogDebrisNote) -> None:
    acc.v["log_debris"] = {**acc.v["log_debris"], p.name: p.detail}


def _on_debris_moved(acc: _Acc, e: LogEntry, p: LogDebrisMovedNote) -> None:
    moved = set(p.names)
    acc.v["log_debris"] = {k: v for k, v in acc.v["log_debris"].items() if k not in moved}


_HANDLERS: dict[type[EntryPayload], Callable[[_Acc, LogEntry, Any], None]] = {
    FencePayload: _on_fence, StatePayload: _on_state, JobPayload: _on_job,
    ProgressPayload: _on_progress, CommitPayload: _on_commit, DrainedPayload: _on_drained,
    CursorPayload: _on_cursor, FaultPayload: _on_fault, QuarantinePayload: _on_quarantine,
    HeartbeatPayload: _on_heartbeat, ResultPayload: _on_result, OpPayload: _on_op,
    CreatedNote: _on_created, LogDebrisNote: _on_debris, LogDebrisMovedNote: _on_debris_moved,
    SegmentNote: _on_segment, DependencyNote: _on_dependency,
}
"""What the record takes from each payload; other notes and unknown kinds are ignored."""


def _decode(acc: _Acc, entry: LogEntry) -> EntryPayload | None:
    """The entry's payload, or None (listed in ``anomalies``) when it is malformed."""
    try:
        return decode(entry)
    except PayloadError as exc:
        if entry.kind == EntryKind.FAULT and entry.payload.get("fault") not in list(FaultClass):
            # a class a newer writer knows: the fault still counts, as unknown
            acc.anomaly(entry, f"unknown fault class {entry.payload.get('fault')!r} "
                               "(kept as unknown)")
            return _decode(acc, replace(entry, payload={**entry.payload,
                                                        "fault": FaultClass.UNKNOWN.value}))
        acc.anomaly(entry, str(exc))
        return None


def continue_fold(record: RunRecord, entries: Sequence[LogEntry], *,
                  skipped: Sequence[int] = ()) -> RunRecord:
    """Fold ``entries`` (slot order, all newer than ``record.last_slot``) into ``record``."""
    acc = _Acc(record)
    fence = record.fence
    for entry in entries:
        if entry.slot <= acc.v["last_slot"]:
            continue
        fence, counts = apply_entry(fence, entry)
        acc.v["last_slot"] = entry.slot
        if not counts:
            continue
        payload = _decode(acc, entry)
        handler = _HANDLERS.get(type(payload)) if payload is not None else None
        if handler is not None:
            handler(acc, entry, payload)
    acc.v["skipped"].extend(s for s in skipped if s not in acc.v["skipped"])
    # a malformed slot never becomes well-formed (entries are created whole, never rewritten)
    acc.v["last_slot"] = max([acc.v["last_slot"], *skipped])
    return acc.freeze()


def fold_record(entries: Sequence[LogEntry], *, run_id: str, spec_id: str,
                skipped: Sequence[int] = ()) -> RunRecord:
    """The record a log says, from scratch. Pure; void entries are ignored."""
    return continue_fold(RunRecord(run_id=run_id, spec_id=spec_id), entries, skipped=skipped)


def latest_checkpoint(record: RunRecord, *, tier: Tier | None = None) -> CheckpointRef | None:
    """The newest committed checkpoint (highest step, then latest commit), optionally per tier."""
    refs = [c for c in record.checkpoints if tier is None or c.tier == tier]
    return max(refs, key=lambda c: (c.step, c.slot), default=None)

