"""``hpcrun data``: build and inspect dataset manifests."""

from __future__ import annotations

from pathlib import Path

import click

from hpcrun.data.build import BuildOptions, build_manifest
from hpcrun.data.dataset import load_manifest
from hpcrun.data.manifest import DatasetManifest


@click.group()
def data() -> None:
    """Build and inspect dataset manifests (content digests, ranges, dataset ID)."""


@data.command("build")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="Manifest to write; indexes go next to it in <stem>.index/.")
@click.option("--split", default="train", show_default=True, help="Split label.")
@click.option("--min-tokens", type=int, default=None, help="Drop shorter records.")
@click.option("--max-tokens", type=int, default=None, help="Drop longer records.")
@click.option("--dedup", type=click.Choice(["none", "exact"]), default="none",
              show_default=True, help="Drop records identical to an earlier one.")
@click.option("--access", type=click.Choice(["public", "internal", "restricted"]),
              default="internal", show_default=True, help="Access scope of the objects.")
@click.option("--tokenizer", default="pretokenized", show_default=True,
              help="Tokenizer name.")
@click.option("--tokenizer-version", default="", help="Tokenizer version.")
@click.option("--vocab-size", type=int, default=None, help="Vocabulary size.")
@click.option("--vocab-digest", default=None, help="Digest of the vocabulary file.")
@click.option("--workers", type=int, default=None, help="Hashing processes (default: all).")
@click.option("--no-progress", is_flag=True, help="Do not draw a progress bar.")
def build(paths: tuple[str, ...], output: str, split: str, min_tokens: int | None,
          max_tokens: int | None, dedup: str, access: str, tokenizer: str,
          tokenizer_version: str, vocab_size: int | None, vocab_digest: str | None,
          workers: int | None, no_progress: bool) -> None:
    """Hash PATHS (NAME=PATH or PATH, one source each) and write a manifest."""
    options = BuildOptions(split=split, min_tokens=min_tokens, max_tokens=max_tokens,
                           dedup=dedup, access=access, workers=workers,
                           tokenizer={"name": tokenizer, "version": tokenizer_version,
                                      "vocab_size": vocab_size, "vocab_digest": vocab_digest})
    manifest = build_manifest(paths, output, options, progress=not no_progress)
    click.echo(f"{manifest.dataset_id}  {output}  ({len(manifest.sources)} sources, "
               f"{manifest.num_samples:,} samples)")


@data.command("inspect")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False))
def inspect(manifest: str) -> None:
    """Summarise MANIFEST: dataset ID, sources, objects, tokens, tokenizer."""
    click.echo(render_summary(load_manifest(manifest), manifest))


def render_summary(m: DatasetManifest, origin: str) -> str:
    """A short human summary of a manifest (pure)."""
    tok = m.tokenizer
    lines = [f"dataset   {m.dataset_id}", f"manifest  {Path(origin)}",
             f"samples   {m.num_samples:,} in {len(m.sources)} source(s)",
             f"tokenizer {tok.get('name')} {tok.get('version') or ''} "
             f"vocab={tok.get('vocab_size')}",
             f"packing   {m.packing.get('policy')}   sample IDs: {m.sample_id_rule}", ""]
    lines.append(f"{'source':<16}{'format':<7}{'split':<8}{'objects':>8}{'records':>12}"
                 f"{'tokens':>14}{'bytes':>14}  ids        filter/dedup/access")
    for s in m.sources:
        nbytes = sum(o.nbytes for o in s.objects)
        dropped = sum(o.records - o.kept for o in s.objects)
        lines.append(f"{s.name:<16}{s.format:<7}{s.split:<8}{len(s.objects):>8}"
                     f"{s.records:>12,}{s.tokens:>14,}{nbytes:>14,}  "
                     f"[{s.base}, {s.base + s.records})  {dict(s.filter)} {s.dedup} "
                     f"{s.access} (dropped {dropped})")
    return "\n".join(lines)
