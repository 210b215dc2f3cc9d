"""Shared plumbing of ``python -m benchmarks``: repeats, medians, ratios, cache drops, output.

Every comparison runs its contenders side by side, interleaved within each repeat (A, B, C, A,
B, C, ...), so a burst of load from another process hits all of them alike; the reported
figure is the median of the repeats, and ratios are taken between medians of the same run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches(files_under: Path | None = None) -> str:
    """Drop the page cache before a cold read; returns how it was done (for the output).

    As root: ``sync; echo 3 > /proc/sys/vm/drop_caches`` (the whole machine). Otherwise every
    file under ``files_under`` is fsynced and ``posix_fadvise(DONTNEED)``-ed.
    """
    os.sync()
    with contextlib.suppress(OSError):
        DROP_CACHES.write_text("3\n")
        return "global: sync; echo 3 > /proc/sys/vm/drop_caches (root)"
    for p in (files_under.rglob("*") if files_under else ()):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "per file: fsync + posix_fadvise(DONTNEED) (not root)"


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass(kw_only=True, slots=True)
class Samples:
    """Repeated measurements of named figures (seconds, rates, bytes)."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(float(value))

    def median(self, name: str) -> float | None:
        v = self.values.get(name)
        return statistics.median(v) if v else None

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.values.items() if v}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both are known and ``b`` is not zero."""
    return a / b if a is not None and b else None


def verdict(value: float | None, target: float, *, at_least: bool) -> str:
    """``met`` / ``NOT met`` / ``n/a`` for a figure against its target."""
    if value is None:
        return "n/a"
    ok = value >= target if at_least else value <= target
    return "met" if ok else "NOT met"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import numpy
    import torch

    mem = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    return {"cpus": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "torch_threads": torch.get_num_threads(),
            "loadavg_start": os.getloadavg()}


def fmt(value: Any, digits: int = 3) -> str:
    """A figure for a Markdown cell."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Markdown table lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(fmt(c) for c in r) + " |" for r in rows)]


@contextlib.contextmanager
def section(results: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Collect one section's figures; a failing section is recorded, not fatal to the run."""
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        yield out
    except Exception as exc:  # one broken comparison must not lose the others' figures
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(f"   {name} failed: {out['error']}", flush=True)
    out["section_wall_s"] = time.perf_counter() - t0
    results[name] = out
    print(f"   {name}: {out['section_wall_s']:.0f} s", flush=True)


def write_results(results: Mapping[str, Any], markdown: str, out_dir: Path) -> tuple[Path, Path]:
    """``<out_dir>/<date>.json`` and ``<out_dir>/<date>.md`` (date and time, UTC)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    js, md = out_dir / f"{stamp}.json", out_dir / f"{stamp}.md"
    js.write_text(json.dumps(results, indent=1, default=str) + "\n")
    md.write_text(markdown + "\n")
    return js, md
