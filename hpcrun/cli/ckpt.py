"""``hpcrun ckpt``: list, verify, compare and garbage-collect a run's checkpoints (parse → call →
render). ``RUN`` is a run id, a unique prefix of one, or a run directory
(:mod:`hpcrun.launch.runref`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from hpcrun.control.log import RunLog
from hpcrun.errors import ConfigError, CorruptCheckpointError, HpcrunError, RecordError

if TYPE_CHECKING:
    from hpcrun.checkpoint import CommittedCheckpoint
    from hpcrun.checkpoint.audit import TierVerdict


def _run_dir(run: str) -> Path:
    from hpcrun.launch.runref import resolve_run_dir

    return resolve_run_dir(run, environ=os.environ)


def _committed(run: Path) -> list[CommittedCheckpoint]:
    from hpcrun.checkpoint import fold_checkpoints

    return fold_checkpoints(RunLog(run).read())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def _human_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def tier1_rpo_window(ckpts: Sequence[CommittedCheckpoint], i: int, now: float) -> float:
    """Tier-1 RPO window of checkpoint ``i``: cadence interval before it plus its drain lag."""
    c = ckpts[i]
    interval = c.committed_at - ckpts[i - 1].committed_at if i else 0.0
    lag = (c.shared_at if c.shared_at is not None else now) - c.committed_at
    return interval + max(lag, 0.0)


def render_ls(ckpts: Sequence[CommittedCheckpoint], now: float) -> Table:
    """The ``ckpt ls`` table (pure)."""
    table = Table(title="committed checkpoints (oldest first)")
    for col in ("id", "step", "gen", "tiers", "bytes", "age", "drained", "tier-1 RPO"):
        table.add_column(col, justify="right" if col in ("step", "gen", "bytes") else "left",
                         no_wrap=col == "id")
    for i, c in enumerate(ckpts):
        tiers = ",".join(t for t in ("node_local", "shared") if t in c.tiers)
        table.add_row(c.ckpt_id, str(c.step), str(c.generation), tiers, _human_bytes(c.bytes),
                      _human_s(now - c.committed_at), f"{len(c.drained)}/{len(c.nodes)}",
                      _human_s(tier1_rpo_window(ckpts, i, now)))
    return table


@click.group()
def ckpt() -> None:
    """Inspect and maintain a run's checkpoints."""


@ckpt.command("ls")
@click.argument("run")
def ls_cmd(run: str) -> None:
    """Per committed checkpoint: step, generation, tiers, bytes, age, tier-1 RPO exposure."""
    run_dir = _run_dir(run)
    ckpts = _committed(run_dir)
    if not ckpts:
        click.echo(f"no committed checkpoints in {run_dir}")
        return
    Console().print(render_ls(ckpts, time.time()))


@ckpt.command("verify")
@click.argument("run")
@click.argument("ckpt_id", required=False)
@click.option("--node-local-root", type=click.Path(file_okay=False, path_type=Path),
              help="Also check NODE's tier-0 copies under this root (run it on that node).")
@click.option("--node", default="", help="Node name of the tier-0 copies (with --node-local-root).")
def verify_cmd(run: str, ckpt_id: str | None, node_local_root: Path | None, node: str) -> None:
    """Re-read and check every committed checkpoint (or CKPT_ID) on the tiers where it is
    committed. Copies retention removed, tier-0 copies that are gone, and node-local copies
    this machine cannot reach are reported, not failed; exits non-zero only on damage."""
    from hpcrun.checkpoint.audit import AuditVerdict

    run_dir = _run_dir(run)
    ckpts = _committed(run_dir)
    if ckpt_id is not None and ckpt_id not in {c.ckpt_id for c in ckpts}:
        raise RecordError(f"no committed checkpoint {ckpt_id!r} in {run_dir}; "
                          f"see `hpcrun ckpt ls {run_dir.name}`")
    verdicts = _verify_all(run_dir, ckpts, _local_roots(run_dir, ckpts, node_local_root, node),
                           ckpt_id)
    click.echo(summarize_verdicts(verdicts))
    bad = sorted({v.ckpt_id for v in verdicts if v.verdict == AuditVerdict.FAILED})
    if bad:
        total = len({v.ckpt_id for v in verdicts})
        raise CorruptCheckpointError(f"{len(bad)} of {total} checkpoints failed: "
                                     f"{', '.join(bad)}; restore will skip them")


@ckpt.command("diff")
@click.argument("run_a")
@click.argument("run_b")
@click.option("--ckpt-a", help="Checkpoint id in RUN_A (default: its newest committed one).")
@click.option("--ckpt-b", help="Checkpoint id in RUN_B (default: its newest committed one).")
@click.option("--world-size", type=click.IntRange(min=1),
              help="Compare both as this many ranks would restore them (default: as written).")
@click.option("--ignore", "ignore", multiple=True, metavar="FAMILY",
              help="Leave out a state family: rng, or a top-level key of the saved state "
                   "(model, optim, data, ...); repeatable.")
def diff_cmd(run_a: str, run_b: str, ckpt_a: str | None, ckpt_b: str | None,
             world_size: int | None, ignore: tuple[str, ...]) -> None:
    """Compare two committed checkpoints on the shared tier bit for bit: every tensor and the
    meta tree (RNG streams, data cursor) of every rank, after the checksums are verified. Prints
    one line per difference; exits 1 when they differ (a determinism or exact-resume check).

    \b
    A script that never seeds every RNG differs in its RNG streams only:
      hpcrun ckpt diff RUN_A RUN_B --ignore rng
    """
    from hpcrun.drill.states import check_families, diff_states, find_committed, load_state

    dir_a, dir_b = _run_dir(run_a), _run_dir(run_b)
    a = load_state(dir_a, find_committed(dir_a, ckpt_a), world_size=world_size)
    b = load_state(dir_b, find_committed(dir_b, ckpt_b), world_size=world_size)
    check_families(ignore, a, b)
    diffs = diff_states(a, b, ignore=ignore)
    for line in diffs:
        click.echo(line)
    ignored = f" (ignored: {', '.join(sorted(set(ignore)))})" if ignore else ""
    click.echo(f"{a.ckpt_id} (step {a.step}) vs {b.ckpt_id} (step {b.step}) on "
               f"{a.world_size} ranks: " + (f"{len(diffs)} differences" if diffs else "identical")
               + ignored)
    sys.exit(1 if diffs else 0)


def _local_roots(run: Path, ckpts: Sequence[CommittedCheckpoint], root: Path | None,
                 node: str) -> dict[str, Path] | None:
    """Nodes whose tier 0 this machine reaches: the one named, or the local backend's."""
    if root is not None:
        if not node:
            raise ConfigError("--node-local-root needs --node NODE: the node whose tier-0 "
                              "copies live under that root")
        return {node: root}
    from hpcrun.launch.site import expand_path, load_site_snapshot
    from hpcrun.vocab import Backend

    try:
        site = load_site_snapshot(run)
        base = expand_path(site.node_local_path, os.environ)
    except HpcrunError:
        return None  # no usable site snapshot: tier 0 is out of reach
    if site.backend != Backend.LOCAL:
        return None  # a Slurm site's tier 0 lives on the compute nodes
    return {n: base / run.name / n for n in sorted({n for c in ckpts for n in c.nodes})}


def summarize_verdicts(verdicts: Sequence[TierVerdict]) -> str:
    """One line: how many copies were checked and what was found (pure)."""
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.verdict.value] = counts.get(v.verdict.value, 0) + 1
    parts = [f"{n} {word}" for word, n in sorted(counts.items())]
    return f"{len(verdicts)} copies of {len({v.ckpt_id for v in verdicts})} checkpoints: " \
        + ", ".join(parts)


def _verify_all(run: Path, ckpts: Sequence[CommittedCheckpoint],
                local: dict[str, Path] | None, only: str | None) -> list[TierVerdict]:
    from hpcrun.checkpoint.audit import verify_run

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("verifying", total=sum(c.bytes for c in ckpts) or None)
        verdicts = verify_run(run, ckpts, local_roots=local, only=only,
                              progress=lambda n: progress.advance(task, n))
        for v in verdicts:
            detail = f": {v.detail}" if v.detail and v.verdict != "ok" else ""
            progress.console.print(f"{v.ckpt_id} [{v.where}] {v.verdict.value}{detail}",
                                   highlight=False, soft_wrap=True, markup=False)
    return verdicts


@ckpt.command("gc")
@click.argument("run")
@click.option("--keep-last", default=2, show_default=True, type=click.IntRange(min=2),
              help="Committed checkpoints to keep on the shared tier.")
@click.option("--older-than", default=3600.0, show_default=True,
              help="Seconds after which an uncommitted directory counts as debris.")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
def gc_cmd(run: str, keep_last: int, older_than: float, dry_run: bool) -> None:
    """Remove staging debris and committed checkpoints beyond --keep-last (shared tier)."""
    from hpcrun.checkpoint import collect_run

    run_dir = _run_dir(run)
    report = collect_run(run_dir, log=RunLog(run_dir), keep_last=keep_last, now=time.time(),
                         older_than=older_than, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for name in report.retired:
        click.echo(f"{verb} retired checkpoint {name}")
    for name in report.debris:
        click.echo(f"{verb} debris {name}")
    if not report.retired and not report.debris:
        click.echo("nothing to collect")


def _add_export() -> None:
    from hpcrun.cli.ckpt_export import export_cmd

    ckpt.add_command(export_cmd)


_add_export()
