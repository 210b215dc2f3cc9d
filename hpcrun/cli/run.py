"""``hpcrun submit | sbatch | cancel | signal | agent``: starting and stopping runs."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import click

from hpcrun.cli.common import BACKENDS, VERIFY_DATA, submit_context
from hpcrun.errors import SchedulerError
from hpcrun.runner import SubprocessRunner
from hpcrun.vocab import Backend


@click.command()
@click.argument("spec_path", metavar="RUN_YAML", type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Where to run. Default: the site's backend; local when sbatch is absent.")
@click.option("--site", "site_name", default=None, help="Site config name or path.")
@click.option("--runs-root", default=None, help="Create the run directory here.")
@click.option("--dry-run", is_flag=True,
              help="Run every admission check and print what would be submitted; create nothing.")
@click.option("--verify-data", type=click.Choice(VERIFY_DATA), default="sample", show_default=True,
              help="Data objects hashed in full before submitting: all, a bounded "
                   "deterministic sample, or none (every object is still checked present).")
@click.option("--wait", is_flag=True, help="Local backend: wait for the run to end.")
@click.option("--inject", default=None, metavar="FAULTS",
              help="Scheduled faults for drills, e.g. 'preempt@step=50;crash@step=80,rank=1'.")
@click.option("--after", "after", multiple=True, metavar="RUN_OR_SWEEP[:ok|any]",
              help="Start only after RUN (or every point of SWEEP) succeeded (:ok, the default) "
                   "or ended (:any); repeatable. Slurm backend.")
def submit(spec_path: str, backend: str | None, site_name: str | None, runs_root: str | None,
           dry_run: bool, verify_data: str, wait: bool, inject: str | None,
           after: tuple[str, ...]) -> None:
    """Freeze RUN_YAML into an immutable run, create its record, and start the gang.

    \b
    First every admission check runs (spec, site config, entrypoint importable, data manifest
    and objects, storage writable, Slurm partition/account/QoS); any problem refuses the run
    before anything is created, listing every problem found (docs/recovery.md).
    On Slurm the gang is one sbatch allocation (through submitit) running one hpcrun agent per
    node; on the local backend the same agents run as local processes. Prints the run id.
    """
    from hpcrun.launch.admit import parse_backend
    from hpcrun.launch.submission import SubmitRequest, dry_run_submission, submit_run

    req = SubmitRequest(spec_path=Path(spec_path), backend=parse_backend(backend), site=site_name,
                        runs_root=runs_root, verify_data=verify_data, inject=inject, after=after)
    if dry_run:
        plan = dry_run_submission(req, submit_context())
        click.echo(plan.report, err=True)
        click.echo(plan.plan)
        if plan.wait_flag:
            click.echo(f"would wait: --dependency={plan.wait_flag}")
        return
    done = submit_run(req, submit_context())
    if done.local is not None:
        click.echo(done.run_dir.name)
        if wait:
            sys.exit(_wait_local(done.local, done.run_dir))
        return
    click.echo(f"{done.run_dir.name} (slurm job {done.job_id})")


def _wait_local(proc: subprocess.Popen[bytes], run_dir: Path) -> int:
    """Wait for the local launcher; print the run's end in the words status uses."""
    rc = proc.wait()
    from hpcrun.observe.collect import collect_status
    from hpcrun.observe.status import progress_text

    view = collect_status(run_dir).view
    click.echo(f"{run_dir.name}: {view.facts.state}, {progress_text(view, live=False)} "
               f"(generation {view.facts.generation})")
    return rc


@click.command()
@click.argument("spec_path", metavar="RUN_YAML", type=click.Path(dir_okay=False))
@click.option("--site", "site_name", default=None, help="Site config name or path.")
@click.option("--runs-root", default=None, help="Create the run directory here.")
@click.option("--verify-data", type=click.Choice(VERIFY_DATA), default="sample", show_default=True,
              help="Data objects hashed in full before the run is created (as for submit).")
def sbatch(spec_path: str, site_name: str | None, runs_root: str | None,
           verify_data: str) -> None:
    """Create the run record and print a job script for plain `sbatch`.

    \b
      hpcrun sbatch run.yaml > job.sh && sbatch job.sh
    The script starts the same per-node agents as `hpcrun submit`, after the same admission
    checks.
    """
    from hpcrun.launch.submission import SubmitRequest, create_script_run

    run_dir, script = create_script_run(
        SubmitRequest(spec_path=Path(spec_path), backend=Backend.SLURM, site=site_name,
                      runs_root=runs_root, verify_data=verify_data), submit_context())
    click.echo(script, nl=False)
    click.echo(f"hpcrun: created run {run_dir.name} at {run_dir}", err=True)


@click.command()
@click.argument("run")
def cancel(run: str) -> None:
    """Cancel RUN (an id, a unique prefix, a directory; or a sweep): fence it first (so running
    workers can no longer publish), then scancel its Slurm jobs, or stop its local launcher."""
    from hpcrun.clock import SYSTEM_CLOCK
    from hpcrun.launch.runcontrol import cancel_run_dir, cancel_sweep
    from hpcrun.launch.runref import RefKind, resolve_reference
    from hpcrun.observe.postrun import post_run_publisher
    from hpcrun.scheduler.slurm import SlurmClient

    entry = resolve_reference(run, environ=os.environ)
    slurm = SlurmClient(SubprocessRunner())
    if entry.kind is RefKind.SWEEP:
        for line in cancel_sweep(entry.path, slurm=slurm, user=getpass.getuser()):
            click.echo(line)
        return
    click.echo(cancel_run_dir(entry.path, slurm=slurm, user=getpass.getuser(),
                              on_end=post_run_publisher(clock=SYSTEM_CLOCK)))


@click.command("signal")
@click.argument("run")
@click.option("--signal", "signame", default=None,
              help="Signal to send (default: the site's preemption signal).")
@click.option("--crash-node", default=None, metavar="NODE",
              help="Local backend: emulate power loss of NODE (SIGKILL its agent and ranks).")
def signal_cmd(run: str, signame: str | None, crash_node: str | None) -> None:
    """Deliver the preemption signal to RUN's agents, as Slurm does before a preemption.

    The run's own backend delivers it: `scancel --signal` to its Slurm job's steps, or the
    local launcher, which relays it to the run's local agents.
    """
    from hpcrun.launch.runcontrol import crash_local_node, signal_run
    from hpcrun.launch.runref import resolve_run_dir
    from hpcrun.launch.site import load_site_snapshot

    run_dir = resolve_run_dir(run, environ=os.environ)
    if crash_node is not None:
        click.echo(crash_local_node(run_dir, crash_node))
        return
    name = (signame or load_site_snapshot(run_dir).preempt_signal).removeprefix("SIG")
    click.echo(signal_run(run_dir, name, runner=SubprocessRunner()))


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--interval", type=float, default=None,
              help="Repeat every INTERVAL seconds (default: one pass, for cron).")
@click.option("--dry-run", is_flag=True, help="Plan the actions but send nothing.")
@click.option("--install", is_flag=True,
              help="Schedule this pass every --every minutes with scrontab (else print the "
                   "crontab line).")
@click.option("--uninstall", is_flag=True, help="Remove the scheduled pass from scrontab.")
@click.option("--every", "every_min", type=int, default=5, show_default=True,
              help="Minutes between scheduled passes (with --install).")
@click.option("--scron-option", "scron_options", multiple=True,
              help="sbatch option for the scheduled job (#SCRON line), e.g. -p=batch.")
def watch(runs: tuple[str, ...], interval: float | None, dry_run: bool, install: bool,
          uninstall: bool, every_min: int, scron_options: tuple[str, ...]) -> None:
    """Reconcile runs with Slurm from the login node: one bounded pass per run.

    \b
    Finds jobs that vanished, were held, failed or hung while their record says otherwise, and
    acts (requeue with backoff, resubmit, mark failed), logging each action's operation id before
    sending it so a pass that crashed half-way is never repeated. Lock-free and idempotent:
    safe under cron, e.g. `*/5 * * * * hpcrun watch`. Without RUNS, every unfinished run.
    New alerts of those runs go to the site's alert sinks. `--install` schedules the pass with
    Slurm's scrontab where the site enables it (no cron needed), else prints the crontab line.
    """
    if install or uninstall:
        _schedule_watch(runs, install=install, every_min=every_min,
                        scron_options=scron_options)
        return
    _watch_loop(runs, interval=interval, dry_run=dry_run)


def _watch_loop(runs: tuple[str, ...], *, interval: float | None, dry_run: bool) -> None:
    """Run passes (one, or one every ``interval`` s); each pass's alerts are delivered in the
    background, so a slow sink never delays the next pass (a round still sending is not
    doubled: the next pass after it ends delivers what it left)."""
    import time

    from hpcrun.clock import SYSTEM_CLOCK
    from hpcrun.launch.runref import primary_root, watch_targets
    from hpcrun.launch.site import load_site_snapshot
    from hpcrun.observe.watchpass import AlertRound, reconcile_runs, start_alert_round
    from hpcrun.scheduler.slurm import SlurmClient

    alerts: AlertRound | None = None
    while True:
        targets = watch_targets(runs, environ=os.environ)
        report = reconcile_runs(targets, slurm=SlurmClient(SubprocessRunner()),
                                clock=SYSTEM_CLOCK, dry_run=dry_run)
        for line in report.lines:
            click.echo(line.text, err=line.failed)
        if not dry_run and (alerts is None or alerts.done.is_set()):
            alerts = start_alert_round(targets, runs_root=primary_root(os.environ),
                                       sinks_of=lambda d: load_site_snapshot(d).alerts,
                                       runner=SubprocessRunner(), emit=click.echo)
        if interval is None:
            if alerts is not None:
                alerts.wait()  # bounded: the round's deadline and the state lock's timeout
            if report.failed:
                raise SchedulerError(f"the reconcile pass failed for "
                                     f"{', '.join(report.failed)}; the next pass retries "
                                     "(see the lines above)")
            return
        time.sleep(interval)


def _schedule_watch(runs: tuple[str, ...], *, install: bool, every_min: int,
                    scron_options: tuple[str, ...]) -> None:
    from hpcrun.launch.watch_schedule import install_watch_pass, uninstall_watch_pass

    if not install:
        click.echo(uninstall_watch_pass(environ=os.environ, runner=SubprocessRunner()).detail)
        return
    result = install_watch_pass(runs, environ=os.environ, runner=SubprocessRunner(),
                                every_min=every_min, scron_options=scron_options)
    click.echo(f"{result.detail}:\n{result.entry}")


@click.command()
@click.argument("run")
@click.option("--yes", is_flag=True, help="Move without asking.")
def doctor(run: str, yes: bool) -> None:
    """List debris in RUN's log (files that are not well-formed entries) and move it aside.

    \b
    Debris never blocks the run: readers skip it and new entries go past it, and `hpcrun
    status` names it. This moves it into RUN_DIR/debris/ (nothing is deleted), after asking.
    """
    from hpcrun.control.doctor import DEBRIS_DIR, find_debris, move_debris
    from hpcrun.launch.runref import resolve_run_dir

    run_dir = resolve_run_dir(run, environ=os.environ)
    debris = find_debris(run_dir)
    if not debris:
        click.echo(f"{run_dir.name}: the log holds no debris")
        return
    click.echo(f"{run_dir.name}: {len(debris)} file(s) in log/ are not entries of the log:")
    for d in debris:
        click.echo(f"  {d.describe()}")
    if not yes and not click.confirm(f"move them into {run_dir / DEBRIS_DIR}/?", default=False):
        click.echo("nothing moved")
        return
    for m in move_debris(run_dir, debris):
        click.echo(f"moved log/{m.debris.name} -> {m.to}")


@click.command(hidden=True)
@click.option("--run-dir", required=True, type=click.Path(file_okay=False))
def agent(run_dir: str) -> None:
    """Run this node's agent (started by the job script; not for interactive use)."""
    from hpcrun.runtime.agent import agent_main

    sys.exit(agent_main(run_dir))


COMMANDS = (submit, sbatch, cancel, signal_cmd, watch, doctor, agent)
