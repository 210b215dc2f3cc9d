"""The run record: pure fold over constructed logs, run directory, snapshot cache."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.fencing import UNFENCED
from hpcrun.control.fold import fold_record, latest_checkpoint
from hpcrun.control.log import EntryKind, LogEntry, RunLog, slot_name
from hpcrun.control.record import SNAPSHOT_FILE, create_run, load_run_spec, read_record
from hpcrun.control.retry import FaultClass
from hpcrun.control.spec import RunSpec
from hpcrun.control.states import RunState
from hpcrun.errors import RecordError
from hpcrun.storage import CountingStorage, LocalStorage
from hpcrun.testing import FakeClock

SPEC = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main"})


def E(slot: int, kind: str, gen: int = 1, holder: str = "a", **payload: Any) -> LogEntry:
    return LogEntry(slot=slot, kind=kind, generation=gen, holder=holder, ts=1000.0 + slot,
                    writer="test", payload=payload)


def test_fold_of_a_preempted_and_requeued_run() -> None:
    entries = [
        E(0, EntryKind.NOTE, UNFENCED, "", event="created", owner="alice"),
        E(1, EntryKind.JOB, UNFENCED, "", job_id="101", backend="slurm"),
        E(2, EntryKind.FENCE, 1, "a"),
        E(3, EntryKind.STATE, state="STARTING", reason="", nodes=["n1", "n2"]),
        E(4, EntryKind.STATE, state="RUNNING", reason=""),
        E(5, EntryKind.PROGRESS, step=100, tokens=4096),
        E(6, EntryKind.COMMIT, ckpt_id="c100", tier="node_local", step=100,
          manifest="/nvme/c100/manifest.json", bytes=10, nodes=["n1", "n2"]),
        E(7, EntryKind.CURSOR, step=100, cursor={"position": 800}),
        E(8, EntryKind.DRAINED, ckpt_id="c100", node="n1"),
        E(9, EntryKind.DRAINED, ckpt_id="c100", node="n2"),
        E(10, EntryKind.COMMIT, ckpt_id="c100", tier="shared", step=100,
          manifest="ckpt/c100/manifest.json", bytes=10),
        E(11, EntryKind.STATE, state="PREEMPTED", reason="SIGUSR1"),
        E(12, EntryKind.FAULT, fault="preemption", node=None, step=100, signature="usr1"),
        E(13, EntryKind.STATE, state="REQUEUED", reason="preempted"),
        E(14, EntryKind.FENCE, 2, "b"),
        E(15, EntryKind.STATE, 2, "b", state="STARTING", reason="", nodes=["n3", "n4"]),
        E(16, EntryKind.HEARTBEAT, 2, "b", node="n3", step=100, ts=2000.0),
        E(17, EntryKind.OP, UNFENCED, "", op_id="x1", action="release", phase="intent", attempt="0",
          **{"try": 0}),
        E(18, EntryKind.OP, UNFENCED, "", op_id="x1", action="release", phase="done"),
    ]
    rec = fold_record(entries, run_id="r", spec_id="s")
    assert rec.state == RunState.STARTING and (rec.generation, rec.holder) == (2, "b")
    assert rec.owner == "alice" and rec.job_ids == ("101",)
    assert rec.step == 100 and rec.tokens == 4096 and rec.requeues == 1
    assert rec.membership == ("n3", "n4") and rec.fence_slot == 14
    assert rec.cursor == {"step": 100, "cursor": {"position": 800}}
    assert rec.drained == {"c100": ("n1", "n2")}
    assert [c.tier for c in rec.checkpoints] == ["node_local", "shared"]
    shared = latest_checkpoint(rec, tier="shared")
    assert shared is not None and shared.manifest == "ckpt/c100/manifest.json"
    assert rec.faults[0].fault == FaultClass.PREEMPTION
    assert rec.heartbeat == {"nodes": {"n3": {"step": 100, "ts": 2000.0}}, "last_ts": 2000.0}
    assert rec.op_done("x1") and rec.ops["x1"]["slot"] == 17
    assert rec.last_slot == 18 and rec.anomalies == ()


def test_void_entries_do_not_publish() -> None:
    entries = [
        E(0, EntryKind.FENCE, 1, "a"),
        E(1, EntryKind.STATE, state="STARTING"),
        E(2, EntryKind.FENCE, 2, "b"),
        E(3, EntryKind.PROGRESS, 1, "a", step=500, tokens=1),       # stale: after fence 2
        E(4, EntryKind.COMMIT, 1, "a", ckpt_id="c500", tier="shared", step=500, manifest="m"),
        E(5, EntryKind.FENCE, 2, "c"),                                # lost claim: void
        E(6, EntryKind.PROGRESS, 2, "c", step=600, tokens=1),        # holder of a void claim
        E(7, EntryKind.PROGRESS, UNFENCED, "", step=700, tokens=1),  # unfenced cannot publish
        E(8, EntryKind.PROGRESS, 2, "b", step=10, tokens=5),
    ]
    rec = fold_record(entries, run_id="r", spec_id="s")
    assert rec.step == 10 and rec.checkpoints == () and rec.holder == "b"


def test_illegal_transition_is_an_anomaly_not_a_crash() -> None:
    entries = [
        E(0, EntryKind.FENCE), E(1, EntryKind.STATE, state="SUCCEEDED"),
        E(2, EntryKind.STATE, state="RUNNING"), E(3, EntryKind.STATE, state="BOGUS"),
        E(4, EntryKind.PROGRESS, step="ten"),
    ]
    rec = fold_record(entries, run_id="r", spec_id="s")
    assert rec.state == RunState.SUCCEEDED  # terminal is final
    assert len(rec.anomalies) == 4
    assert "illegal transition PENDING -> SUCCEEDED" in rec.anomalies[0]
    assert "terminal" in rec.anomalies[1] and "BOGUS" in rec.anomalies[2]


def test_restarts_count_per_allocation() -> None:
    entries = [E(0, EntryKind.FENCE), E(1, EntryKind.STATE, state="STARTING"),
               E(2, EntryKind.STATE, state="RUNNING"), E(3, EntryKind.STATE, state="RECOVERING"),
               E(4, EntryKind.STATE, state="STARTING"), E(5, EntryKind.STATE, state="RUNNING"),
               E(6, EntryKind.STATE, state="RECOVERING")]
    assert fold_record(entries, run_id="r", spec_id="s").restarts == 2
    entries += [E(7, EntryKind.STATE, state="REQUEUED")]
    rec = fold_record(entries, run_id="r", spec_id="s")
    assert (rec.restarts, rec.requeues) == (0, 1)


def test_create_run_layout_permissions_and_no_overwrite(tmp_path: Path) -> None:
    old = os.umask(0o000)  # a permissive umask must not make the run world-writable
    try:
        run_dir = create_run(tmp_path / "runs", SPEC, clock=FakeClock(), owner="alice")
    finally:
        os.umask(old)
    assert run_dir.name.startswith("tiny-20231114-")
    for sub in ("log", "code", "ckpt", "events", "heartbeat", "logs", "submitit"):
        assert stat.S_IMODE((run_dir / sub).stat().st_mode) == 0o750
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
    assert load_run_spec(run_dir) == SPEC
    rec = read_record(run_dir)
    assert rec.owner == "alice" and rec.spec_id == SPEC.spec_id and rec.state == RunState.PENDING
    with pytest.raises(RecordError, match="already holds a run"):
        create_run(tmp_path / "runs", SPEC, run_id=run_dir.name)


def test_tampered_spec_is_refused(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, SPEC, run_id="r1")
    body = json.loads((run_dir / "spec.json").read_text())
    body["spec"]["resources"]["nodes"] = 64
    (run_dir / "spec.json").write_text(json.dumps(body))
    with pytest.raises(RecordError, match="was modified"):
        load_run_spec(run_dir)


def _populate(run_dir: Path, n: int) -> RunLog:
    log = RunLog(run_dir)
    fence = log.claim("h")
    for i in range(n):
        log.append(EntryKind.PROGRESS, generation=fence.generation, holder="h",
                   payload={"step": i, "tokens": i * 10})
    return log


def test_snapshot_gives_the_same_record_as_a_full_fold(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, SPEC, run_id="r1")
    log = _populate(run_dir, 30)
    first = read_record(run_dir)
    assert (run_dir / SNAPSHOT_FILE).exists()
    log.append(EntryKind.STATE, generation=1, holder="h", payload={"state": "STARTING"})
    log.append(EntryKind.PROGRESS, generation=1, holder="h", payload={"step": 77, "tokens": 1})
    counting = CountingStorage(LocalStorage())
    warm = read_record(run_dir, storage=counting)
    assert counting.counts["read_bytes"] <= 3  # snapshot + the two new slots (+ spec at most)
    full = fold_record(RunLog(run_dir).read(), run_id="r1", spec_id=SPEC.spec_id)
    assert warm == full and warm.step == 77 and first.step == 29


def test_corrupt_snapshot_is_ignored(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, SPEC, run_id="r1")
    _populate(run_dir, 5)
    (run_dir / SNAPSHOT_FILE).write_text('{"schema_version": 1, "state": "RUN')
    assert read_record(run_dir).step == 4


def test_malformed_entry_is_skipped_and_reported(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, SPEC, run_id="r1")
    log = _populate(run_dir, 3)
    (run_dir / "log" / slot_name(5)).write_bytes(b'{"kind": "progress", "generat')  # torn
    log.append(EntryKind.PROGRESS, generation=1, holder="h", payload={"step": 42, "tokens": 0})
    rec = read_record(run_dir)
    assert rec.skipped == (5,) and rec.step == 42
    assert read_record(run_dir).skipped == (5,)  # still reported from the snapshot
