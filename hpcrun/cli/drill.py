"""``hpcrun drill | preflight | canary``: prove a run's recovery contracts before the long run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hpcrun.errors import SpecError
from hpcrun.vocab import Backend

BACKENDS = (Backend.LOCAL.value, Backend.SLURM.value)
_DURING = {"staging": "kill-staging", "shard_write": "kill-shard-write",
           "before_manifest": "kill-before-manifest"}


@click.command()
@click.argument("spec_path", metavar="RUN_SPEC", required=False,
                type=click.Path(dir_okay=False, exists=True))
@click.option("--fault", default=None, help="Fault of the matrix (see --list).")
@click.option("--at", "at", type=int, default=None, help="Step at which the fault fires.")
@click.option("--during", type=click.Choice(sorted(_DURING)), default=None,
              help="Kill a rank during this checkpoint phase (same as the kill-* faults).")
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True)
@click.option("--all", "all_faults", is_flag=True, help="Run the whole matrix; print a table.")
@click.option("--list", "list_faults", is_flag=True, help="List the matrix and exit.")
@click.option("--restore", "restore_run", metavar="RUN", default=None,
              help="Restore drill: restore RUN's checkpoints (RUN: an id, a unique prefix or "
                   "a run directory) into every supported layout.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for each drilled run to end.")
def drill(spec_path: str | None, fault: str | None, at: int | None, during: str | None,
          backend: str, all_faults: bool, list_faults: bool, restore_run: str | None,
          timeout_s: float) -> None:
    """Run RUN_SPEC at small scale with a fault and check the recovery contracts.

    \b
      hpcrun drill run.yaml --fault rank-kill --at 15
      hpcrun drill run.yaml --during shard_write
      hpcrun drill run.yaml --all [--backend slurm]
      hpcrun drill --restore RUN
    Contracts: exit state, fault class, recovery path, recovered state (newest committed
    checkpoint restored), RPO (steps lost), RTO split (detect, requeue/wait, start, restore,
    first step), samples (ledger: skipped/duplicated), cursor continuity, fencing, no torn
    checkpoint. Exits 1 when any contract failed.
    """
    from hpcrun.drill import render
    from hpcrun.drill.matrix import MATRIX, row_for

    if list_faults:
        click.echo(render.table(["fault", "backends", "what"], [
            [r.fault.value, "/".join(sorted(r.backends)), r.what] for r in MATRIX]))
        return
    if restore_run is not None:
        _restore(restore_run)
        return
    if spec_path is None:
        raise SpecError("hpcrun drill needs RUN_SPEC (a run.yaml) unless --restore or --list "
                        "is given; e.g. `hpcrun drill run.yaml --fault rank-kill`")
    names = [r.fault.value for r in MATRIX] if all_faults else [
        _DURING[during] if during else (fault or "")]
    if not names[0]:
        raise SpecError("pass --fault KIND, --during PHASE or --all; `hpcrun drill --list` "
                        "shows the faults")
    rows = [row_for(n) for n in names]
    results = [_one(Path(spec_path), row, Backend(backend), at, timeout_s, verbose=not all_faults)
               for row in rows]
    if all_faults:
        click.echo(render.matrix_table(results))
    splits = [s for r in results for s in r.splits]
    if splits:
        click.echo("\nRTO split (seconds, mean per cause):\n" + render.rto_table(splits))
    sys.exit(1 if any(r.ok is False for r in results) else 0)


def _one(spec: Path, row: Any, backend: Backend, at: int | None, timeout_s: float, *,
         verbose: bool) -> Any:
    from hpcrun.drill import render
    from hpcrun.drill.runner import run_drill

    result = run_drill(spec, row, backend=backend, at=at, timeout_s=timeout_s)
    if verbose:
        click.echo(render.detail_table(result))
    else:
        click.echo(f"{result.row.fault.value}: "
                   f"{ {True: 'PASS', False: 'FAIL', None: 'n/a'}[result.ok] }", err=True)
    return result


def _restore(run: str) -> None:
    import os

    from hpcrun.drill import render
    from hpcrun.drill.restore import restore_drill
    from hpcrun.launch.runref import resolve_run_dir

    checks = restore_drill(resolve_run_dir(run, environ=os.environ))
    click.echo(render.check_table(checks))
    sys.exit(1 if any(c.ok is False for c in checks) else 0)


@click.command()
@click.argument("spec_path", metavar="RUN_SPEC", type=click.Path(dir_okay=False, exists=True))
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True)
def preflight(spec_path: str, backend: str) -> None:
    """Check what can fail early on the target allocation, before the long run.

    Devices and process group, storage writable on both tiers (with measured bandwidth), data
    objects present with matching digests, a checkpoint round trip, telemetry written, and the
    links between the spec's nodes: one rank per node (an srun step on Slurm, local processes
    on the local backend) all-reduces with every other node in turn; the row names the median
    pair bandwidth and the slowest pair, and fails when that pair is below half the median.
    """
    from hpcrun.drill import render
    from hpcrun.drill.preflight import preflight as run_preflight

    checks = run_preflight(Path(spec_path), backend=Backend(backend))
    click.echo(render.check_table(checks))
    # An invalid spec is bad input (exit 2, as submit refuses it); a failed check is exit 1.
    if any(c.name == "spec" and c.ok is False for c in checks):
        sys.exit(2)
    sys.exit(1 if any(c.ok is False for c in checks) else 0)


@click.command()
@click.argument("spec_path", metavar="RUN_SPEC", type=click.Path(dir_okay=False, exists=True))
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True)
@click.option("--steps", type=int, default=None, help="Steps to run (default: 2 checkpoints).")
def canary(spec_path: str, backend: str, steps: int | None) -> None:
    """Run a few real steps with one checkpoint commit and a restore; check the accounting."""
    from hpcrun.drill import render
    from hpcrun.drill.preflight import canary as run_canary

    checks = run_canary(Path(spec_path), backend=Backend(backend), steps=steps)
    click.echo(render.check_table(checks))
    sys.exit(1 if any(c.ok is False for c in checks) else 0)


COMMANDS = (drill, preflight, canary)
