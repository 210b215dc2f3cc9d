"""One ``hpcrun watch`` pass: reconcile each run with Slurm, then deliver its new alerts.

1. **Reconcile.** :func:`reconcile_runs` runs :func:`hpcrun.control.watch.watch_once` on each
   run, publishing the post-run manifest when a pass ends one; a run whose pass fails is
   reported and never stops the others.
2. **Alerts, off the reconcile path.** :func:`start_alert_round` evaluates the alert rules of
   the same runs and delivers new alerts to each run's site sinks in a thread of its own, so a
   slow sink never delays the next pass's reconcile. Inside the round every delivery has its own
   thread and all of them together one :data:`~hpcrun.observe.notify.DELIVERY_DEADLINE_S`
   (:func:`hpcrun.observe.notify.deliver_alerts`).

The sinks of a run come from ``sinks_of`` (the caller reads them from the run's site snapshot),
so this plane needs nothing of the launch plane.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcrun.clock import Clock
from hpcrun.control.watch import watch_once
from hpcrun.errors import HpcrunError
from hpcrun.observe.notify import (
    DELIVERY_DEADLINE_S,
    FiredAlert,
    Sender,
    deliver_alerts,
    email_sender,
    run_alerts,
    webhook_sender,
)
from hpcrun.observe.postrun import post_run_publisher
from hpcrun.runner import CommandRunner
from hpcrun.scheduler.slurm import SlurmClient

__all__ = ["AlertRound", "ReconcileReport", "RunLine", "SinkSettings", "alert_senders",
           "reconcile_runs", "start_alert_round"]

_LOG = logging.getLogger(__name__)


class SinkSettings(Protocol):
    """Where a run's alerts go: a site's ``alerts:``
    (:class:`hpcrun.launch.alertsinks.AlertSinks`)."""

    @property
    def webhook(self) -> str | None: ...

    @property
    def email(self) -> tuple[str, ...]: ...


SinksOf = Callable[[Path], SinkSettings | None]
"""The alert sinks of a run (None: its alerts are only shown by status)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunLine:
    """One run's line of a reconcile pass."""

    run_id: str
    """The run."""
    text: str
    """Its state and what the pass did, or why the pass failed for it."""
    failed: bool = False
    """The pass failed for this run (left for the next pass)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileReport:
    """What a reconcile pass did, run by run."""

    lines: tuple[RunLine, ...]
    """One line per run, in the order reconciled."""

    @property
    def failed(self) -> tuple[str, ...]:
        """The ids of the runs whose pass failed."""
        return tuple(ln.run_id for ln in self.lines if ln.failed)


def reconcile_runs(run_dirs: Sequence[Path], *, slurm: SlurmClient, clock: Clock,
                   dry_run: bool) -> ReconcileReport:
    """Reconcile each run once; one run's failure never stops the pass for the others."""
    lines = []
    on_end = post_run_publisher(clock=clock)
    for run_dir in run_dirs:
        try:
            result = watch_once(run_dir, slurm, clock, dry_run=dry_run, on_end=on_end)
        except HpcrunError as exc:
            lines.append(RunLine(run_id=run_dir.name, failed=True,
                                 text=f"{run_dir.name}: reconcile failed: {exc}"))
            continue
        lines.append(RunLine(run_id=run_dir.name,
                             text=f"{run_dir.name}: {result.record.state}, {result.summary()}"))
    return ReconcileReport(lines=tuple(lines))


def alert_senders(sinks: SinkSettings | None, *, runner: CommandRunner,
                  deadline_s: float = DELIVERY_DEADLINE_S) -> dict[str, Sender]:
    """The senders of a run's sinks: the webhook, and email where ``sendmail`` is present."""
    if sinks is None:
        return {}
    out: dict[str, Sender] = {}
    if sinks.webhook:
        out["webhook"] = webhook_sender(sinks.webhook, timeout_s=deadline_s)
    if sinks.email and shutil.which("sendmail"):
        out["email"] = email_sender(sinks.email, runner=runner)
    return out


@dataclass(kw_only=True, slots=True)
class AlertRound:
    """A pass's alert evaluation and delivery, running in its own thread."""

    lines: list[str] = field(default_factory=list)
    """One line per run not evaluated and per delivery outcome, once :attr:`done` is set."""
    done: threading.Event = field(default_factory=threading.Event)
    """Set when every delivery has ended or the round's deadline has passed."""

    def wait(self, timeout: float | None = None) -> list[str] | None:
        """The round's lines once it ended, or None if it is still running after ``timeout``."""
        return list(self.lines) if self.done.wait(timeout) else None


def start_alert_round(run_dirs: Sequence[Path], *, runs_root: Path, sinks_of: SinksOf,
                      runner: CommandRunner, deadline_s: float = DELIVERY_DEADLINE_S,
                      emit: Callable[[str], None] | None = None) -> AlertRound:
    """Start evaluating the runs' alert rules and delivering new alerts to their sinks.

    Returns at once; the round ends within ``deadline_s`` of its sends starting (plus the wait
    for another pass's state lock). ``emit``, if given, gets each line from the round's thread
    before :attr:`AlertRound.done` is set. A run or sink that fails is reported and left for
    the next pass.
    """
    round_ = AlertRound()
    threading.Thread(target=_run_round, name="hpcrun-alert-round", daemon=True,
                     args=(round_, list(run_dirs), runs_root, sinks_of, runner, deadline_s,
                           emit)).start()
    return round_


def _run_round(round_: AlertRound, run_dirs: list[Path], runs_root: Path, sinks_of: SinksOf,
               runner: CommandRunner, deadline_s: float,
               emit: Callable[[str], None] | None) -> None:
    try:
        round_.lines.extend(_deliver(run_dirs, runs_root, sinks_of, runner, deadline_s))
    except Exception as exc:  # never lost silently: the next pass evaluates them again
        _LOG.exception("alert round failed")
        round_.lines.append(f"alerts not delivered: {exc}; the next pass retries")
    try:
        if emit is not None:
            for line in round_.lines:
                emit(line)
    finally:  # after the lines are out, so a caller waiting on it prints nothing twice
        round_.done.set()


def _deliver(run_dirs: list[Path], runs_root: Path, sinks_of: SinksOf, runner: CommandRunner,
             deadline_s: float) -> list[str]:
    fired: list[FiredAlert] = []
    senders: dict[str, dict[str, Sender]] = {}
    lines: list[str] = []
    for run_dir in run_dirs:
        try:
            senders[run_dir.name] = alert_senders(sinks_of(run_dir), runner=runner,
                                                  deadline_s=deadline_s)
            fired += run_alerts(run_dir)
        except (HpcrunError, OSError) as exc:
            lines.append(f"{run_dir.name}: alerts not evaluated: {exc}")
    if not any(senders.values()):
        return lines
    return lines + deliver_alerts(runs_root, fired, senders=senders,
                                  runs=[d.name for d in run_dirs], deadline_s=deadline_s)
