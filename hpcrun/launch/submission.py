"""The submission pipeline: from a run.yaml to a started gang, shared by ``hpcrun submit``,
``hpcrun sbatch`` and :func:`hpcrun.submit`.

1. :func:`prepare_submission`: every admission check (:func:`hpcrun.launch.admit.admit`); any
   problem refuses the run before anything is created, listing every problem found.
2. ``--after`` is resolved (:func:`resolve_upstream`): an upstream that does not exist or can
   never satisfy it is refused here too, still before anything is created.
3. :func:`create_run_dir`: freeze the spec, create the run record, save the site snapshot,
   stripe the checkpoint directory, snapshot the code, link the run into the primary runs root.
4. The dependency note (a run submitted ``--after`` others), then the start: the local
   launcher, bound to the run at once, or one submitit allocation, after
   :func:`write_job_script` keeps the script a reconcile pass resubmits.

Nothing here prints: notices and warnings go to :attr:`SubmitContext.warn`, results are returned
for the caller to render. The runtime sits above launch, so what the pipeline needs from it
(the agent each Slurm task runs, the parser of a ``--inject`` schedule) comes in through the
:class:`SubmitContext`.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrun.errors import HpcrunError, SpecError
from hpcrun.launch.submit import AgentEntry
from hpcrun.runner import CommandRunner, SubprocessRunner
from hpcrun.vocab import Backend


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitContext:
    """Where a submission comes from: the submitting process, read once, and the seams the
    planes above launch plug in."""

    environ: Mapping[str, str]
    """The submitting environment (the job inherits it, with the job's own variables added)."""
    cwd: Path
    """The working directory; the run's code is the git tree holding it (or it)."""
    agent_entry: AgentEntry
    """What each task of a Slurm job runs (:func:`hpcrun.runtime.agent.agent_main`)."""
    check_faults: Callable[[str], object]
    """Parses a ``--inject`` schedule, raising ``SpecError`` naming the bad part
    (:func:`hpcrun.runtime.faults.parse_injections`)."""
    warn: Callable[[str], None]
    """Takes each notice or warning line (the CLI prints it on stderr)."""
    runner: CommandRunner = field(default_factory=SubprocessRunner)
    """Runs git, lfs, sbatch and the admission probes."""

    @classmethod
    def from_process(cls, *, agent_entry: AgentEntry, check_faults: Callable[[str], object],
                     warn: Callable[[str], None]) -> SubmitContext:
        """The context of this process: its environment and working directory."""
        return cls(environ=os.environ, cwd=Path.cwd(), agent_entry=agent_entry,
                   check_faults=check_faults, warn=warn)


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitRequest:
    """What ``hpcrun submit`` (or :func:`hpcrun.submit`) was asked for."""

    spec_path: Path
    """The run.yaml."""
    backend: Backend | str | None = None
    """Where to run (default: the site's); a name given is turned into its :class:`Backend`."""
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

    def __post_init__(self) -> None:
        from hpcrun.launch.admit import parse_backend

        object.__setattr__(self, "backend", parse_backend(self.backend))


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """A loaded spec and site that passed admission, and where the run will live."""

    spec: Any
    """The validated (not yet frozen) RunSpec."""
    site: Any
    """The SiteConfig."""
    backend: Backend
    """Where it runs."""
    runs_root: Path
    """Directory under which the run directory is created."""
    report: Any
    """The :class:`~hpcrun.launch.admission.AdmissionReport` it passed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submitted:
    """A created and started run."""

    run_dir: Path
    """Its run directory."""
    job_id: str | None = None
    """Its Slurm job id (None on the local backend)."""
    local: subprocess.Popen[bytes] | None = None
    """The local launcher (None on Slurm)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DryRun:
    """Everything a submission would do, checked; nothing was created."""

    report: str
    """The admission report."""
    plan: str
    """The job script (Slurm) or the local launcher's plan (a sweep: then its points)."""
    wait_flag: str | None = None
    """The ``--dependency`` the job would wait on (``--after``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Dependency:
    """What ``--after`` resolved to."""

    after: tuple[str, ...] = ()
    """Upstream runs as ``RUN:kind``."""
    dirs: tuple[str, ...] = ()
    """Their run directories."""
    flag: str | None = None
    """The ``--dependency`` value."""


def code_root(context: SubmitContext) -> Path:
    """The top of the git tree holding the working directory (the job's code); the working
    directory itself outside git."""
    from hpcrun.launch.codever import repo_root

    return repo_root(context.cwd, context.runner)


def prepare_submission(req: SubmitRequest, context: SubmitContext, *,
                       code_path: Path) -> Submission:
    """Run every admission check; raise :class:`AdmissionError` listing every problem found,
    before anything is created."""
    from hpcrun.launch.admission import VerifyData
    from hpcrun.launch.admit import AdmissionRequest, admit, parse_backend

    request = AdmissionRequest(
        spec_path=Path(req.spec_path), code_path=code_path, python=sys.executable,
        user=getpass.getuser(), site=req.site, backend=parse_backend(req.backend),
        runs_root=req.runs_root,
        have_sbatch=shutil.which("sbatch", path=context.environ.get("PATH")) is not None,
        verify_data=VerifyData(req.verify_data))
    result = admit(request, environ=context.environ, runner=context.runner,
                   extra=_inject_findings(req.inject, context.check_faults))
    if result.notice:
        context.warn(result.notice)
    for skipped in result.report.skipped:
        context.warn(f"hpcrun: not checked: {skipped.line()}")
    if not result.report.ok or result.runs_root is None:
        raise result.report.refusal()
    if req.inject and result.spec is not None and result.spec.script_mode:
        raise SpecError(
            f"--inject {req.inject!r} cannot fire in a script run: its faults fire at hpcrun's "
            "step boundaries (main(ctx)), which a plain script does not have; drop --inject "
            "and drill the run with `hpcrun signal RUN` (a preemption) or by killing one of "
            "its rank processes")
    return Submission(spec=result.spec, site=result.site, backend=result.backend,
                      runs_root=result.runs_root, report=result.report)


def _inject_findings(inject: str | None, check_faults: Callable[[str], object]) -> list[Any]:
    if not inject:
        return []
    from hpcrun.launch.admission import CheckKind, problem_of

    try:
        check_faults(inject)
    except SpecError as exc:
        return [problem_of(CheckKind.SPEC, exc)]
    return []


def create_run_dir(sub: Submission, context: SubmitContext, code_dir: Path, *,
                   spec: Any = None, run_id: str | None = None
                   ) -> tuple[Path, Any, dict[str, str]]:
    """Freeze the spec (``sub.spec`` unless ``spec`` is given: a sweep point) with the code in
    ``code_dir``, create the run record; return (run_dir, frozen spec, job environment)."""
    from hpcrun.control.record import create_run
    from hpcrun.control.spec import freeze_spec
    from hpcrun.launch import codever
    from hpcrun.launch.codever import SNAPSHOT_DIR, git_state, runtime_versions, snapshot_tree
    from hpcrun.launch.site import save_site_snapshot

    runner = context.runner
    commit, dirty = git_state(code_dir, runner)
    # Outside git the code is read now and hashed into the spec: what every requeue runs.
    project = None if commit else codever.read_project(code_dir, exclude=(sub.runs_root,))
    if (warning := codever.no_snapshot_warning(project)) is not None:
        context.warn(f"hpcrun: warning: {warning}")
    code = codever.code_version(commit, dirty, project)
    spec = freeze_spec(spec if spec is not None else sub.spec, code=code,
                       versions=runtime_versions())
    sub.runs_root.mkdir(parents=True, exist_ok=True, mode=0o750)
    run_dir = Path(create_run(sub.runs_root, spec, run_id=run_id))
    save_site_snapshot(run_dir, sub.site)
    _stripe(run_dir, sub.site, context)
    code_path = code_dir
    if dirty:
        snapshot_tree(code_dir, run_dir / SNAPSHOT_DIR, runner)
        code_path = run_dir / SNAPSHOT_DIR
    elif project is not None and code.content is not None:
        codever.write_snapshot(project, run_dir / SNAPSHOT_DIR)
        code_path = run_dir / SNAPSHOT_DIR
    link_into_runs_root(run_dir, context)
    return run_dir, spec, {"HPCRUN_CODE_PATH": str(code_path)}


def _stripe(run_dir: Path, site: Any, context: SubmitContext) -> None:
    """The checkpoint directory gets the site's Lustre layout (or a warning that it cannot)."""
    from hpcrun.checkpoint.tiers import shared_root
    from hpcrun.launch.striping import apply_striping

    warning = apply_striping(site.shared_tier, shared_root(run_dir), runner=context.runner)
    if warning is not None:
        context.warn(f"hpcrun: warning: {warning}")


def link_into_runs_root(run_dir: Path, context: SubmitContext) -> None:
    """Link a run (or a sweep) created outside every runs root into the primary one, so
    `hpcrun status ID` finds it anywhere; a link that cannot be made is a warning (the run
    exists, and its path always works)."""
    from hpcrun.launch.runref import link_into_primary_root

    try:
        link_into_primary_root(run_dir, environ=context.environ)
    except HpcrunError as exc:
        context.warn(f"hpcrun: warning: {exc}")


def submit_run(req: SubmitRequest, context: SubmitContext) -> Submitted:
    """Admission, then freeze the spec, create the run record and start the gang; every bad
    input raises before anything is created (see the module doc)."""
    code_dir = code_root(context)
    upstream = resolve_upstream(req.after, context.environ)
    sub = prepare_submission(req, context, code_path=code_dir)
    if req.after and sub.backend != Backend.SLURM:
        raise SpecError(f"--after needs the slurm backend (Slurm holds the run in its queue), "
                        f"found backend {sub.backend!r}; nothing was submitted")
    run_dir, spec, job_env = create_run_dir(sub, context, code_dir)
    if req.inject:
        job_env["HPCRUN_INJECT"] = req.inject
    if req.after:
        _record_dependency(run_dir, upstream)
    if sub.backend == Backend.LOCAL:
        local = _start_local(run_dir, job_env, context.environ)
        _record_local_job(run_dir, local.pid)
        return Submitted(run_dir=run_dir, local=local)
    job_id = _submit_slurm(run_dir, spec, sub.site, job_env, context, dependency=upstream.flag)
    return Submitted(run_dir=run_dir, job_id=job_id)


def dry_run_submission(req: SubmitRequest, context: SubmitContext) -> DryRun:
    """Every check :func:`submit_run` makes, and what it would submit; creates nothing."""
    sub = prepare_submission(req, context, code_path=code_root(context))
    dependency = resolve_upstream(req.after, context.environ)  # one never met is refused too
    return DryRun(report=sub.report.render(), plan=_dry_run_text(sub, context.environ),
                  wait_flag=dependency.flag)


def create_script_run(req: SubmitRequest, context: SubmitContext) -> tuple[Path, str]:
    """Admission, then the run record, for plain ``sbatch``; return (run_dir, the job script)."""
    code_dir = code_root(context)
    sub = prepare_submission(req, context, code_path=code_dir)
    run_dir, spec, job_env = create_run_dir(sub, context, code_dir)
    script = write_job_script(run_dir, spec, sub.site, job_env, op_id=f"{run_dir.name}.submit.0")
    return run_dir, script


def resolve_upstream(after: tuple[str, ...], environ: Mapping[str, str]) -> Dependency:
    """Resolve ``--after``; raises a clear error (before anything is created) for a run that
    does not exist or can never satisfy it."""
    if not after:
        return Dependency()
    from hpcrun.control.depend import Upstream, parse_after, plan_dependency

    ups, dirs = [], []
    for text in after:
        a = parse_after(text)
        found = _upstream_runs(a.run, environ)
        dirs += [str(d) for d, _ in found]
        ups.append(Upstream(after=a, records=tuple(r for _, r in found)))
    names = tuple(f"{rec.run_id}:{u.after.kind.value}" for u in ups for rec in u.records)
    return Dependency(after=names, dirs=tuple(dirs), flag=plan_dependency(ups))


def _upstream_runs(name: str, environ: Mapping[str, str]) -> list[tuple[Path, Any]]:
    """(run directory, record) of run ``name``, or of every point of sweep ``name``."""
    from hpcrun.control.record import read_record
    from hpcrun.errors import RecordError
    from hpcrun.launch.runref import expand_runs

    try:
        return [(d, read_record(d)) for d in expand_runs(name, environ=environ)]
    except RecordError as exc:
        raise RecordError(f"--after {name}: {exc}; nothing was submitted") from None


def _record_dependency(run_dir: Path, dep: Dependency) -> None:
    from hpcrun.control.entries import DependencyNote
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog

    RunLog(run_dir).append_entry(DependencyNote(after=dep.after, flag=dep.flag, dirs=dep.dirs),
                                 generation=UNFENCED, holder="")


def _dry_run_text(sub: Submission, environ: Mapping[str, str]) -> str:
    placeholder = sub.runs_root / f"{sub.spec.name}-<run-id>"
    if sub.backend == Backend.LOCAL:
        from hpcrun.launch.local import plan_local
        from hpcrun.launch.site import expand_path

        return plan_local(run_dir=placeholder, nodes=sub.spec.resources.nodes,
                          tasks_per_node=sub.spec.resources.tasks_per_node,
                          node_local_base=expand_path(sub.site.node_local_path, environ),
                          ).describe()
    from hpcrun.launch.sbatch import render_sbatch

    return render_sbatch(sub.spec, sub.site, run_dir=placeholder, op_id="<op-id>")


def _start_local(run_dir: Path, job_env: dict[str, str],
                 environ: Mapping[str, str]) -> subprocess.Popen[bytes]:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True, mode=0o750)
    with open(run_dir / "logs" / "launcher.out", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpcrun.launch.local", "--run-dir", str(run_dir)],
            env={**environ, **job_env}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=job_env["HPCRUN_CODE_PATH"])


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


def _submit_slurm(run_dir: Path, spec: Any, site: Any, job_env: dict[str, str],
                  context: SubmitContext, *, dependency: str | None = None) -> str:
    from hpcrun.control.entries import ActionKind, JobPayload, OpPayload
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog
    from hpcrun.launch.submit import submit_submitit

    log = RunLog(run_dir)
    op_id = f"{run_dir.name}.submit.0"
    log.append_entry(OpPayload(op_id=op_id, action=ActionKind.SUBMIT), generation=UNFENCED,
                     holder="")
    write_job_script(run_dir, spec, site, job_env, op_id=op_id)  # what a reconcile resubmits
    with _process_environ({**context.environ, **job_env}):
        job_id = submit_submitit(spec, site, run_dir=run_dir, op_id=op_id,
                                 entry=context.agent_entry, dependency=dependency)
    log.append_entry(JobPayload(job_id=job_id, backend=Backend.SLURM, op_id=op_id),
                     generation=UNFENCED, holder="")
    return job_id


@contextmanager
def _process_environ(env: Mapping[str, str]) -> Iterator[None]:
    """The process environment is ``env`` while submitit runs ``sbatch``, which exports it to
    the job (submitit takes no environment of its own); the previous one is restored after."""
    target, saved = dict(env), dict(os.environ)
    os.environ.clear()
    os.environ.update(target)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


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
