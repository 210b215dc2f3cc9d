"""``hpcrun sweep``: a grid or list of points of one spec, each a full run, as one job array.

Thin: parse → :mod:`hpcrun.launch.sweep_submission` (points, admission, one run per point, one
``sbatch --array`` or a bounded local launcher) → print the sweep and its runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from hpcrun.cli.common import BACKENDS, VERIFY_DATA, submit_context


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
    from hpcrun.launch.admit import parse_backend
    from hpcrun.launch.sweep_submission import SweepRequest, dry_run_sweep, submit_sweep

    req = SweepRequest(spec_path=Path(spec_path), grid=grid, max_parallel=max_parallel,
                       backend=parse_backend(backend), site=site_name, runs_root=runs_root,
                       verify_data=verify_data, inject=inject)
    if dry_run:
        plan = dry_run_sweep(req, submit_context())
        click.echo(plan.report, err=True)
        click.echo(plan.plan)
        return
    done = submit_sweep(req, submit_context())
    job = f" (slurm array job {done.job_id})" if done.job_id else ""
    click.echo(f"{done.sweep_dir.name}{job}")
    for run_dir in done.run_dirs:
        click.echo(f"  {run_dir.name}")


COMMANDS = (sweep,)
