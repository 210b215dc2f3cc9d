"""Cancel a run: fence first, then record CANCELLED, then scancel its jobs.

The fence comes first so that whatever the running workers write afterwards (progress, commits,
results) is void by log order, even if scancel is slow or fails. Every step is idempotent: a
second cancel finds the run CANCELLED, claims nothing, and only retries the scancels that are not
yet recorded as done.
"""

from __future__ import annotations

import hashlib
import os
import pwd
from dataclasses import dataclass, replace
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.ending import EndPublisher, publish_ending
from hpcrun.control.entries import ActionKind, OpPayload, OpPhase, StatePayload
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog, new_holder
from hpcrun.control.record import RunRecord, load_run_spec, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.control.states import RunState, is_terminal
from hpcrun.errors import PermissionDeniedError, SchedulerError, StaleGenerationError
from hpcrun.scheduler.slurm import SlurmClient
from hpcrun.storage import LOCAL_STORAGE, Storage

CLAIM_TRIES = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelResult:
    """What :func:`cancel_run` did."""

    run_id: str
    """The run."""
    state: RunState
    """Run state afterwards."""
    fenced_generation: int | None
    """Generation the cancel claimed (None when the run was already terminal)."""
    cancelled_jobs: tuple[str, ...]
    """Job ids scancel acted on in this call."""


def _owner(record: RunRecord, run_dir: Path) -> str:
    if record.owner:
        return record.owner
    try:  # runs created without a creation note: the directory's owner
        return pwd.getpwuid(os.stat(run_dir).st_uid).pw_name
    except (KeyError, OSError):
        return ""


def check_authority(spec: RunSpec, record: RunRecord, run_dir: Path, user: str) -> None:
    """Raise :class:`PermissionDeniedError` unless ``user`` owns the run or is listed."""
    owner = _owner(record, run_dir)
    if user == owner or user in spec.cancel_authority:
        return
    allowed = ", ".join([owner, *spec.cancel_authority]) or "nobody"
    raise PermissionDeniedError(
        f"{user!r} may not cancel run {record.run_id}: allowed are {allowed}; ask one of them, "
        "or list more users under cancel_authority in the spec of future runs")


def _fence_and_record(log: RunLog, user: str) -> tuple[int, str]:
    """Claim a generation, then publish CANCELLED under it; retry a lost race.

    Returns:
        The generation and holder the cancel fenced with.
    """
    for _ in range(CLAIM_TRIES):
        try:
            fence = log.claim(new_holder("cancel-"))
            log.publish_entry(StatePayload(state=RunState.CANCELLED,
                                           reason=f"cancelled by {user}"),
                              generation=fence.generation, holder=fence.holder)
            return fence.generation, fence.holder
        except StaleGenerationError:
            continue  # an incarnation fenced at the same moment: claim the next generation
    raise SchedulerError(f"could not fence run {log.run_dir.name} in {CLAIM_TRIES} tries: "
                         "incarnations keep claiming generations; run `hpcrun cancel` again")


def _cancel_op_id(run_id: str, job_id: str) -> str:
    return "cancel-" + hashlib.sha256(f"{run_id}|cancel|{job_id}".encode()).hexdigest()[:16]


def _scancel_all(log: RunLog, record: RunRecord, slurm: SlurmClient) -> tuple[str, ...]:
    done, errors = [], []
    for job_id in record.slurm_job_ids():  # the local backend stops its own gang
        op_id = _cancel_op_id(record.run_id, job_id)
        if record.op_done(op_id):
            continue
        op = OpPayload(op_id=op_id, action=ActionKind.CANCEL, job_id=job_id,
                       phase=OpPhase.INTENT)
        log.append_entry(op, generation=UNFENCED, holder="")
        try:
            known = slurm.scancel(job_id)
        except SchedulerError as exc:
            errors.append(str(exc))
            log.append_entry(replace(op, phase=OpPhase.FAILED, error=str(exc)),
                             generation=UNFENCED, holder="")
            continue
        log.append_entry(replace(op, phase=OpPhase.DONE, extra={"known": known}),
                         generation=UNFENCED, holder="")
        done.append(job_id)
    if errors:
        raise SchedulerError(f"run {record.run_id} is recorded CANCELLED but scancel failed: "
                             f"{'; '.join(errors)}; run `hpcrun cancel` again to retry")
    return tuple(done)


def cancel_run(run_dir: str | os.PathLike[str], *, slurm: SlurmClient, user: str,
               clock: Clock = SYSTEM_CLOCK, storage: Storage = LOCAL_STORAGE,
               on_end: EndPublisher | None = None) -> CancelResult:
    """Cancel a run: authority check, fence, CANCELLED entry, then scancel every job.

    ``on_end`` publishes the post-run manifest under the cancel's fence (see
    :mod:`hpcrun.control.ending`); it runs before the scancels, so the manifest exists even
    when one of them fails.

    Raises:
        PermissionDeniedError: ``user`` is neither the owner nor in ``cancel_authority``.
        SchedulerError: a scancel failed (the run is already CANCELLED; call again to retry).
    """
    run_dir = Path(run_dir)
    spec = load_run_spec(run_dir, storage=storage)
    record = read_record(run_dir, storage=storage, spec_id=spec.spec_id)
    check_authority(spec, record, run_dir, user)
    log = RunLog(run_dir, storage=storage, clock=clock)
    generation = None
    if not is_terminal(record.state):
        generation, holder = _fence_and_record(log, user)
        publish_ending(on_end, log, generation=generation, holder=holder)
    record = read_record(run_dir, storage=storage, spec_id=spec.spec_id)
    cancelled = _scancel_all(log, record, slurm)
    return CancelResult(run_id=record.run_id, state=record.state, fenced_generation=generation,
                        cancelled_jobs=cancelled)
