"""``hpcrun watch --install | --uninstall``: the reconcile pass put on (or taken off) a schedule
for the runs root this environment names.

The scheduled pass runs in a fresh batch job, so it gets the variables it needs as they are here
(:data:`SCHEDULE_ENV`) and this interpreter; it appends to ``watch.log`` in the primary runs root,
and the self-renewing job's script lives beside it. Scheduling itself (scrontab, the chained
batch job, or the crontab line) is :mod:`hpcrun.control.schedule`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcrun.control.schedule import (
    InstallResult,
    chain_script,
    install_watch,
    uninstall_watch,
    watch_entry,
)
from hpcrun.launch.runref import primary_root
from hpcrun.runner import CommandRunner

__all__ = ["SCHEDULE_ENV", "install_watch_pass", "uninstall_watch_pass"]

SCHEDULE_ENV = ("HPCRUN_RUNS", "HPCRUN_SITE", "HPCRUN_SITE_CONFIGS", "PYTHONPATH", "PATH",
                "SLURM_CONF")
"""Variables the scheduled pass needs as they are here (it runs in a fresh batch job)."""
CHAIN_SCRIPT = ".watch-job.sh"
"""The self-renewing job's script, in the primary runs root."""


def install_watch_pass(runs: Sequence[str], *, environ: Mapping[str, str],
                       runner: CommandRunner, every_min: int,
                       scron_options: Sequence[str] = ()) -> InstallResult:
    """Schedule ``hpcrun watch RUNS...`` every ``every_min`` minutes (scrontab, else a
    self-renewing batch job, else the crontab line is returned)."""
    root = primary_root(environ)
    root.mkdir(parents=True, exist_ok=True)  # the scheduled pass appends to its watch.log
    env = {k: environ[k] for k in SCHEDULE_ENV if environ.get(k)}
    argv = [sys.executable, "-m", "hpcrun.cli.main", "watch", *runs]
    entry = watch_entry(argv=argv, env=env, every_min=every_min, log_path=root / "watch.log",
                        scron_options=("--job-name=hpcrun-watch", "--time=5", *scron_options))
    chain = _chain_path(root)
    script = chain_script(argv=argv, env=env, every_min=every_min, log_path=root / "watch.log",
                          script_path=chain, options=scron_options)
    return install_watch(entry, runner=runner, chain=(chain, script), every_min=every_min)


def uninstall_watch_pass(*, environ: Mapping[str, str], runner: CommandRunner) -> InstallResult:
    """Take the scheduled pass off scrontab, or end its self-renewing batch job."""
    return uninstall_watch(runner=runner, chain=_chain_path(primary_root(environ)))


def _chain_path(root: Path) -> Path:
    return root / CHAIN_SCRIPT
