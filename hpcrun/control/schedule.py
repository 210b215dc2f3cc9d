"""``hpcrun watch --install``: run the reconcile pass on a schedule without anyone logged in.

Many sites forbid cron on login nodes; Slurm (>= 20.11) has ``scrontab``, which runs a crontab
entry as a small batch job (``ScronParameters=enable`` in slurm.conf). :func:`install_watch`
adds hpcrun's entry to the user's scrontab, between marker lines so that a reinstall replaces it
and :func:`uninstall_watch` removes exactly it, leaving the user's other entries alone. Where
scrontab is missing or disabled (some distributions do not package it) but ``sbatch`` works, the
pass runs as a self-renewing batch job instead (:func:`chain_script`): each run first submits the
next one ``--begin=now+N`` (``--dependency=singleton``, so never two at once), then reconciles.
Without either, the crontab line is returned for the user's own crontab.

:func:`watch_entry`, :func:`with_entry` and :func:`without_entry` are pure; the two effectful
functions go through the injected runner.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.errors import SchedulerError
from hpcrun.runner import CommandRunner

__all__ = ["BEGIN", "CHAIN_JOB_NAME", "END", "InstallResult", "chain_script", "install_watch",
           "uninstall_watch", "watch_entry", "with_entry", "without_entry"]

CHAIN_JOB_NAME = "hpcrun-watch"
"""Name of the self-renewing batch job (``squeue --name=hpcrun-watch`` shows it)."""

BEGIN = "# >>> hpcrun watch (managed by `hpcrun watch --install`) >>>"
END = "# <<< hpcrun watch <<<"


@dataclass(frozen=True, kw_only=True, slots=True)
class InstallResult:
    """What :func:`install_watch` or :func:`uninstall_watch` did."""

    scheduler: str
    """``scrontab``, or ``crontab`` when scrontab was not available (nothing was installed)."""
    entry: str
    """The entry (installed, removed, or for the user to add to their crontab)."""
    detail: str
    """One line for people."""


def watch_entry(*, argv: Sequence[str], env: Mapping[str, str], every_min: int,
                log_path: Path, scron_options: Sequence[str] = ()) -> str:
    """The crontab entry running ``argv`` every ``every_min`` minutes (pure).

    ``scron_options`` become a ``#SCRON`` line (scrontab's sbatch options for the job).
    """
    if not 1 <= every_min <= 59:
        raise SchedulerError(f"watch interval {every_min} min: expected 1..59 minutes")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    command = " ".join(shlex.quote(a) for a in argv)
    line = (f"*/{every_min} * * * * {exports + ' ' if exports else ''}{command} "
            f">> {shlex.quote(str(log_path))} 2>&1")
    scron = [f"#SCRON {' '.join(scron_options)}"] if scron_options else []
    return "\n".join([BEGIN, *scron, line, END])


def chain_script(*, argv: Sequence[str], env: Mapping[str, str], every_min: int,
                 log_path: Path, script_path: Path, options: Sequence[str] = ()) -> str:
    """The batch script of the self-renewing pass (pure): resubmit itself, then reconcile."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    flags = "".join(f"#SBATCH {o}\n" for o in (
        f"--job-name={CHAIN_JOB_NAME}", "--time=5", "--nodes=1", "--ntasks=1",
        f"--output={log_path}", "--open-mode=append", *options))
    script = shlex.quote(str(script_path))
    return (f"#!/bin/bash\n{BEGIN}\n{flags}{exports}"
            f"# The next pass first: this one may fail, the schedule must not. Removing the\n"
            f"# script (hpcrun watch --uninstall) ends the chain.\n"
            f"[ -f {script} ] && sbatch --begin=now+{every_min}minutes "
            f"--dependency=singleton {script}\n"
            f"{' '.join(shlex.quote(a) for a in argv)}\n{END}\n")


def without_entry(table: str) -> str:
    """``table`` with hpcrun's block removed (pure)."""
    out, inside = [], False
    for line in table.splitlines():
        if line == BEGIN:
            inside = True
        elif line == END and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(f"{line}\n" for line in out)


def with_entry(table: str, entry: str) -> str:
    """``table`` with hpcrun's block replaced by ``entry`` (pure)."""
    return without_entry(table) + entry + "\n"


def _current_scrontab(runner: CommandRunner) -> str | None:
    """The user's scrontab, "" when empty; None when scrontab is missing or disabled."""
    try:
        result = runner.run(["scrontab", "-l"], timeout=30)
    except (SchedulerError, OSError):
        return None  # not installed
    if result.returncode == 0:
        return result.stdout
    if "no crontab" in (result.stdout + result.stderr).lower():
        return ""
    return None  # disabled on this cluster (or another refusal): fall back to crontab


def _write_scrontab(runner: CommandRunner, table: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".scrontab", delete=False) as f:
        f.write(table)
    try:
        result = runner.run(["scrontab", f.name], timeout=30)
    finally:
        os.unlink(f.name)
    if result.returncode != 0:
        raise SchedulerError(f"scrontab refused the table: {result.stderr.strip()[:300]}; "
                             "check `scrontab -l` and the #SCRON options")


def install_watch(entry: str, *, runner: CommandRunner, chain: tuple[Path, str] | None = None,
                  every_min: int = 5) -> InstallResult:
    """Put ``entry`` into the user's scrontab (replacing an earlier one); without scrontab,
    start the self-renewing job ``chain`` = (script path, :func:`chain_script` text) when
    ``sbatch`` works; else return the crontab line."""
    table = _current_scrontab(runner)
    if table is None and chain is not None:
        started = _start_chain(runner, *chain, every_min=every_min)
        if started is not None:
            return started
    if table is None:
        return InstallResult(scheduler="crontab", entry=entry, detail=(
            "scrontab is not available here (Slurm < 20.11, or ScronParameters=enable is not "
            "set); nothing installed. Add these lines with `crontab -e` where cron is allowed"))
    _write_scrontab(runner, with_entry(table, entry))
    return InstallResult(scheduler="scrontab", entry=entry,
                         detail="installed in your scrontab (`scrontab -l` shows it)")


def _start_chain(runner: CommandRunner, script_path: Path, text: str, *,
                 every_min: int) -> InstallResult | None:
    """Write the chain's script and submit its first job; None when sbatch does not work."""
    _stop_chain(runner, script_path)
    script_path.write_text(text)
    try:
        result = runner.run(["sbatch", "--parsable", f"--begin=now+{every_min}minutes",
                             "--dependency=singleton", str(script_path)], timeout=60)
    except (SchedulerError, OSError):
        result = None
    if result is None or result.returncode != 0:
        script_path.unlink(missing_ok=True)
        return None
    return InstallResult(scheduler="sbatch", entry=text, detail=(
        f"scrontab is not available here; scheduled as a self-renewing batch job "
        f"{CHAIN_JOB_NAME} (job {result.stdout.strip().split(';')[0]}, script {script_path})"))


def _stop_chain(runner: CommandRunner, script_path: Path) -> bool:
    """End the self-renewing job: its script first (no more resubmits), then its jobs."""
    had = script_path.exists()
    script_path.unlink(missing_ok=True)
    with contextlib.suppress(SchedulerError, OSError):  # no Slurm client: nothing submitted
        runner.run(["scancel", f"--name={CHAIN_JOB_NAME}", "--state=PENDING"], timeout=60)
    return had


def uninstall_watch(*, runner: CommandRunner, chain: Path | None = None) -> InstallResult:
    """Remove hpcrun's entry from the user's scrontab (a no-op when there is none), and end
    the self-renewing job whose script is ``chain``."""
    if chain is not None and _stop_chain(runner, chain):
        return InstallResult(scheduler="sbatch", entry="", detail=(
            f"removed the self-renewing batch job {CHAIN_JOB_NAME} ({chain})"))
    table = _current_scrontab(runner)
    if table is None:
        return InstallResult(scheduler="crontab", entry="", detail=(
            "scrontab is not available here; remove the hpcrun watch lines with `crontab -e`"))
    if BEGIN not in table.splitlines():
        return InstallResult(scheduler="scrontab", entry="",
                             detail="your scrontab has no hpcrun watch entry")
    _write_scrontab(runner, without_entry(table))
    return InstallResult(scheduler="scrontab", entry="",
                         detail="removed hpcrun watch from your scrontab")
