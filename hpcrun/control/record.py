"""The run directory that holds a run record: create it, read its frozen spec, read its record.

Run directory layout (on the shared filesystem)::

    <runs_root>/<run_id>/
        spec.json              frozen RunSpec + spec_id (written once, exclusively)
        log/                   the run log (one file per slot, never rewritten)
        record.snapshot.json   cache of the fold up to a slot (safe to delete)
        code/                  code snapshot when the tree was dirty at submit
        ckpt/ events/ heartbeat/ logs/ submitit/

The record itself is a pure fold over the log (:mod:`hpcrun.control.fold`, whose names are
re-exported here); :func:`read_record` folds only the slots newer than the snapshot.
"""


from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import time
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    CreatedNote,
    LogDebrisNote,
)
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.fold import (
    RECORD_SCHEMA_VERSION,
    CheckpointRef,
    FaultRecord,
    RunRecord,
    continue_fold,
    fold_record,
    latest_checkpoint,
)
from hpcrun.control.log import LogDebris, RunLog, slot_name
from hpcrun.control.spec import RunSpec
from hpcrun.errors import RecordError, SpecError, StorageError
from hpcrun.safedirs import ensure_private_dir
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = ["DIR_MODE", "RECORD_SCHEMA_VERSION", "RUN_SPEC_FILE", "RUN_SUBDIRS", "SNAPSHOT_FILE",
           "CheckpointRef", "FaultRecord", "RunRecord", "continue_fold", "create_run",
           "fold_record", "latest_checkpoint", "load_run_spec", "new_run_id", "read_record"]

RUN_SPEC_FILE = "spec.json"
SNAPSHOT_FILE = "record.snapshot.json"
RUN_SUBDIRS = ("log", "code", "ckpt", "events", "heartbeat", "logs", "submitit")
DIR_MODE = 0o750


def new_run_id(name: str, now: float) -> str:
    """``<name>-<yyyymmdd-HHMMSS>-<4 hex>`` (UTC)."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(2)}"


def _make_dir(storage: Storage, path: Path) -> None:
    storage.makedirs(path, mode=DIR_MODE)
    ensure_private_dir(path, what="run directory", mode=DIR_MODE)  # not another user's
    try:
        os.chmod(path, DIR_MODE)  # makedirs' mode is masked by the umask; never world-writable
    except OSError as exc:
        raise StorageError(f"chmod {path} failed: {exc.strerror}; check ownership") from exc


def create_run(runs_root: str | os.PathLike[str], spec: RunSpec, *, run_id: str | None = None,
               owner: str | None = None, storage: Storage = LOCAL_STORAGE,
               clock: Clock = SYSTEM_CLOCK) -> Path:
    """Create the run directory, write ``spec.json`` durably, log the creation; return the dir.

    Raises:
        RecordError: the run directory already holds a run.
    """
    run_id = run_id or new_run_id(spec.name, clock.now())
    run_dir = Path(runs_root) / run_id
    storage.makedirs(Path(runs_root))
    _make_dir(storage, run_dir)
    body = {"schema_version": RECORD_SCHEMA_VERSION, "spec_id": spec.spec_id,
            "spec": spec.to_dict()}
    data = json.dumps(body, sort_keys=True, indent=1).encode()
    if not storage.create_exclusive(run_dir / RUN_SPEC_FILE, data):
        raise RecordError(f"run directory {run_dir} already holds a run; choose another run_id "
                          "or let hpcrun generate one")
    for sub in RUN_SUBDIRS:
        _make_dir(storage, run_dir / sub)
    RunLog(run_dir, storage=storage, clock=clock).append_entry(
        CreatedNote(run_id=run_id, spec_id=spec.spec_id, owner=owner or getpass.getuser()),
        generation=UNFENCED, holder="")
    return run_dir


def load_run_spec(run_dir: str | os.PathLike[str], *,
                  storage: Storage = LOCAL_STORAGE) -> RunSpec:
    """Read and verify ``spec.json`` (its digest must match the spec it holds)."""
    path = Path(run_dir) / RUN_SPEC_FILE
    if not storage.exists(path):
        raise RecordError(f"no {RUN_SPEC_FILE} in {run_dir}; is this a run directory? "
                          "Runs are created by `hpcrun submit`")
    try:
        body = json.loads(storage.read_bytes(path))
        spec = RunSpec.from_dict(body["spec"], source=str(path))
        expected = body["spec_id"]
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise RecordError(f"{path} is not a valid run spec file ({exc}); the run directory "
                          "is damaged, restore it from a backup") from exc
    if spec.spec_id != expected:
        raise RecordError(f"{path} was modified: its spec hashes to {spec.spec_id}, expected "
                          f"{expected}; restore the original spec.json")
    return spec


def _load_snapshot(storage: Storage, run_dir: Path, run_id: str) -> RunRecord | None:
    path = run_dir / SNAPSHOT_FILE
    if not storage.exists(path):
        return None
    try:
        rec = RunRecord.from_dict(json.loads(storage.read_bytes(path)))
    except (ValueError, TypeError, KeyError, AttributeError, StorageError):
        return None  # only a cache: fold from scratch
    if rec.run_id != run_id or (rec.last_slot >= 0 and not storage.exists(
            run_dir / "log" / slot_name(rec.last_slot))):
        return None
    return rec


def read_record(run_dir: str | os.PathLike[str], *, storage: Storage = LOCAL_STORAGE,
                spec_id: str | None = None, write_snapshot: bool = True) -> RunRecord:
    """The run's record: the snapshot (if any) plus a fold of the slots newer than it.

    The snapshot is rewritten atomically when new slots were folded; failing to write it (a
    read-only run directory) is not an error.
    """
    run_dir = Path(run_dir)
    run_id = run_dir.name
    base = _load_snapshot(storage, run_dir, run_id)
    if base is None:
        sid = spec_id if spec_id is not None else load_run_spec(run_dir, storage=storage).spec_id
        base = RunRecord(run_id=run_id, spec_id=sid)
    log = RunLog(run_dir, storage=storage)
    new = log.read(since_slot=base.last_slot + 1)
    if base.last_slot > log.end:  # a snapshot folded past the log's end (debris): refold
        base = RunRecord(run_id=run_id, spec_id=base.spec_id)
        new = log.read()
    if not new and not log.skipped and not _unreported(base, log):
        return base
    rec = continue_fold(base, new, skipped=log.skipped)
    if write_snapshot:
        rec = _report_debris(rec, log)
        with contextlib.suppress(StorageError):  # only a cache; the run dir may be read-only
            storage.write_atomic(run_dir / SNAPSHOT_FILE,
                                 json.dumps(rec.to_dict(), separators=(",", ":")).encode())
    return rec


def _unreported(record: RunRecord, log: RunLog) -> list[LogDebris]:
    return [d for d in log.debris if d.name not in record.log_debris]


def _report_debris(record: RunRecord, log: RunLog) -> RunRecord:
    """Log each piece of debris not yet reported as one incident note; best effort."""
    notes = []
    for d in _unreported(record, log):
        try:
            notes.append(log.append_entry(
                LogDebrisNote(name=d.name, kind=d.kind, detail=d.detail),
                generation=UNFENCED, holder=""))
        except StorageError:
            break  # a read-only run directory: the next reader that may write reports it
    if not notes:
        return record
    return continue_fold(record, log.read(since_slot=record.last_slot + 1), skipped=log.skipped)
