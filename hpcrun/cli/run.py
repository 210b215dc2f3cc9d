"""``hpcrun submit | sbatch | cancel | signal | agent``: starting and stopping runs."""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal as _signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from hpcrun.errors import HpcrunError, SchedulerError
from hpcrun.runner import SubprocessRunner

BACKENDS = ("slurm", "local")
VERIFY_DATA = ("all", "sample", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """A loaded spec and site that passed admission, and where the run will live."""

    spec: Any
    """The validated (not yet frozen) RunSpec."""
    site: Any
    """The SiteConfig."""
    backend: str
    """``slurm`` or ``local``."""
    runs_root: Path
    """Directory under which the run directory is created."""
    report: Any
    """The :class:`~hpcrun.launch.admission.AdmissionReport` it passed."""


def prepare_submission(spec_path: str, site_name: str | None, backend: str | None,
             runs_root: str | None, verify_data: str, *, inject: str | None = None,
             cwd: Path | None = None) -> Submission:
    """Run every admission check; raise :class:`AdmissionError` listing every problem found,
    before anything is created."""
    from hpcrun.launch.admission import VerifyData
    from hpcrun.launch.admit import AdmissionRequest, admit

    request = AdmissionRequest(
        spec_path=Path(spec_path), code_path=cwd or repo_root_of(Path.cwd()),
        python=sys.executable, user=getpass.getuser(), site=site_name, backend=backend,
        runs_root=runs_root, have_sbatch=shutil.which("sbatch") is not None,
        verify_data=VerifyData(verify_data))
    result = admit(request, environ=os.environ, runner=SubprocessRunner(),
                   extra=_inject_findings(inject))
    if result.notice:
        click.echo(result.notice, err=True)
    for skipped in result.report.skipped:
        click.echo(f"hpcrun: not checked: {skipped.line()}", err=True)
    if not result.report.ok or result.runs_root is None:
        raise result.report.refusal()
    return Submission(spec=result.spec, site=result.site, backend=result.backend,
                      runs_root=result.runs_root, report=result.report)


def _inject_findings(inject: str | None) -> list[Any]:
    if not inject:
        return []
    from hpcrun.errors import SpecError
    from hpcrun.launch.admission import CheckKind, problem_of
    from hpcrun.runtime.faults import parse_injections

    try:
        parse_injections(inject)
    except SpecError as exc:
        return [problem_of(CheckKind.SPEC, exc)]
    return []


def _stripe(run_dir: Path, site: Any, runner: SubprocessRunner) -> None:
    """The checkpoint directory gets the site's Lustre layout (or a warning that it cannot)."""
    from hpcrun.checkpoint.tiers import shared_root
    from hpcrun.launch.striping import apply_striping

    warning = apply_striping(site.shared_tier, shared_root(run_dir), runner=runner)
    if warning is not None:
        click.echo(f"hpcrun: warning: {warning}", err=True)


def create_run_dir(sub: Submission, cwd: Path, *, spec: Any = None,
            run_id: str | None = None) -> tuple[Path, Any, dict[str, str]]:
    """Freeze the spec (``sub.spec`` unless ``spec`` is given: a sweep point), create the run
    record; return (run_dir, frozen spec, job environment)."""
    from hpcrun.control.record import create_run
    from hpcrun.control.spec import freeze_spec
    from hpcrun.launch import codever
    from hpcrun.launch.codever import SNAPSHOT_DIR, git_state, runtime_versions, snapshot_tree
    from hpcrun.launch.site import save_site_snapshot

    runner = SubprocessRunner()
    commit, dirty = git_state(cwd, runner)
    # Outside git the code is read now and hashed into the spec: what every requeue runs.
    project = None if commit else codever.read_project(cwd, exclude=(sub.runs_root,))
    if (warning := codever.no_snapshot_warning(project)) is not None:
        click.echo(f"hpcrun: warning: {warning}", err=True)
    code = codever.code_version(commit, dirty, project)
    spec = freeze_spec(spec if spec is not None else sub.spec, code=code,
                       versions=runtime_versions())
    sub.runs_root.mkdir(parents=True, exist_ok=True, mode=0o750)
    run_dir = Path(create_run(sub.runs_root, spec, run_id=run_id))
    save_site_snapshot(run_dir, sub.site)
    _stripe(run_dir, sub.site, runner)
    code_path = cwd
    if dirty:
        snapshot_tree(cwd, run_dir / SNAPSHOT_DIR, runner)
        code_path = run_dir / SNAPSHOT_DIR
    elif project is not None and code.content is not None:
        codever.write_snapshot(project, run_dir / SNAPSHOT_DIR)
        code_path = run_dir / SNAPSHOT_DIR
    link_into_runs_root(run_dir)
    return run_dir, spec, {"HPCRUN_CODE_PATH": str(code_path)}


def link_into_runs_root(run_dir: Path) -> None:
    """Link a run (or a sweep) created outside every runs root into the primary one, so
    `hpcrun status ID` finds it anywhere; a link that cannot be made is a warning (the run
    exists, and its path always works)."""
    from hpcrun.launch.runref import link_into_primary_root

    try:
        link_into_primary_root(run_dir, environ=os.environ)
    except HpcrunError as exc:
        click.echo(f"hpcrun: warning: {exc}", err=True)


def repo_root_of(cwd: Path) -> Path:
    from hpcrun.launch.codever import repo_root

    return repo_root(cwd, SubprocessRunner())


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
    if dry_run:
        sub = prepare_submission(spec_path, site_name, backend, runs_root, verify_data,
                                 inject=inject, cwd=repo_root_of(Path.cwd()))
        dependency = _upstream(after)  # an --after that can never be met is refused here too
        click.echo(sub.report.render(), err=True)
        click.echo(_dry_run_text(sub))
        if dependency.flag:
            click.echo(f"would wait: --dependency={dependency.flag}")
        return
    done = submit_run(SubmitRequest(spec_path=Path(spec_path), backend=backend, site=site_name,
                                    runs_root=runs_root, verify_data=verify_data, inject=inject,
                                    after=after))
    if done.local is not None:
        click.echo(done.run_dir.name)
        if wait:
            sys.exit(_wait_local(done.local, done.run_dir))
        return
    click.echo(f"{done.run_dir.name} (slurm job {done.job_id})")


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitRequest:
    """What ``hpcrun submit`` (or :func:`hpcrun.submit`) was asked for."""

    spec_path: Path
    """The run.yaml."""
    backend: str | None = None
    """Where to run (default: the site's)."""
    site: str | None = None
    """Site config name or path."""
    runs_root: str | None = None
    """Where the run directory goes."""
    verify_data: str = "sample"
    """Admission's data check."""
    inject: str | None = None
    """Drills: scheduled faults."""
    after: tuple[str, ...] = ()
    """``RUN_OR_SWEEP[:ok|any]`` the run waits for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submitted:
    """A created and started run."""

    run_dir: Path
    """Its run directory."""
    job_id: str | None = None
    """Its Slurm job id (None on the local backend)."""
    local: subprocess.Popen[bytes] | None = None
    """The local launcher (None on Slurm)."""


def submit_run(req: SubmitRequest) -> Submitted:
    """Admission, then freeze the spec, create the run record and start the gang; every bad
    input raises before anything is created."""
    cwd = repo_root_of(Path.cwd())
    upstream = _upstream(req.after)
    sub = prepare_submission(str(req.spec_path), req.site, req.backend, req.runs_root,
                             req.verify_data, inject=req.inject, cwd=cwd)
    if req.after and sub.backend != "slurm":
        from hpcrun.errors import SpecError

        raise SpecError(f"--after needs the slurm backend (Slurm holds the run in its queue), "
                        f"found backend {sub.backend!r}; nothing was submitted")
    run_dir, spec, job_env = create_run_dir(sub, cwd)
    if req.inject:
        job_env["HPCRUN_INJECT"] = req.inject
    if req.after:
        _record_dependency(run_dir, upstream)
    if sub.backend == "local":
        local = _start_local(run_dir, job_env)
        _record_local_job(run_dir, local.pid)
        return Submitted(run_dir=run_dir, local=local)
    job_id = _submit_slurm(run_dir, spec, sub.site, job_env, dependency=upstream.flag)
    return Submitted(run_dir=run_dir, job_id=job_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class Dependency:
    """What ``--after`` resolved to."""

    after: tuple[str, ...] = ()
    """Upstream runs as ``RUN:kind``."""
    dirs: tuple[str, ...] = ()
    """Their run directories."""
    flag: str | None = None
    """The ``--dependency`` value."""


def _upstream(after: tuple[str, ...]) -> Dependency:
    """Resolve ``--after``; raises a clear error (before anything is created) for a run that
    does not exist or can never satisfy it."""
    if not after:
        return Dependency()
    from hpcrun.control.depend import Upstream, parse_after, plan_dependency

    ups, dirs = [], []
    for text in after:
        a = parse_after(text)
        found = _upstream_runs(a.run)
        dirs += [str(d) for d, _ in found]
        ups.append(Upstream(after=a, records=tuple(r for _, r in found)))
    names = tuple(f"{rec.run_id}:{u.after.kind.value}" for u in ups for rec in u.records)
    return Dependency(after=names, dirs=tuple(dirs), flag=plan_dependency(ups))


def _upstream_runs(name: str) -> list[tuple[Path, Any]]:
    """(run directory, record) of run ``name``, or of every point of sweep ``name``."""
    from hpcrun.control.record import read_record
    from hpcrun.errors import RecordError
    from hpcrun.launch.runref import expand_runs

    try:
        return [(d, read_record(d)) for d in expand_runs(name, environ=os.environ)]
    except RecordError as exc:
        raise RecordError(f"--after {name}: {exc}; nothing was submitted") from None


def _record_dependency(run_dir: Path, dep: Dependency) -> None:
    from hpcrun.control.entries import DependencyNote
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog

    RunLog(run_dir).append_entry(DependencyNote(after=dep.after, flag=dep.flag, dirs=dep.dirs),
                                 generation=UNFENCED, holder="")


def _dry_run_text(sub: Submission) -> str:
    placeholder = sub.runs_root / f"{sub.spec.name}-<run-id>"
    if sub.backend == "local":
        from hpcrun.launch.local import plan_local
        from hpcrun.launch.site import expand_path

        return plan_local(run_dir=placeholder, nodes=sub.spec.resources.nodes,
                          tasks_per_node=sub.spec.resources.tasks_per_node,
                          node_local_base=expand_path(sub.site.node_local_path, os.environ),
                          ).describe()
    from hpcrun.launch.sbatch import render_sbatch

    return render_sbatch(sub.spec, sub.site, run_dir=placeholder, op_id="<op-id>")


def _start_local(run_dir: Path, job_env: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, **job_env}
    (run_dir / "logs").mkdir(parents=True, exist_ok=True, mode=0o750)
    with open(run_dir / "logs" / "launcher.out", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpcrun.launch.local", "--run-dir", str(run_dir)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=job_env["HPCRUN_CODE_PATH"])


def _record_local_job(run_dir: Path, pid: int) -> None:
    """Bind the local launcher's job to the run at once, so every command reads the run's
    backend from its record (the agents publish the same job when they start)."""
    from hpcrun.control.entries import JobPayload
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog
    from hpcrun.launch.local import local_job_id
    from hpcrun.vocab import Backend

    RunLog(run_dir).append_entry(JobPayload(job_id=local_job_id(pid), backend=Backend.LOCAL),
                                 generation=UNFENCED, holder="")


def _wait_local(proc: subprocess.Popen[bytes], run_dir: Path) -> int:
    rc = proc.wait()
    from hpcrun.control.record import read_record
    from hpcrun.observe.collect import spec_script_mode
    from hpcrun.observe.figures import STEPS_NOT_REPORTED

    record = read_record(run_dir)
    where = (STEPS_NOT_REPORTED if record.step == 0 and spec_script_mode(run_dir)
             else f"at step {record.step}")
    click.echo(f"{run_dir.name}: {record.state} {where} (generation {record.generation})")
    return rc


def _submit_slurm(run_dir: Path, spec: Any, site: Any, job_env: dict[str, str], *,
                  dependency: str | None = None) -> str:
    from hpcrun.control.entries import ActionKind, JobPayload, OpPayload
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog
    from hpcrun.launch.submit import submit_submitit
    from hpcrun.runtime.agent import agent_main

    log = RunLog(run_dir)
    op_id = f"{run_dir.name}.submit.0"
    log.append_entry(OpPayload(op_id=op_id, action=ActionKind.SUBMIT), generation=UNFENCED,
                     holder="")
    write_job_script(run_dir, spec, site, job_env, op_id=op_id)  # what a reconcile resubmits
    os.environ.update(job_env)  # sbatch exports the submitting environment to the job
    job_id = submit_submitit(spec, site, run_dir=run_dir, op_id=op_id, entry=agent_main,
                             dependency=dependency)
    log.append_entry(JobPayload(job_id=job_id, backend="slurm", op_id=op_id),
                     generation=UNFENCED, holder="")
    return job_id


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
    sub = prepare_submission(spec_path, site_name, "slurm", runs_root, verify_data)
    run_dir, spec, job_env = create_run_dir(sub, repo_root_of(Path.cwd()))
    script = write_job_script(run_dir, spec, sub.site, job_env, op_id=f"{run_dir.name}.submit.0")
    click.echo(script, nl=False)
    click.echo(f"hpcrun: created run {run_dir.name} at {run_dir}", err=True)


def write_job_script(run_dir: Path, spec: Any, site: Any, job_env: dict[str, str], *,
                op_id: str) -> str:
    """The run's batch script for its first job; ``RUN_DIR/job.sh`` keeps the one a reconcile
    pass resubmits when the run's job is gone (``hpcrun status`` / ``hpcrun watch``): the same,
    except that an elastic run asks for ``--nodes=min-max`` there."""
    from hpcrun.launch.sbatch import render_sbatch

    def with_env(script: str) -> str:
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in job_env.items())
        lines = script.splitlines(keepends=True)
        body_at = next((i for i, ln in enumerate(lines)
                        if not ln.startswith("#") and ln.strip()), len(lines))
        return "".join(lines[:body_at]) + exports + "".join(lines[body_at:])

    text = with_env(render_sbatch(spec, site, run_dir=run_dir, op_id=op_id))
    again = with_env(render_sbatch(spec, site, run_dir=run_dir, op_id=op_id, requeue=True))
    (run_dir / "job.sh").write_text(again)
    return text


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
