"""A dependent run's first start: cancel it when an upstream run did not end as required.

``hpcrun submit --after RUN:ok`` makes Slurm hold the job until RUN's job completes; but a run
hpcrun ended FAILED can still leave a job Slurm counts as completed. So the supervising agent
reads the upstream records once, right after its fence (:func:`cancel_if_upstream_broken`),
and ends the run CANCELLED with the reason (``DependencyNeverSatisfied``) instead of training
on a missing input.
"""

from __future__ import annotations

from pathlib import Path

from hpcrun.control.depend import broken_dependency
from hpcrun.control.entries import ResultPayload, StatePayload
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from hpcrun.errors import HpcrunError
from hpcrun.vocab import RunState


def _state_of(run_dir: str) -> RunState | None:
    try:
        return read_record(Path(run_dir), write_snapshot=False).state
    except HpcrunError:
        return None


def cancel_if_upstream_broken(run_dir: Path, log: RunLog, *, generation: int,
                              holder: str) -> bool:
    """Publish CANCELLED (and its result) when an upstream run can never satisfy this run's
    dependency; return whether it did."""
    record = read_record(run_dir)
    if not record.after or record.state != RunState.PENDING:
        return False
    dirs = record.after_dirs if len(record.after_dirs) == len(record.after) else ()
    if not dirs:
        return False  # written without directories: Slurm's dependency is all there is
    reason = broken_dependency(record.after, [_state_of(d) for d in dirs])
    if reason is None:
        return False
    log.publish_entry(StatePayload(state=RunState.CANCELLED, reason=reason),
                      generation=generation, holder=holder)
    log.publish_entry(ResultPayload(state=RunState.CANCELLED, reason=reason),
                      generation=generation, holder=holder)
    return True
