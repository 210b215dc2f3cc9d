"""Operator commands: status, list, logs, report, export, metrics, show, plan.

Thin: parse → call the observe plane → render. ``RUN`` is a run id, a unique prefix of one, or
a path to a run directory (:mod:`hpcrun.launch.runref`: the ids are looked up under
``$HPCRUN_RUNS``, else under the site's ``shared_path``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from hpcrun.errors import ConfigError


def _run_dir(run: str) -> Path:
    from hpcrun.launch.runref import resolve_run_dir

    return resolve_run_dir(run, environ=os.environ)


def _on_slurm(run_dir: Path) -> bool:
    """Whether Slurm runs the run (a local-backend run has nothing to reconcile)."""
    from hpcrun.launch.runref import run_backend
    from hpcrun.vocab import Backend

    return run_backend(run_dir) is Backend.SLURM


def _reconcile(run_dir: Path, timeout_s: float) -> Any:
    from hpcrun.observe.collect import run_bounded

    def once() -> Any:
        from hpcrun.clock import SYSTEM_CLOCK
        from hpcrun.control.watch import watch_once
        from hpcrun.observe.postrun import post_run_publisher
        from hpcrun.runner import SubprocessRunner
        from hpcrun.scheduler.slurm import SlurmClient

        return watch_once(run_dir, SlurmClient(SubprocessRunner(), timeout=timeout_s),
                          SYSTEM_CLOCK, on_end=post_run_publisher(clock=SYSTEM_CLOCK))

    return run_bounded(once, timeout_s=timeout_s)


def _status_once(run_dir: Path, *, as_json: bool, reconcile: bool, timeout_s: float,
                 all_ranks: bool = False) -> str:
    from hpcrun.observe.campaign import campaign_lines
    from hpcrun.observe.collect import collect_status, spec_rpo
    from hpcrun.observe.status import render_text, status_json

    outcome = _reconcile(run_dir, timeout_s) if reconcile and _on_slurm(run_dir) else None
    campaign = _campaign(run_dir)
    # the default text names a large gang's ranks worth naming: no other rank's row is parsed
    collected = collect_status(run_dir, rpo_s=spec_rpo(run_dir), budget_used_fraction=(
        campaign.budget_used_fraction if campaign is not None else None),
        every_rank=as_json or all_ranks)
    if as_json:
        body = status_json(collected.view)
        body["campaign"] = campaign.to_dict() if campaign is not None else None
        body["read_s"] = collected.read_s
        body["reconcile"] = None if outcome is None else {
            "ok": outcome.ok, "seconds": outcome.seconds, "detail": outcome.detail}
        return json.dumps(body, sort_keys=True, default=str)
    text = "\n".join([render_text(collected.view, all_ranks=all_ranks), *(campaign_lines(
        campaign, state=collected.view.facts.state) if campaign is not None else [])])
    text += f"\nread        {collected.read_s * 1000:.0f} ms"
    if outcome is not None:
        text += (f"\nreconcile   {'ok' if outcome.ok else 'not done'} in "
                 f"{outcome.seconds * 1000:.0f} ms: {outcome.detail}")
    return text


def _sweep_status_once(sweep_dir: Path, *, as_json: bool, reconcile: bool,
                       timeout_s: float) -> str:
    from dataclasses import asdict

    from hpcrun.control.sweep import read_sweep_index
    from hpcrun.observe.campaign import sweep_lines, sweep_totals
    from hpcrun.observe.sweep_view import point_rows
    from hpcrun.vocab import Backend

    index = read_sweep_index(sweep_dir)
    if reconcile and Backend(index.backend) is Backend.SLURM:
        for run_dir in index.run_dirs(sweep_dir):
            _reconcile(run_dir, timeout_s)
    rows = point_rows(sweep_dir, index)
    if as_json:
        return json.dumps({"sweep_id": index.sweep_id, "points": [asdict(r) for r in rows],
                           "totals": sweep_totals(rows)}, sort_keys=True)
    return "\n".join(sweep_lines(index.sweep_id, rows))


def _campaign(run_dir: Path) -> Any:
    from hpcrun.control.record import load_run_spec, read_record
    from hpcrun.errors import HpcrunError
    from hpcrun.observe.campaign import campaign_figures

    try:
        return campaign_figures(read_record(run_dir), load_run_spec(run_dir), now=time.time())
    except HpcrunError:
        return None  # a damaged spec or record: the status block above says what it can


@click.command()
@click.argument("run")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", default=5.0, show_default=True, help="Seconds between refreshes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (for scripts).")
@click.option("--reconcile/--no-reconcile", default=True, show_default=True,
              help="Also reconcile the record against Slurm (bounded by --timeout).")
@click.option("--timeout", "timeout_s", default=10.0, show_default=True,
              help="Seconds the reconcile pass may take.")
@click.option("--ranks", "ranks", type=click.Choice(["named", "all"]), default="named",
              show_default=True,
              help="Rank lines of a gang over 16 ranks: those worth naming (hung, straggling, "
                   "failed, the slowest) or all. --json always holds every rank.")
def status(run: str, watch: bool, interval: float, as_json: bool, reconcile: bool,
           timeout_s: float, ranks: str) -> None:
    """State, generation, job, step and rate, checkpoints, ETTR, rank tails and incidents.

    RUN is a run id, a unique prefix of one, or a run directory. For a sweep (its id or
    directory): one line per point (state, step, loss, ETTR) and the sweep's totals.
    """
    from hpcrun.launch.runref import RefKind, resolve_reference

    entry = resolve_reference(run, environ=os.environ)
    while True:
        if entry.kind is RefKind.SWEEP:
            out = _sweep_status_once(entry.path, as_json=as_json, reconcile=reconcile,
                                     timeout_s=timeout_s)
        else:
            out = _status_once(entry.path, as_json=as_json, reconcile=reconcile,
                               timeout_s=timeout_s, all_ranks=ranks == "all")
        if watch and not as_json:
            click.clear()
        click.echo(out)
        if not watch:
            return
        time.sleep(interval)


@click.command("list")
def list_runs() -> None:
    """All runs under the runs roots, newest first.

    The runs root is $HPCRUN_RUNS; else the shared_path of the site $HPCRUN_SITE names; else
    the shared_path of every site config found (the local site's first).
    """
    from hpcrun.errors import HpcrunError
    from hpcrun.launch.runref import run_dirs, runs_roots
    from hpcrun.observe.collect import default_record_reader

    dirs = run_dirs(os.environ)
    if not dirs:
        roots = ", ".join(str(r.path) for r in runs_roots(os.environ))
        click.echo(f"no runs under {roots}; submit one with `hpcrun submit run.yaml`")
        return
    click.echo(f"{'RUN':<40} {'STATE':<11} {'GEN':>4} {'STEP':>9}  JOB")
    for d in dirs:
        try:
            r = default_record_reader(d)
        except HpcrunError as exc:
            click.echo(f"{d.name:<40} {'unreadable':<11} ({exc})")
            continue
        state = getattr(r.state, "value", r.state)
        job = r.job_ids[-1] if r.job_ids else "-"
        click.echo(f"{d.name:<40} {state:<11} {r.generation:>4} {r.step:>9}  {job}")


@click.command()
@click.argument("run")
@click.option("--rank", "rank", type=int, default=None, help="Only this global rank.")
@click.option("-n", "lines", type=int, default=20, show_default=True, help="Lines per rank.")
def logs(run: str, rank: int | None, lines: int) -> None:
    """Tail the ranks' output (logs/<node>/rank-NNNNN.out)."""
    from hpcrun.observe.collect import rank_log_files, tail_lines

    run_dir = _run_dir(run)
    files = rank_log_files(run_dir)
    if rank is not None and rank not in files:
        raise ConfigError(f"no output for rank {rank} in {run_dir}/logs; ranks with output: "
                          f"{sorted(files) or 'none yet'}")
    for r, (node, path) in sorted(files.items()):
        if rank is None or r == rank:
            prefix = "" if rank is not None else f"[{node} rank {r}] "
            for line in tail_lines(path, lines):
                click.echo(prefix + line)


@click.command()
@click.argument("run")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("report.html"), show_default=True)
@click.option("--node-hour-price", type=float, default=None, help="Price of one node-hour.")
def report(run: str, output: Path, node_hour_price: float | None) -> None:
    """Write a self-contained HTML report (timeline, per-rank step times, waste, cadence)."""
    from hpcrun.observe.collect import (
        default_record_reader,
        facts_from_record,
        run_markers,
        run_mtbf,
        spec_rpo,
    )
    from hpcrun.observe.events import sorted_events
    from hpcrun.observe.report import build_report, write_report

    run_dir = _run_dir(run)
    facts = facts_from_record(default_record_reader(run_dir), rpo_s=spec_rpo(run_dir))
    page = build_report(sorted_events(run_dir), facts=facts, node_hour_price=node_hour_price,
                        mtbf=run_mtbf(run_dir, prior_h=_site_mtbf_prior_h(run_dir)),
                        markers=run_markers(run_dir), now=time.time())
    click.echo(f"wrote {write_report(output, page)}")


def _site_mtbf_prior_h(run_dir: Path) -> float:
    """The run's site prior; a run directory without a readable site snapshot uses the
    default prior."""
    from hpcrun.checkpoint.cadence import DEFAULT_MTBF_PRIOR_H
    from hpcrun.errors import ConfigError
    from hpcrun.launch.site import load_site_snapshot

    try:
        return load_site_snapshot(run_dir).mtbf_prior_h
    except ConfigError:
        return DEFAULT_MTBF_PRIOR_H


@click.command()
@click.argument("run")
@click.option("--prometheus", "directory", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="node_exporter textfile-collector directory.")
def export(run: str, directory: Path) -> None:
    """Write the run's metrics in the Prometheus textfile format."""
    from hpcrun.observe.collect import collect_status, spec_rpo
    from hpcrun.observe.export import write_textfile

    run_dir = _run_dir(run)
    view = collect_status(run_dir, rpo_s=spec_rpo(run_dir), every_rank=False).view
    click.echo(f"wrote {write_textfile(directory, view)}")


@click.command()
@click.argument("run")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row (for scripts).")
def metrics(run: str, as_csv: bool) -> None:
    """The training metrics per step (loss first), each step once: a step replayed after a
    restore shows the last incarnation's value. The same figures as status and the report."""
    from hpcrun.errors import RecordError
    from hpcrun.observe.collect import collect_status
    from hpcrun.observe.metrics import render_csv, render_table

    series = collect_status(_run_dir(run), every_rank=False).view.metrics
    if series is None or not series.names:
        raise RecordError(f"run {run!r} reported no numeric metric yet: pass them to "
                          "ctx.step_done(loss=..., name=value) and run `hpcrun metrics` again")
    if as_csv:
        click.echo(render_csv(series), nl=False)
        return
    click.echo(render_table(series))
    if series.replayed_steps:
        click.echo(f"({series.replayed_steps} step(s) replayed after a restore are shown once, "
                   "with the last incarnation's value)")


@click.command()
@click.argument("run")
@click.option("--manifest", is_flag=True, required=True, help="The post-run manifest.")
def show(run: str, manifest: bool) -> None:
    """Show the published post-run manifest of a finished run."""
    from hpcrun.observe.collect import default_record_reader
    from hpcrun.observe.postrun import read_manifest

    run_dir = _run_dir(run)
    result = default_record_reader(run_dir).result
    click.echo(json.dumps(read_manifest(run_dir, result), sort_keys=True, indent=1))


@click.command()
@click.option("--ckpt-cost", required=True, help="Exposed checkpoint cost C (30s, 2m, 45).")
@click.option("--mtbf", required=True, help="Mean time between interruptions M (6h).")
@click.option("--restore", default="0", show_default=True, help="Restore time R.")
@click.option("--downtime", default="0", show_default=True, help="Requeue downtime D.")
@click.option("--rpo", default=None, help="Recovery point objective: the interval cap.")
def plan(ckpt_cost: str, mtbf: str, restore: str, downtime: str, rpo: str | None) -> None:
    """Checkpoint interval (Young, Daly, RPO) and the expected waste table."""
    from hpcrun.checkpoint.cadence import (
        choose_interval,
        format_duration,
        parse_duration,
        waste_table,
    )

    c, m = parse_duration(ckpt_cost), parse_duration(mtbf)
    r, d = parse_duration(restore), parse_duration(downtime)
    p = choose_interval(cost_s=c, mtbf_s=m, restore_s=r, downtime_s=d,
                        rpo_s=parse_duration(rpo) if rpo else None)
    click.echo(f"Young  T = sqrt(2·C·M) = {p.young_s:.0f} s ({format_duration(p.young_s)})")
    click.echo(f"Daly   T = {p.daly_s:.0f} s ({format_duration(p.daly_s)})")
    click.echo(f"chosen T = {p.interval_s:.0f} s ({format_duration(p.interval_s)})"
               + ("  [capped by RPO]" if p.limited_by_rpo else "")
               + f"  expected waste {p.waste:.2%}")
    click.echo(f"\n{'interval':>12}  waste  (W = C/T + T/2M + (R+D)/M)")
    candidates = [60, 300, 600, 1800, 3600, 7200, p.young_s, p.interval_s]
    for t, w in waste_table([x for x in candidates if x < m], cost_s=c, mtbf_s=m, restore_s=r,
                            downtime_s=d):
        mark = "  <- chosen" if t == p.interval_s else ("  <- Young" if t == p.young_s else "")
        click.echo(f"{format_duration(t):>12}  {w:6.2%}{mark}")


COMMANDS = (status, list_runs, logs, report, export, metrics, show, plan)
"""Every command of this module, registered by ``hpcrun.cli.main``."""
