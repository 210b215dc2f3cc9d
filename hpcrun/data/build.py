"""``hpcrun data build``: resolve paths and aliases, hash every object on every core, write a
manifest and its digest-pinned indexes.

The effectful shell is :func:`build_manifest`; choosing which records survive filtering and
deduplication (:func:`select_records`) and assembling entries are pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from hpcrun.data.dataset import index_path, write_index
from hpcrun.data.formats import ObjectFormat, ObjectScan, detect_format, scan_object
from hpcrun.data.manifest import DatasetManifest, ObjectEntry, SourceEntry, digest_arrays
from hpcrun.errors import DataError
from hpcrun.storage import LOCAL_STORAGE
from hpcrun.version import __version__

__all__ = ["BuildOptions", "build_manifest", "parse_source_arg", "resolve_source",
           "select_records"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildOptions:
    """How ``data build`` turns objects into a manifest."""

    split: str = "train"
    """Split label of every source."""
    min_tokens: int | None = None
    """Drop records shorter than this many tokens."""
    max_tokens: int | None = None
    """Drop records longer than this many tokens."""
    dedup: str = "none"
    """``none`` or ``exact``: drop records whose tokens equal an earlier record of the source."""
    access: str = "internal"
    """Access scope recorded for every source."""
    tokenizer: Mapping[str, Any] = field(
        default_factory=lambda: {"name": "pretokenized", "version": "", "vocab_size": None,
                                 "vocab_digest": None})
    """Tokenizer the tokens were produced with (name, version, vocab size and digest)."""
    transforms: tuple[str, ...] = ()
    """Named transforms the run applies, in order."""
    packing: str = "concat"
    """Packing policy the data is meant for."""
    workers: int | None = None
    """Hashing processes; ``None`` = every core."""

    def __post_init__(self) -> None:
        if self.dedup not in ("none", "exact"):
            raise DataError(f"dedup must be 'none' or 'exact', found {self.dedup!r}")
        if self.access not in ("public", "internal", "restricted"):
            raise DataError(f"access must be public, internal or restricted, found "
                            f"{self.access!r}")
        lo, hi = self.min_tokens, self.max_tokens
        if lo is not None and hi is not None and lo > hi:
            raise DataError(f"min_tokens {lo} exceeds max_tokens {hi}; swap them")


def parse_source_arg(arg: str) -> tuple[str, str]:
    """``name=PATH`` → (name, PATH); a bare ``PATH`` is named after its last component."""
    name, sep, path = arg.partition("=")
    if sep and name and "/" not in name:
        return name, path
    return Path(arg.rstrip("/")).stem or arg, arg


def resolve_source(given: str) -> tuple[ObjectFormat, list[str]]:
    """Follow aliases and symlinks to immutable object paths, sorted, of one format.

    Raises:
        DataError: missing path, empty directory, or mixed formats.
    """
    root = os.path.realpath(given)
    if os.path.isfile(root):
        return detect_format(root), [root]
    if not os.path.isdir(root):
        raise DataError(f"data path {given!r} (resolved {root!r}) does not exist; check it")
    paths = [os.path.join(root, n) for n in sorted(os.listdir(root)) if not n.startswith(".")]
    paths = [p for p in paths if os.path.isfile(p)]
    formats = {detect_format(p) for p in paths}
    if len(formats) != 1:
        raise DataError(f"data directory {given!r} must hold objects of exactly one format, "
                        f"found {sorted(formats) or 'none'}; split it into one source per format")
    return formats.pop(), paths


def select_records(scans: Sequence[ObjectScan], options: BuildOptions) -> list[np.ndarray]:
    """Physical record numbers kept per object, after the length filter and exact dedup."""
    seen: set[int] = set()
    out = []
    for scan in scans:
        keep = np.ones(scan.lengths.size, dtype=bool)
        if options.min_tokens is not None:
            keep &= scan.lengths >= options.min_tokens
        if options.max_tokens is not None:
            keep &= scan.lengths <= options.max_tokens
        if options.dedup == "exact":
            keep &= _first_seen(scan.record_hashes, seen)
        out.append(np.flatnonzero(keep).astype(np.int64))
    return out


def _first_seen(hashes: np.ndarray, seen: set[int]) -> np.ndarray:
    first = np.zeros(hashes.size, dtype=bool)
    for i, h in enumerate(hashes.tolist()):
        if h not in seen:
            seen.add(h)
            first[i] = True
    return first


def build_manifest(args: Sequence[str], out: str | os.PathLike[str],
                   options: BuildOptions | None = None, *, progress: bool = True,
                   executor: Executor | None = None) -> DatasetManifest:
    """Build and durably write a manifest (and its indexes) for the given paths/aliases.

    Args:
        args: ``name=PATH`` or ``PATH`` entries, one per source.
        out: Manifest path; indexes go to ``<out stem>.index/``.
        options: Filtering, dedup, tokenizer and provenance options.
        progress: Show a progress bar on stderr while hashing.
        executor: Where to scan objects (default: a process pool over every core).

    Returns:
        The written :class:`DatasetManifest`.
    """
    options = options or BuildOptions()
    named = [parse_source_arg(a) for a in args]
    resolved = [(name, given, *resolve_source(given)) for name, given in named]
    jobs = [(p, str(fmt)) for _, _, fmt, paths in resolved for p in paths]
    scans = _scan_all(jobs, options, progress, executor)
    sources, base = [], 0
    for name, given, fmt, paths in resolved:
        src = _source_entry(name, given, fmt, [scans[p] for p in paths], options, base, out)
        sources.append(src)
        base += src.records
    manifest = DatasetManifest(
        sources=tuple(sources), tokenizer=dict(options.tokenizer),
        transforms=options.transforms, packing={"policy": options.packing},
        provenance={"builder": f"hpcrun {__version__}", "inputs": list(args)})
    LOCAL_STORAGE.write_atomic(out, manifest.to_json().encode())
    return manifest


def _scan_all(jobs: list[tuple[str, str]], options: BuildOptions, progress: bool,
              executor: Executor | None) -> dict[str, ObjectScan]:
    with_hashes = options.dedup == "exact"
    own = executor is None
    pool = executor or ProcessPoolExecutor(max_workers=options.workers or os.cpu_count())
    try:
        futures = [pool.submit(scan_object, p, f, with_hashes) for p, f in jobs]
        return _collect(futures, sum(os.path.getsize(p) for p, _ in jobs), progress)
    finally:
        if own:
            pool.shutdown()


def _collect(futures: list[Any], total: int, progress: bool) -> dict[str, ObjectScan]:
    out: dict[str, ObjectScan] = {}
    columns = (TextColumn("hashing"), BarColumn(), TextColumn("{task.completed:,.0f}/"
               "{task.total:,.0f} B"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("hash", total=total)
        for fut in as_completed(futures):
            scan: ObjectScan = fut.result()
            out[scan.path] = scan
            bar.advance(task, scan.nbytes)
    return out


def _source_entry(name: str, given: str, fmt: ObjectFormat, scans: list[ObjectScan],
                  options: BuildOptions, base: int,
                  out: str | os.PathLike[str]) -> SourceEntry:
    kept = select_records(scans, options)
    objects, start = [], 0
    for scan, records in zip(scans, kept, strict=True):
        objects.append(_object_entry(scan, records, start, out))
        start += records.size
    return SourceEntry(name=name, given=given, format=fmt, base=base, records=start,
                       tokens=sum(o.tokens for o in objects), objects=tuple(objects),
                       split=options.split, dedup=options.dedup, access=options.access,
                       filter={"min_tokens": options.min_tokens,
                               "max_tokens": options.max_tokens})


def _object_entry(scan: ObjectScan, records: np.ndarray, start: int,
                  out: str | os.PathLike[str]) -> ObjectEntry:
    lengths = scan.lengths[records]
    arrays = {"records": records, "lengths": lengths, "offsets": scan.offsets}
    index_digest = digest_arrays(**arrays)
    write_index(index_path(out, index_digest), arrays)
    return ObjectEntry(path=scan.path, digest=scan.digest, nbytes=scan.nbytes,
                       records=int(scan.lengths.size), kept=int(records.size), start=start,
                       tokens=int(lengths.sum()), index_digest=index_digest)

