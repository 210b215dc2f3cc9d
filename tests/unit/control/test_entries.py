"""The log's vocabulary: golden payload bytes, validation, and what an older reader keeps."""

from __future__ import annotations

import difflib
import json
import math
import os
from pathlib import Path

import pytest

from hpcrun.control.entries import (
    ActionKind,
    BatchSkippedNote,
    CommitPayload,
    CreatedNote,
    CursorPayload,
    DebrisKind,
    DependencyNote,
    DrainedPayload,
    DrainErrorNote,
    EntryKind,
    EntryPayload,
    FaultInjectedNote,
    FaultPayload,
    FencePayload,
    HeartbeatPayload,
    InitFromNote,
    JobPayload,
    KnownGoodNote,
    LogDebrisMovedNote,
    LogDebrisNote,
    LogEntry,
    NodeExitNote,
    NodeStatus,
    NoteEvent,
    NotePayload,
    OpPayload,
    OpPhase,
    PartnerCopyNote,
    PayloadError,
    PeerLostNote,
    ProgressPayload,
    QuarantinePayload,
    RequeueLeftToSlurmNote,
    RequeueSentNote,
    RestoreFellBackNote,
    ResultPayload,
    SegmentNote,
    StatePayload,
    SupervisionClaimPayload,
    UnknownEntry,
    UnknownNote,
    canonical_json,
    decode,
    decode_as,
)
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.control.notes import (
    DdpRebuildsNote,
    NoRestoreNote,
    ReplicaCheckOffNote,
    SalvageNote,
    TrackerNote,
)
from hpcrun.control.record import fold_record
from hpcrun.errors import RecordError
from hpcrun.vocab import CheckpointFormat, FaultClass, RunState, Tier

GOLDEN = Path(__file__).parent / "golden"
ACCEPT = "HPCRUN_ACCEPT_GOLDEN"

# One payload per kind and note event, as the writers build them. The golden file of each is
# its entry payload's canonical JSON: changing a byte of it is a log schema change.
PAYLOADS: dict[str, EntryPayload] = {
    "fence": FencePayload(),
    "state": StatePayload(state=RunState.REQUEUED, reason="preemption: requeue after 0 s",
                          op_id="r1.g3.requeue", delay_s=0.0),
    "state_marked": StatePayload(state=RunState.REQUEUED, reason="node_failure: requeue",
                                 not_before=1700000100.0, exclude=("n2",), op_id="mark_state-1"),
    "job": JobPayload(job_id="4242", backend="slurm", op_id="r1.submit.0"),
    "op": OpPayload(op_id="submit-1", action=ActionKind.SUBMIT, phase=OpPhase.INTENT,
                    pass_id="watch-n1-4242-a1b2", base=17, lease_until=1700000150.0, delay_s=30.0,
                    exclude=("n2",), extra={"attempt": "2"}),
    "heartbeat": HeartbeatPayload(node="n3", ts=2000.0, step=100),
    "progress": ProgressPayload(step=100, tokens=409600),
    "commit": CommitPayload(ckpt_id="g000003-s0000000100-abcdef01", tier=Tier.NODE_LOCAL,
                            step=100, manifest="ckpt/g000003-s0000000100-abcdef01/manifest.json",
                            digest="xxh3:0123456789abcdef", bytes=1048576, nodes=("n1", "n2"),
                            run_id="tiny-20231114-221320-ab12", generation=3),
    "drained": DrainedPayload(ckpt_id="g000003-s0000000100-abcdef01", node="n1",
                              bytes=268435456, seconds=1.25),
    "cursor": CursorPayload(step=100, cursor={"kind": "hpcrun.data.cursor/1", "position": 800}),
    "fault": FaultPayload(fault=FaultClass.PROCESS_CRASH, node="n2", rank=3, step=117,
                          signature="process_crash:rank3:1", detail="RuntimeError: boom"),
    "fault_background": FaultPayload(fault=FaultClass.STORAGE_ERROR, node="n1", rank=0,
                                     step=100, signature="ckpt:verify",
                                     detail="shard checksum mismatch",
                                     ckpt_id="g000003-s0000000100-abcdef01", background=True),
    "quarantine": QuarantinePayload(node="n2", reason="node_failure: requeue after 30 s"),
    "result": ResultPayload(state=RunState.SUCCEEDED, manifest="postrun/manifest-g0003.json",
                            manifest_sha256="ab" * 32),
    "note_created": CreatedNote(run_id="tiny-20231114-221320-ab12", spec_id="sha256:00ff",
                                owner="alice"),
    "note_node_exit": NodeExitNote(node="n1", status=NodeStatus.SUCCEEDED, attempt=0),
    "note_peer_lost": PeerLostNote(node="n2", ranks=(2, 3)),
    "note_requeue_sent": RequeueSentNote(op_id="r1.g3.requeue", detail="requeued job 4242"),
    "note_requeue_left_to_slurm": RequeueLeftToSlurmNote(
        detail="stopped on SIGTERM: Slurm is ending the job"),
    "note_drain_error": DrainErrorNote(node="n1", step=100, ckpt_id="g000003-s0000000100-a",
                                       detail="No space left on device"),
    "note_fault_injected": FaultInjectedNote(fault="node-loss", node="n4", step=40),
    "note_log_debris": LogDebrisNote(name="999999999.json", kind=DebrisKind.BEYOND_END,
                                     detail="slot 999999999 lies 999999980 slots past the log's "
                                            "last slot 19"),
    "note_log_debris_moved": LogDebrisMovedNote(names=("999999999.json",),
                                                to=("debris/999999999.json",)),
    "note_dependency": DependencyNote(after=("train-20260101-120000-ab12:ok",),
                                      flag="afterok:4242",
                                      dirs=("/shared/runs/train-20260101-120000-ab12",)),
    "note_segment": SegmentNote(step_from=100, step_to=160,
                                reason="segment 2 ended at step 160 (from step 100) after a "
                                       "stop with a commit; requeue"),
    "note_restore_fell_back": RestoreFellBackNote(restored="g000002-s0000000050-a",
                                                  skipped=("g000003-s0000000100-a",)),
    "note_init_from": InitFromNote(path="/shared/exports/run-a.dcp", format=CheckpointFormat.DCP,
                                   digest="sha256:" + "ab" * 32, tensors=76),
    "note_known_good": KnownGoodNote(ckpt_id="g000002-s0000000050-a", step=50, checked_step=60),
    "note_batch_skipped": BatchSkippedNote(step=37, batch="36",
                                           detail="the replay computes the same results"),
    "supervise": SupervisionClaimPayload(node="n2", replaces="n1", attempt=0,
                                         reason="supervisor n1 vanished: no liveness beat "
                                                "for 5 s"),
    "note_partner_copy": PartnerCopyNote(ckpt_id="g000003-s0000000100-a", owner="n2",
                                         held_by="n3", bytes=1048576, complete=True),
    "note_tracker": TrackerNote(tracker="mlflow", run_ref="8f2c1d0e9a7b4c3d",
                                location="file:///runs/tiny-1/tracker/mlruns", watermark=40,
                                closed=True),
    "note_no_restore": NoRestoreNote(step=1),
    "note_ddp_rebuilds": DdpRebuildsNote(modules=("model",)),
    "note_salvage": SalvageNote(lost=("n2",)),
    "note_replica_check_off": ReplicaCheckOffNote(
        detail="no replicas to compare: replica check off"),
    "fault_sdc": FaultPayload(fault=FaultClass.SDC, node="n2", rank=3, step=40,
                              signature="sdc:n2", detail="silent data corruption on n2"),
}


def _entry(payload: dict[str, object], kind: str, slot: int = 0, gen: int = 1) -> LogEntry:
    return LogEntry(slot=slot, kind=kind, generation=gen, holder="h", ts=1000.0 + slot,
                    writer="test", payload=payload)


def test_every_kind_and_note_event_has_a_golden_payload() -> None:
    assert {p.entry_kind for p in PAYLOADS.values()} == set(EntryKind)
    assert {p.EVENT for p in PAYLOADS.values() if isinstance(p, NotePayload)} == set(NoteEvent)


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_bytes_match_golden_and_round_trip(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    built = canonical_json(PAYLOADS[name].to_payload())
    if os.environ.get(ACCEPT) == "1":
        path.write_bytes(built)
    golden = path.read_bytes()
    if built != golden:
        diff = "\n".join(difflib.unified_diff(golden.decode().split(","),
                                              built.decode().split(","), "golden", "built",
                                              lineterm=""))
        pytest.fail(f"{name}: payload bytes differ from {path} (a log schema change):\n{diff}\n"
                    f"if intended (and readers of older logs still work), accept with "
                    f"{ACCEPT}=1 pytest {__file__}")
    decoded = decode(_entry(json.loads(golden), PAYLOADS[name].entry_kind))
    assert decoded == PAYLOADS[name]
    assert canonical_json(decoded.to_payload()) == golden


def test_a_kind_this_version_does_not_know_survives_as_it_was_written(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    (tmp_path / "log").mkdir()
    log.append_entry(FencePayload(), generation=1, holder="a")
    log.append("lease", generation=1, holder="a", payload={"until": 99.5, "node": "n1"})
    log.append_entry(ProgressPayload(step=5, tokens=10), generation=1, holder="a")
    entries = log.read()
    assert [e.kind for e in entries] == ["fence", "lease", "progress"] and log.skipped == []
    unknown = decode(entries[1])
    assert unknown == UnknownEntry(kind="lease", extra={"until": 99.5, "node": "n1"})
    assert unknown.to_payload() == {"until": 99.5, "node": "n1"}
    rec = fold_record(entries, run_id="r", spec_id="s")
    assert rec.step == 5 and rec.anomalies == ()


def test_newer_fields_and_note_events_are_kept_and_written_back() -> None:
    raw = {"fault": "hang", "node": "n1", "rank": 0, "step": 9, "signature": "hang:stalled:0",
           "detail": "", "stacks": "stacks/g3/rank0.txt"}
    fault = decode_as(_entry(raw, "fault"), FaultPayload)
    assert fault.fault == FaultClass.HANG and fault.extra == {"stacks": "stacks/g3/rank0.txt"}
    assert fault.to_payload() == raw
    note = decode(_entry({"event": "spare_swapped", "node": "n9"}, "note"))
    assert note == UnknownNote(event="spare_swapped", extra={"node": "n9"})
    assert note.to_payload() == {"event": "spare_swapped", "node": "n9"}


def test_a_restore_note_written_before_notes_had_an_event_still_decodes() -> None:
    old = {"note": "restore fell back", "restored": "c1", "skipped": ["c2"]}
    assert decode(_entry(old, "note")) == RestoreFellBackNote(restored="c1", skipped=("c2",))


@pytest.mark.parametrize(("kind", "payload", "says"), [
    ("state", {"state": "BOGUS"}, "'state' must be one of PENDING"),
    ("progress", {"step": "ten"}, "'step' must be an integer, found 'ten'"),
    ("commit", {"ckpt_id": "c", "tier": "tape", "step": 1, "manifest": "m"},
     "'tier' must be one of node_local, shared, found 'tape'"),
    ("job", {"backend": "slurm"}, "lacks 'job_id'"),
    ("fault", {"fault": "hang", "rank": True}, "'rank' must be an integer, found True"),
    ("note", {"event": "node_exit", "node": "n1", "status": "exploded", "attempt": 0},
     "node_exit note payload field 'status' must be one of succeeded"),
    ("op", {"op_id": "x", "action": "submit", "exclude": "n1"}, "'exclude' must be a list"),
])
def test_a_malformed_payload_is_a_record_error_that_names_the_field(
        kind: str, payload: dict[str, object], says: str) -> None:
    with pytest.raises(PayloadError) as info:
        decode(_entry(payload, kind))
    assert says in str(info.value)
    assert isinstance(info.value, RecordError) and isinstance(info.value, ValueError)


def test_decode_as_refuses_another_kind() -> None:
    with pytest.raises(PayloadError, match="holds a ProgressPayload, expected a CommitPayload"):
        decode_as(_entry({"step": 1}, "progress"), CommitPayload)


def test_publish_entry_writes_the_canonical_entry(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    fence = log.claim("holder-a")
    state = StatePayload(state=RunState.STARTING, reason="job 1 restart 0 attempt 0", attempt=0)
    entry = log.publish_entry(state, generation=fence.generation, holder="holder-a")
    on_disk = json.loads((tmp_path / "log" / "000000001.json").read_bytes())
    assert on_disk["kind"] == "state" and on_disk["payload"] == {
        "state": "STARTING", "reason": "job 1 restart 0 attempt 0", "attempt": 0}
    assert decode(entry) == state
    unfenced = log.append_entry(FaultPayload(fault=FaultClass.UNKNOWN), generation=UNFENCED,
                                holder="")
    assert unfenced.payload == {"fault": "unknown", "node": None, "rank": None, "step": None,
                                "signature": "", "detail": ""}


def test_a_log_entry_keeps_a_nan_that_a_manifest_or_spec_refuses() -> None:
    raw = _entry({"loss": math.nan, "name": "\u00e9"}, "note").to_bytes()
    assert b'"loss":NaN' in raw and b'"name":"\\u00e9"' in raw  # ASCII, as every log entry
    assert math.isnan(LogEntry.from_bytes(0, raw).payload["loss"])
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json({"loss": math.nan})
