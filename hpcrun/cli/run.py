"""``hpcrun submit | sbatch | cancel | signal | agent``: starting and stopping runs."""

from __future__ import annotations

import getpass
import os
import signal as _signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcrun.errors import HpcrunError, SchedulerError
from hpcrun.runner import SubprocessRunner

if TYPE_CHECKING:
    from hpcrun.launch.submission import SubmitContext

BACKENDS = ("slurm", "local")
VERIFY_DATA = ("all", "sample", "none")


def submit_context() -> SubmitContext:
    """This process's submission context (:mod:`hpcrun.launch.submission`), wired to the
    runtime's agent; notices and warnings are printed on stderr."""
    from hpcrun.launch.submission import SubmitContext
    from hpcrun.runtime.agent import agent_main
    from hpcrun.runtime.faults import parse_injections

    return SubmitContext.from_process(agent_entry=agent_main, check_faults=parse_injections,
                                      warn=_warn)


def _warn(line: str) -> None:
    click.echo(line, err=True)


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
    from hpcrun.launch.submission import SubmitRequest, dry_run_submission, submit_run

    req = SubmitRequest(spec_path=Path(spec_path), backend=backend, site=site_name,
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
        SubmitRequest(spec_path=Path(spec_path), backend="slurm", site=site_name,
                      runs_root=runs_root, verify_data=verify_data), submit_context())
    click.echo(script, nl=False)
    click.echo(f"hpcrun: created run {run_dir.name} at {run_dir}", err=True)


@click.command()
@click.argument("run")
def cancel(run: str) -> None:
    """Cancel RUN (an id, a unique prefix, a directory; or a sweep): fence it first (so running
    workers can no longer publish), then scancel its Slurm jobs, or stop its local launcher."""
    from hpcrun.clock import SYSTEM_CLOCK
    from hpcrun.control.cancel import cancel_run
    from hpcrun.launch.runref import RefKind, resolve_reference, run_backend
    from hpcrun.observe.postrun import post_run_publisher
    from hpcrun.scheduler.slurm import SlurmClient
    from hpcrun.vocab import Backend

    entry = resolve_reference(run, environ=os.environ)
    if entry.kind is RefKind.SWEEP:
        from hpcrun.cli.sweep import cancel_sweep

        cancel_sweep(entry.path)
        return
    run_dir = entry.path
    cancel_run(run_dir, slurm=SlurmClient(SubprocessRunner()), user=getpass.getuser(),
               on_end=post_run_publisher(clock=SYSTEM_CLOCK))  # scancels Slurm jobs only
    if run_backend(run_dir) is Backend.LOCAL:
        stop_local_launcher(run_dir)
    click.echo(f"{run_dir.name}: CANCELLED")


def stop_local_launcher(run_dir: Path) -> None:
    from hpcrun.launch.local import launcher_alive, read_launcher

    info = read_launcher(run_dir)
    if info is not None and launcher_alive(info):
        os.kill(int(info["pid"]), _signal.SIGTERM)


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
    from hpcrun.launch.runref import resolve_run_dir, run_backend
    from hpcrun.launch.site import load_site_snapshot
    from hpcrun.vocab import Backend

    run_dir = resolve_run_dir(run, environ=os.environ)
    backend = run_backend(run_dir)
    if crash_node is not None:
        if backend is not Backend.LOCAL:
            raise SchedulerError(f"--crash-node emulates a node loss on the local backend; run "
                                 f"{run_dir.name} runs on {backend}: use `hpcrun testbed crash`")
        _crash_local_node(run_dir, crash_node)
        return
    name = (signame or load_site_snapshot(run_dir).preempt_signal).removeprefix("SIG")
    if backend is Backend.LOCAL:
        _signal_local(run_dir, name)
    else:
        _signal_slurm(run_dir, name)


def _signal_local(run_dir: Path, name: str) -> None:
    from hpcrun.control.record import read_record
    from hpcrun.launch.local import launcher_alive, read_launcher
    from hpcrun.launch.signals import signal_number

    info = read_launcher(run_dir)
    if info is None or not launcher_alive(info):
        raise SchedulerError(f"run {run_dir.name} runs on the local backend and its launcher is "
                             f"not running (the run is {read_record(run_dir).state}); there is "
                             "nothing to signal")
    os.kill(int(info["pid"]), signal_number(name))
    click.echo(f"sent SIG{name} to {run_dir.name} (local backend)")


def _signal_slurm(run_dir: Path, name: str) -> None:
    from hpcrun.control.record import read_record

    record = read_record(run_dir)
    jobs = record.slurm_job_ids()
    if not jobs:
        raise SchedulerError(f"run {run_dir.name} has no Slurm job to signal; it is "
                             f"{record.state}")
    SubprocessRunner().run(["scancel", f"--signal={name}", jobs[-1]]).check()
    click.echo(f"sent SIG{name} to job {jobs[-1]} steps")


def _crash_local_node(run_dir: Path, node: str) -> None:
    from hpcrun.launch.local import launcher_alive, read_agents, read_launcher
    from hpcrun.proctree import crash_process_tree

    info = read_launcher(run_dir)
    agents = read_agents(run_dir)
    if info is None or not launcher_alive(info) or node not in agents:
        raise SchedulerError(f"cannot crash node {node!r} of {run_dir.name}: expected a live "
                             f"local-backend run with that node, found nodes "
                             f"{sorted(agents) or 'none'}; on Slurm use `hpcrun testbed crash`")
    if node == next(iter(agents)):
        raise SchedulerError(f"{node} hosts the supervising agent; crash another node (the "
                             "local backend has no scheduler to notice a lost node 0)")
    crash_process_tree(agents[node])
    click.echo(f"crashed {node} of {run_dir.name} (local backend)")


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
    import time

    if install or uninstall:
        _schedule_watch(runs, install=install, every_min=every_min,
                        scron_options=scron_options)
        return

    while True:
        targets = _watch_targets(runs)
        failed = []
        for run_dir in targets:
            try:
                click.echo(_watch_one(run_dir, dry_run=dry_run))
            except HpcrunError as exc:  # one run's failure never stops the pass for the others
                failed.append(run_dir.name)
                click.echo(f"{run_dir.name}: reconcile failed: {exc}", err=True)
        if not dry_run:
            for line in _deliver_alerts(targets):
                click.echo(line)
        if interval is None:
            if failed:
                raise SchedulerError(f"the reconcile pass failed for {', '.join(failed)}; the "
                                     "next pass retries (see the lines above)")
            return
        time.sleep(interval)


_SCHEDULE_ENV = ("HPCRUN_RUNS", "HPCRUN_SITE", "HPCRUN_SITE_CONFIGS", "PYTHONPATH", "PATH",
                 "SLURM_CONF")
"""Variables the scheduled pass needs as they are here (it runs in a fresh batch job)."""


def _schedule_watch(runs: tuple[str, ...], *, install: bool, every_min: int,
                    scron_options: tuple[str, ...]) -> None:
    from hpcrun.control.schedule import chain_script, install_watch, uninstall_watch, watch_entry
    from hpcrun.launch.runref import primary_root

    runner = SubprocessRunner()
    root = primary_root(os.environ)
    chain = root / ".watch-job.sh"
    if not install:
        click.echo(uninstall_watch(runner=runner, chain=chain).detail)
        return
    root.mkdir(parents=True, exist_ok=True)  # the scheduled pass appends to its watch.log
    env = {k: os.environ[k] for k in _SCHEDULE_ENV if os.environ.get(k)}
    entry = watch_entry(argv=[sys.executable, "-m", "hpcrun.cli.main", "watch", *runs],
                        env=env, every_min=every_min, log_path=root / "watch.log",
                        scron_options=("--job-name=hpcrun-watch", "--time=5",
                                       *scron_options))
    argv = [sys.executable, "-m", "hpcrun.cli.main", "watch", *runs]
    script = chain_script(argv=argv, env=env, every_min=every_min, log_path=root / "watch.log",
                          script_path=chain, options=scron_options)
    result = install_watch(entry, runner=runner, chain=(chain, script), every_min=every_min)
    click.echo(f"{result.detail}:\n{result.entry}")


def _deliver_alerts(run_dirs: list[Path]) -> list[str]:
    """Evaluate the alert rules of each run and deliver new alerts to its site's sinks; a run
    or sink that fails is reported and left for the next pass."""
    from hpcrun.launch.runref import primary_root
    from hpcrun.observe.notify import deliver_alerts, run_alerts

    fired, senders, lines = [], {}, []
    for run_dir in run_dirs:
        try:
            senders[run_dir.name] = _alert_senders(run_dir)
            fired += run_alerts(run_dir)
        except (HpcrunError, OSError) as exc:
            lines.append(f"{run_dir.name}: alerts not evaluated: {exc}")
    if not any(senders.values()):
        return lines
    return lines + deliver_alerts(primary_root(os.environ), fired, senders=senders,
                                  runs=[d.name for d in run_dirs])


def _alert_senders(run_dir: Path) -> dict[str, Any]:
    import shutil

    from hpcrun.launch.site import load_site_snapshot
    from hpcrun.observe.notify import email_sender, webhook_sender

    sinks = load_site_snapshot(run_dir).alerts
    if sinks is None:
        return {}
    out: dict[str, Any] = {}
    if sinks.webhook:
        out["webhook"] = webhook_sender(sinks.webhook)
    if sinks.email and shutil.which("sendmail"):
        out["email"] = email_sender(sinks.email, runner=SubprocessRunner())
    return out


def _watch_targets(runs: tuple[str, ...]) -> list[Path]:
    from hpcrun.control.record import read_record
    from hpcrun.control.states import is_terminal
    from hpcrun.launch.runref import expand_runs, run_dirs

    if runs:
        return [d for r in runs for d in expand_runs(r, environ=os.environ)]
    return [d for d in run_dirs(os.environ) if not is_terminal(read_record(d).state)]


def _watch_one(run_dir: Path, *, dry_run: bool) -> str:
    from hpcrun.clock import SYSTEM_CLOCK
    from hpcrun.control.watch import watch_once
    from hpcrun.observe.postrun import post_run_publisher
    from hpcrun.scheduler.slurm import SlurmClient

    result = watch_once(run_dir, SlurmClient(SubprocessRunner()), SYSTEM_CLOCK, dry_run=dry_run,
                        on_end=post_run_publisher(clock=SYSTEM_CLOCK))
    return f"{run_dir.name}: {result.record.state}, {result.summary()}"


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
