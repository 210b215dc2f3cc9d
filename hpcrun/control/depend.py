"""Dependencies between runs: ``hpcrun submit eval.yaml --after RUN[:ok|any]`` (pure).

A dependent run's allocation waits in Slurm's queue (``--dependency=afterok:JOB`` or
``afterany``) until its upstream runs end. :func:`parse_after` reads the command-line form,
:func:`plan_dependency` turns the upstream records into the flag (or refuses what can never be
satisfied, before anything is submitted), and :func:`never_satisfied` is what a reconcile pass
reads when Slurm reports ``DependencyNeverSatisfied``: the run ends CANCELLED with the reason
instead of sitting in the queue forever.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from hpcrun.errors import SpecError
from hpcrun.vocab import RunState

if TYPE_CHECKING:
    from hpcrun.control.record import RunRecord

NEVER_SATISFIED = "DependencyNeverSatisfied"
"""Slurm's pending reason for a job whose dependency can no longer be met."""

_AFTER_RE = re.compile(r"^(?P<run>[^:\s]+)(?::(?P<kind>[a-z]+))?$")


class AfterKind(StrEnum):
    """What the upstream run must do before the dependent one may start."""

    OK = "ok"    # succeed (``afterok``)
    ANY = "any"  # end, whatever its state (``afterany``)


@dataclass(frozen=True, kw_only=True, slots=True)
class After:
    """One ``--after`` argument."""

    run: str
    """Upstream run id, run directory or sweep id."""
    kind: AfterKind = AfterKind.OK
    """ok or any."""

    def __str__(self) -> str:
        return f"{self.run}:{self.kind.value}"


def parse_after(text: str) -> After:
    """``RUN``, ``RUN:ok`` or ``RUN:any``.

    Raises:
        SpecError: another form.
    """
    m = _AFTER_RE.match(text.strip())
    kinds = [k.value for k in AfterKind]
    if m is None or (m.group("kind") is not None and m.group("kind") not in kinds):
        raise SpecError(f"--after {text!r}: expected RUN, RUN:ok or RUN:any (a run id, run "
                        "directory or sweep id); e.g. --after train-20260101-120000-ab12:ok")
    return After(run=m.group("run"), kind=AfterKind(m.group("kind") or AfterKind.OK.value))


@dataclass(frozen=True, kw_only=True, slots=True)
class Upstream:
    """An ``--after`` target resolved to its runs' records."""

    after: After
    """What the user asked for."""
    records: tuple[RunRecord, ...]
    """The upstream run's record (one), or every point's of a sweep."""


def _kind_ok(record: RunRecord, kind: AfterKind) -> bool | None:
    """Whether ``record`` already satisfies ``kind`` (True), never can (False), or may (None)."""
    if record.state == RunState.SUCCEEDED or (kind == AfterKind.ANY
                                              and record.state in _TERMINAL):
        return True
    if record.state in _TERMINAL:
        return False
    return None


_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


def plan_dependency(upstreams: Sequence[Upstream]) -> str | None:
    """The ``--dependency`` value for ``upstreams`` (None when every one is already met).

    Raises:
        SpecError: an upstream already ended so that the dependency can never be met, or has
            no Slurm job to wait for.
    """
    parts: list[str] = []
    for up in upstreams:
        for rec in up.records:
            ok = _kind_ok(rec, up.after.kind)
            if ok is False:
                raise SpecError(
                    f"--after {up.after}: run {rec.run_id} already ended {rec.state.value}, so "
                    f"after{up.after.kind.value} can never be satisfied; nothing was submitted. "
                    f"Use --after {up.after.run}:any to run after it whatever its end")
            if ok:
                continue
            jobs = rec.slurm_job_ids()
            if not jobs:
                raise SpecError(
                    f"--after {up.after}: run {rec.run_id} has no Slurm job to wait for (it "
                    "runs on the local backend or was never submitted); nothing was submitted")
            parts.append(f"after{up.after.kind.value}:{jobs[-1]}")
    return ",".join(parts) or None


def never_satisfied(reason: str) -> bool:
    """Whether a pending job's reason says its dependency can never be met."""
    return NEVER_SATISFIED in reason


def never_satisfied_reason(job_id: str, after: Sequence[str]) -> str:
    """The CANCELLED state's reason for a dependent run whose upstream can never satisfy it."""
    upstream = ", ".join(after) or "its upstream run"
    return (f"{NEVER_SATISFIED}: job {job_id} waits for {upstream}, which ended so that the "
            "dependency can never be met; the run is cancelled instead of waiting in the queue")


def broken_dependency(after: Sequence[str], states: Sequence[RunState | None]) -> str | None:
    """Why a dependent run can never start, from how its upstream runs stand (``states`` in the
    order of ``after``; None for one that cannot be read), or None while it may.

    Slurm's own ``afterok`` cannot tell a run hpcrun ended FAILED from one that succeeded when
    the job itself completed, so the run's first start checks the record as well.
    """
    for name, state in zip(after, states, strict=True):
        kind = name.rsplit(":", 1)[-1]
        if state is None:
            return (f"{NEVER_SATISFIED}: upstream {name} has no readable record; the run is "
                    "cancelled instead of starting without it")
        if kind == AfterKind.OK and state in _TERMINAL and state != RunState.SUCCEEDED:
            return (f"{NEVER_SATISFIED}: upstream {name} ended {state.value}, so the "
                    "dependency can never be met; the run is cancelled")
    return None
