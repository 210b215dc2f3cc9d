"""``hpcrun sweep``: a grid or list of points of one spec, each a full run, as one job array.

Thin: parse → :mod:`hpcrun.control.sweep` (points, validation) → create one run per point →
one ``sbatch --array`` (Slurm) or a bounded local launcher (local backend).
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from hpcrun.cli.run import (
    BACKENDS,
    VERIFY_DATA,
    Submission,
    create_run_dir,
    link_into_runs_root,
    prepare_submission,
    repo_root_of,
    stop_local_launcher,
    write_job_script,
)
from hpcrun.errors import SpecError
from hpcrun.runner import SubprocessRunner


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRequest:
    """What ``hpcrun sweep`` (or :func:`hpcrun.sweep`) was asked for."""

    spec_path: Path
    """The base run.yaml, or a sweep YAML naming it."""
    grid: tuple[str, ...] = ()
    """``--grid KEY=V1,V2`` options."""
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Grid axes already parsed (:func:`hpcrun.sweep`)."""
    points: tuple[dict[str, Any], ...] = ()
    """Explicit points (dotted key → value)."""
    max_parallel: int | None = None
    """``--max-parallel``; overrides the sweep YAML's."""
    backend: str | None = None
    """Where to run."""
    site: str | None = None
    """Site config name or path."""
    runs_root: str | None = None
    """Where the run directories go."""
    verify_data: str = "sample"
    """Admission's data check."""
    inject: tuple[str, ...] = ()
    """Drills: ``K:FAULTS`` fault schedules of single points."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepSubmitted:
    """A created and submitted sweep."""

    sweep_dir: Path
    """The sweep directory (``sweep.json``)."""
    run_dirs: tuple[Path, ...]
    """Each point's run directory, in array task order."""
    job_id: str | None
    """The array job id (Slurm), None on the local backend."""


def _plan(req: SweepRequest) -> tuple[Path, Any]:
    """The base spec path and the :class:`SweepPlan` (sweep YAML, then --grid, --max-parallel)."""
    from dataclasses import replace

    from hpcrun.control.sweep import SweepPlan, load_sweep_file, parse_grid_option

    raw = _read_yaml(req.spec_path)
    base, plan = ((load_sweep_file(req.spec_path)) if isinstance(raw, dict) and "sweep" in raw
                  else (req.spec_path, SweepPlan()))
    grid = plan.grid + req.axes + tuple(parse_grid_option(g) for g in req.grid)
    return base, replace(plan, grid=grid, points=plan.points + req.points,
                         max_parallel=req.max_parallel if req.max_parallel is not None
                         else plan.max_parallel)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read {path}: {exc}; check the path and the YAML") from exc


def plan_points(req: SweepRequest) -> tuple[Path, Any, list[dict[str, Any]], list[Any]]:
    """(base spec path, plan, each point's overrides, one validated spec per point); every bad
    input raises before anything is created."""
    from hpcrun.control.sweep import expand_points, point_specs

    base, plan = _plan(req)
    points = expand_points(plan)
    raw = _read_yaml(base)
    if not isinstance(raw, dict):
        raise SpecError(f"{base}: expected a run spec mapping; see `hpcrun submit --help`")
    specs = point_specs(raw, points, base_dir=base.parent.resolve(), source=str(base))
    shapes = {repr(s.resources) for s in specs}
    if len(shapes) > 1:
        raise SpecError("sweep points ask for different resources; one job array needs one "
                        "shape: sweep config values, not resources.*; nothing was submitted")
    return base, plan, points, specs


def submit_sweep(req: SweepRequest) -> SweepSubmitted:
    """Check everything, create the sweep and its runs, submit them (see the module doc)."""
    from hpcrun.control.record import new_run_id
    from hpcrun.control.sweep import (
        POINT_INJECT_ENV,
        SweepIndex,
        SweepPoint,
        write_sweep_index,
    )

    base, plan, overrides, specs = plan_points(req)
    injected = _injections(req, len(specs))
    cwd = repo_root_of(Path.cwd())
    sub = prepare_submission(str(base), req.site, req.backend, req.runs_root, req.verify_data,
                             cwd=cwd)
    admit_points(sub, req, overrides, specs)
    sweep_id = new_run_id(f"{specs[0].name}-sweep", time.time())
    sweep_dir = sub.runs_root / sweep_id
    (sweep_dir / "logs").mkdir(parents=True, mode=0o750)
    points = _create_points(sub, cwd, specs, sweep_id)
    for k, faults in injected:
        for _, _, env in points:
            env[f"{POINT_INJECT_ENV}{k}"] = faults
    index = SweepIndex(sweep_id=sweep_id, max_parallel=plan.max_parallel, backend=sub.backend,
                       points=tuple(SweepPoint(index=i, run_id=p[0].name, overrides=o)
                                    for i, (p, o) in enumerate(zip(points, overrides,
                                                                   strict=True))))
    write_sweep_index(sweep_dir, index)
    link_into_runs_root(sweep_dir)
    if sub.backend == "local":
        _start_local_sweep(sweep_dir, points[0][2])
        return SweepSubmitted(sweep_dir=sweep_dir, run_dirs=tuple(p[0] for p in points),
                              job_id=None)
    job_id = _submit_array(sweep_dir, sub, points, plan.max_parallel)
    return SweepSubmitted(sweep_dir=sweep_dir, run_dirs=tuple(p[0] for p in points),
                          job_id=job_id)


def _injections(req: SweepRequest, count: int) -> list[tuple[int, str]]:
    """``--inject-point K:FAULTS`` parsed and checked against the sweep's ``count`` points."""
    from hpcrun.control.sweep import parse_point_inject
    from hpcrun.runtime.faults import parse_injections

    injected = [parse_point_inject(t) for t in req.inject]
    for k, faults in injected:
        parse_injections(faults)
        if k >= count:
            raise SpecError(f"--inject-point {k}:...: the sweep has points 0..{count - 1}")
    return injected


def admit_points(sub: Submission, req: SweepRequest, overrides: list[dict[str, Any]],
                 specs: list[Any]) -> None:
    """Every point passes the admission ``submit`` gives its spec (the checks that can depend
    on a point's values: :func:`hpcrun.launch.admit.point_problems`); raise listing every
    point's problems, before anything is created."""
    from hpcrun.errors import AdmissionError
    from hpcrun.launch.admission import VerifyData
    from hpcrun.launch.admit import point_problems

    lines = [f"  point {i} ({', '.join(f'{k}={v}' for k, v in o.items()) or 'the base'}): "
             f"{p.line()}"
             for i, (o, spec) in enumerate(zip(overrides, specs, strict=True))
             for p in point_problems(spec, sub.spec, sub.site, sub.backend,
                                     verify_data=VerifyData(req.verify_data))]
    if lines:
        n = len(lines)
        raise AdmissionError("\n".join([
            f"sweep not submitted, nothing was created: {n} problem{'s' if n != 1 else ''} in "
            "its points; fix them and submit again (`hpcrun sweep --dry-run` runs the same "
            "checks)", *lines]))


def dry_run_sweep(req: SweepRequest) -> tuple[str, str]:
    """Every check ``submit_sweep`` makes, and what it would submit; creates nothing.

    Returns:
        (the admission report, the job array's script (Slurm) or the local launcher's plan,
        followed by the table of points).
    """
    from hpcrun.control.sweep import array_flag, render_points

    base, plan, overrides, specs = plan_points(req)
    _injections(req, len(specs))
    sub = prepare_submission(str(base), req.site, req.backend, req.runs_root, req.verify_data,
                             cwd=repo_root_of(Path.cwd()))
    admit_points(sub, req, overrides, specs)
    sweep_dir = sub.runs_root / f"{specs[0].name}-sweep-<sweep-id>"
    if sub.backend == "slurm":
        from hpcrun.launch.sbatch import render_sbatch

        head = render_sbatch(specs[0], sub.site, run_dir=sweep_dir, op_id="<op-id>",
                             array=array_flag(len(specs), plan.max_parallel))
    else:
        res = specs[0].resources
        head = (f"local backend: {len(specs)} points under {sweep_dir}, at most "
                f"{plan.max_parallel or len(specs)} running at once, each "
                f"{res.nodes} node(s) x {res.tasks_per_node} rank(s)")
    return sub.report.render(), f"{head.rstrip()}\n\n{render_points(overrides, specs)}"


def _create_points(sub: Submission, cwd: Path, specs: list[Any],
                   sweep_id: str) -> list[tuple[Path, Any, dict[str, str]]]:
    return [create_run_dir(sub, cwd, spec=spec, run_id=f"{sweep_id}-{i:03d}")
            for i, spec in enumerate(specs)]


def _submit_array(sweep_dir: Path, sub: Submission,
                  points: list[tuple[Path, Any, dict[str, str]]],
                  max_parallel: int | None) -> str:
    """One ``sbatch --array`` whose task K runs point K's agents; each point's own job.sh is
    kept for a reconcile pass that must resubmit just that point."""
    from hpcrun.control.entries import ActionKind, JobPayload, OpPayload
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog
    from hpcrun.control.sweep import array_flag
    from hpcrun.launch.sbatch import render_sbatch
    from hpcrun.launch.submit import submit_sbatch

    op_id = f"{sweep_dir.name}.submit.0"
    for run_dir, spec, env in points:
        write_job_script(run_dir, spec, sub.site, env, op_id=op_id)
        RunLog(run_dir).append_entry(OpPayload(op_id=op_id, action=ActionKind.SUBMIT),
                                     generation=UNFENCED, holder="")
    script = render_sbatch(points[0][1], sub.site, run_dir=sweep_dir, op_id=op_id,
                           array=array_flag(len(points), max_parallel))
    env = {**os.environ, **points[0][2]}
    array_id = submit_sbatch(script, runner=SubprocessRunner(), env=env)
    for k, (run_dir, _, _) in enumerate(points):
        RunLog(run_dir).append_entry(JobPayload(job_id=f"{array_id}_{k}", backend="slurm",
                                                op_id=op_id), generation=UNFENCED, holder="")
    return array_id


def _start_local_sweep(sweep_dir: Path, job_env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(sweep_dir / "logs" / "sweep-launcher.out", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpcrun.launch.sweep_local", "--sweep-dir", str(sweep_dir)],
            env={**os.environ, **job_env}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=job_env["HPCRUN_CODE_PATH"])


def cancel_sweep(sweep_dir: Path) -> None:
    """Fence and cancel every point (each through the ordinary cancel), then the array."""
    from hpcrun.control.cancel import cancel_run
    from hpcrun.control.record import read_record
    from hpcrun.control.states import is_terminal
    from hpcrun.control.sweep import read_sweep_index
    from hpcrun.launch.sweep_local import stop_launcher
    from hpcrun.scheduler.slurm import SlurmClient

    slurm = SlurmClient(SubprocessRunner())
    index = read_sweep_index(sweep_dir)
    dirs = index.run_dirs(sweep_dir)
    for run_dir in dirs:  # fence every point first, so no point can publish any more
        if not is_terminal(read_record(run_dir).state):
            cancel_run(run_dir, slurm=slurm, user=getpass.getuser())
    stop_launcher(sweep_dir)
    for run_dir in dirs:
        stop_local_launcher(run_dir)
        click.echo(f"{run_dir.name}: {read_record(run_dir).state}")
    click.echo(f"{index.sweep_id}: CANCELLED")


@click.command()
@click.argument("spec_path", metavar="RUN_OR_SWEEP_YAML", type=click.Path(dir_okay=False))
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2,...",
              help="An axis of the grid (every combination is a point); repeatable.")
@click.option("--max-parallel", type=int, default=None,
              help="Points running at once (the array's %P).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Where to run. Default: the site's backend.")
@click.option("--site", "site_name", default=None, help="Site config name or path.")
@click.option("--runs-root", default=None, help="Create the run directories here.")
@click.option("--verify-data", type=click.Choice(VERIFY_DATA), default="sample", show_default=True,
              help="Data objects hashed in full before submitting (as for submit).")
@click.option("--inject-point", "inject", multiple=True, metavar="K:FAULTS",
              help="Drills: scheduled faults of point K only (as submit --inject); repeatable.")
@click.option("--dry-run", is_flag=True,
              help="Run every check and print the array script and the points; create nothing.")
def sweep(spec_path: str, grid: tuple[str, ...], max_parallel: int | None,
          backend: str | None, site_name: str | None, runs_root: str | None,
          verify_data: str, inject: tuple[str, ...], dry_run: bool) -> None:
    """Run one spec at many points: one frozen spec and run record per point, one job array.

    \b
      hpcrun sweep run.yaml --grid config.lr=1e-3,3e-3 --grid config.seed=0,1,2 --max-parallel 2
      hpcrun sweep sweep.yaml      # sweep: {spec: run.yaml, grid: {...}, points: [...]}
      hpcrun sweep run.yaml --grid config.lr=1e-3,3e-3 --dry-run   # show it, create nothing
    Every array task is a full run (fencing, preemption, requeue of just that task, retries,
    quarantine). `hpcrun status SWEEP` shows one line per point; `hpcrun cancel SWEEP` fences
    every point first. The local backend runs at most --max-parallel points at once.
    """
    req = SweepRequest(spec_path=Path(spec_path), grid=grid, max_parallel=max_parallel,
                       backend=backend, site=site_name, runs_root=runs_root,
                       verify_data=verify_data, inject=inject)
    if dry_run:
        report, plan = dry_run_sweep(req)
        click.echo(report, err=True)
        click.echo(plan)
        return
    done = submit_sweep(req)
    job = f" (slurm array job {done.job_id})" if done.job_id else ""
    click.echo(f"{done.sweep_dir.name}{job}")
    for run_dir in done.run_dirs:
        click.echo(f"  {run_dir.name}")


COMMANDS = (sweep,)
