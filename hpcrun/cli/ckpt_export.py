"""``hpcrun ckpt export``: a committed checkpoint as DCP or Hugging Face safetensors (parse → call
→ render; the library part is :mod:`hpcrun.checkpoint.export`)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hpcrun.vocab import CheckpointFormat

_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
               "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """``5GB`` / ``512MiB`` / ``1000`` → bytes (binary units); BadParameter when unreadable."""
    raw = text.strip().upper()
    digits = raw.rstrip("KMGIB")
    unit = raw[len(digits):]
    if not digits.isdigit() or unit not in _SIZE_UNITS or int(digits) < 1:
        raise click.BadParameter(f"expected a size such as 5GB, 512MiB or 1000000, got {text!r}")
    return int(digits) * _SIZE_UNITS[unit]


def _run_dir(run: str) -> Path:
    from hpcrun.launch.runref import resolve_run_dir

    return resolve_run_dir(run, environ=os.environ)


@click.command("export")
@click.argument("run")
@click.option("--format", "fmt", required=True,
              type=click.Choice([f.value for f in CheckpointFormat]),
              help="dcp: a torch.distributed.checkpoint directory; safetensors: the Hugging "
                   "Face layout (model.safetensors, or shards and model.safetensors.index.json).")
@click.option("--step", type=click.IntRange(min=0), help="Step of the checkpoint to export "
              "(default: the newest committed on the shared tier).")
@click.option("--ckpt", "ckpt_id", help="Checkpoint id to export (see `hpcrun ckpt ls`).")
@click.option("-o", "--out", type=click.Path(path_type=Path),
              help="Output directory (default: <run>/exports/<ckpt id>.<format>).")
@click.option("--include", "include", type=click.Choice(["optim"]), multiple=True,
              help="Also export the optimizer state (safetensors: optimizer.safetensors; DCP "
                   "carries it whenever its parameters can be named).")
@click.option("--state", "model", default="model", show_default=True,
              help="Name the model was registered under in ctx.restore(...).")
@click.option("--max-file-size", default="5GB", show_default=True,
              help="safetensors: largest file before the export is split into shards.")
@click.option("--force", is_flag=True, help="Replace an existing non-empty output directory.")
def export_cmd(run: str, fmt: str, step: int | None, ckpt_id: str | None, out: Path | None,
               include: tuple[str, ...], model: str, max_file_size: str, force: bool) -> None:
    """Write a committed checkpoint of RUN as DCP or safetensors, loadable by plain PyTorch or
    safetensors without hpcrun, with SHA256SUMS and hpcrun-export.json beside it."""
    from hpcrun.checkpoint.export import ExportRequest, export_checkpoint

    run_dir = _run_dir(run)
    req = ExportRequest(fmt=CheckpointFormat(fmt), out=out, step=step, ckpt_id=ckpt_id,
                        model=model, include_optim=True if "optim" in include else None,
                        force=force, max_file_bytes=parse_size(max_file_size))
    result = export_checkpoint(run_dir, req)
    click.echo(f"exported {result.ckpt_id} (step {result.step}) as {fmt}: {result.tensors} "
               f"tensors, {result.nbytes} bytes, {len(result.files)} files in {result.out}")
    click.echo(f"check it with: (cd {result.out} && sha256sum -c SHA256SUMS)")
