"""A sweep's submission: one spec at many points, each a full run, as one job array.

``hpcrun sweep`` and :func:`hpcrun.sweep` run the same steps:

1. :func:`plan_points`: the sweep YAML, ``--grid`` (values read by YAML's safe loader, a
   malformed one refused in one line) and explicit points become one validated spec per
   point (:mod:`hpcrun.control.sweep`), at most the site's ``sweep_max_points``
   (:func:`point_cap`, counted before a single point is built); points asking for different
   resources are refused (one array has one shape).
2. The base spec passes the admission ``submit`` gives it
   (:func:`hpcrun.launch.submission.prepare_submission`), then every point passes the checks
   that can depend on its values (:func:`admit_points`); nothing exists yet.
3. The sweep directory, one run directory per point, the sweep index (``sweep.json``), linked
   into the primary runs root.
4. One ``sbatch --array`` (Slurm), each point keeping its own job script for a reconcile pass,
   or a bounded local launcher (:mod:`hpcrun.launch.sweep_local`).

Nothing here prints: results are returned for the caller to render.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcrun.errors import SpecError
from hpcrun.launch.submission import (
    DryRun,
    Submission,
    SubmitContext,
    SubmitRequest,
    code_root,
    create_run_dir,
    link_into_runs_root,
    prepare_submission,
    write_job_script,
)
from hpcrun.vocab import Backend


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


def _base_request(base: Path, req: SweepRequest) -> SubmitRequest:
    """The base spec's submission: what every point is admitted against."""
    return SubmitRequest(spec_path=base, backend=req.backend, site=req.site,
                         runs_root=req.runs_root, verify_data=req.verify_data)


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
    points = expand_points(plan, max_points=point_cap(base, req))
    raw = _read_yaml(base)
    if not isinstance(raw, dict):
        raise SpecError(f"{base}: expected a run spec mapping; see `hpcrun submit --help`")
    specs = point_specs(raw, points, base_dir=base.parent.resolve(), source=str(base))
    shapes = {repr(s.resources) for s in specs}
    if len(shapes) > 1:
        raise SpecError("sweep points ask for different resources; one job array needs one "
                        "shape: sweep config values, not resources.*; nothing was submitted")
    return base, plan, points, specs


def point_cap(base: Path, req: SweepRequest) -> int:
    """The most points this sweep may have: its site's ``sweep_max_points``, the site named as
    admission names it (``--site``, else the base spec's ``site``, else ``local``), read
    before a single point is built.

    Raises:
        ConfigError: the site config does not load (one line, as ``submit`` gives it).
    """
    from hpcrun.launch.site import load_site

    raw = _read_yaml(base)
    named = raw.get("site") if isinstance(raw, dict) else None
    return load_site(req.site or (named if isinstance(named, str) else "local")
                     ).sweep_max_points


def submit_sweep(req: SweepRequest, context: SubmitContext) -> SweepSubmitted:
    """Check everything, create the sweep and its runs, submit them (see the module doc)."""
    from hpcrun.control.record import new_run_id
    from hpcrun.control.sweep import (
        POINT_INJECT_ENV,
        SweepIndex,
        SweepPoint,
        write_sweep_index,
    )

    base, plan, overrides, specs = plan_points(req)
    injected = _injections(req, len(specs), context)
    code_dir = code_root(context)
    sub = prepare_submission(_base_request(base, req), context, code_path=code_dir)
    admit_points(sub, req, overrides, specs)
    sweep_id = new_run_id(f"{specs[0].name}-sweep", time.time())
    sweep_dir = sub.runs_root / sweep_id
    (sweep_dir / "logs").mkdir(parents=True, mode=0o750)
    points = _create_points(sub, context, code_dir, specs, sweep_id)
    for k, faults in injected:
        for _, _, env in points:
            env[f"{POINT_INJECT_ENV}{k}"] = faults
    index = SweepIndex(sweep_id=sweep_id, max_parallel=plan.max_parallel, backend=sub.backend,
                       points=tuple(SweepPoint(index=i, run_id=p[0].name, overrides=o)
                                    for i, (p, o) in enumerate(zip(points, overrides,
                                                                   strict=True))))
    write_sweep_index(sweep_dir, index)
    link_into_runs_root(sweep_dir, context)
    if sub.backend == Backend.LOCAL:
        _start_local_sweep(sweep_dir, points[0][2], context.environ)
        return SweepSubmitted(sweep_dir=sweep_dir, run_dirs=tuple(p[0] for p in points),
                              job_id=None)
    job_id = _submit_array(sweep_dir, sub, points, plan.max_parallel, context)
    return SweepSubmitted(sweep_dir=sweep_dir, run_dirs=tuple(p[0] for p in points),
                          job_id=job_id)


def _injections(req: SweepRequest, count: int,
                context: SubmitContext) -> list[tuple[int, str]]:
    """``--inject-point K:FAULTS`` parsed and checked against the sweep's ``count`` points."""
    from hpcrun.control.sweep import parse_point_inject

    injected = [parse_point_inject(t) for t in req.inject]
    for k, faults in injected:
        context.check_faults(faults)
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


def dry_run_sweep(req: SweepRequest, context: SubmitContext) -> DryRun:
    """Every check ``submit_sweep`` makes, and what it would submit; creates nothing: the
    admission report, and the job array's script (Slurm) or the local launcher's plan,
    followed by the table of points."""
    from hpcrun.control.sweep import array_flag, render_points

    base, plan, overrides, specs = plan_points(req)
    _injections(req, len(specs), context)
    sub = prepare_submission(_base_request(base, req), context, code_path=code_root(context))
    admit_points(sub, req, overrides, specs)
    sweep_dir = sub.runs_root / f"{specs[0].name}-sweep-<sweep-id>"
    if sub.backend == Backend.SLURM:
        from hpcrun.launch.sbatch import render_sbatch

        head = render_sbatch(specs[0], sub.site, run_dir=sweep_dir, op_id="<op-id>",
                             array=array_flag(len(specs), plan.max_parallel))
    else:
        res = specs[0].resources
        head = (f"local backend: {len(specs)} points under {sweep_dir}, at most "
                f"{plan.max_parallel or len(specs)} running at once, each "
                f"{res.nodes} node(s) x {res.tasks_per_node} rank(s)")
    return DryRun(report=sub.report.render(),
                  plan=f"{head.rstrip()}\n\n{render_points(overrides, specs)}")


def _create_points(sub: Submission, context: SubmitContext, code_dir: Path, specs: list[Any],
                   sweep_id: str) -> list[tuple[Path, Any, dict[str, str]]]:
    return [create_run_dir(sub, context, code_dir, spec=spec, run_id=f"{sweep_id}-{i:03d}")
            for i, spec in enumerate(specs)]


def _submit_array(sweep_dir: Path, sub: Submission,
                  points: list[tuple[Path, Any, dict[str, str]]],
                  max_parallel: int | None, context: SubmitContext) -> str:
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
    env = {**context.environ, **points[0][2]}
    array_id = submit_sbatch(script, runner=context.runner, env=env)
    for k, (run_dir, _, _) in enumerate(points):
        RunLog(run_dir).append_entry(JobPayload(job_id=f"{array_id}_{k}", backend=Backend.SLURM,
                                                op_id=op_id), generation=UNFENCED, holder="")
    return array_id


def _start_local_sweep(sweep_dir: Path, job_env: dict[str, str],
                       environ: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with open(sweep_dir / "logs" / "sweep-launcher.out", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpcrun.launch.sweep_local", "--sweep-dir", str(sweep_dir)],
            env={**environ, **job_env}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=job_env["HPCRUN_CODE_PATH"])
