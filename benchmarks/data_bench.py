"""Data-plane benchmarks: permutation throughput/memory, loader rate vs raw reads.

Run with ``python -m benchmarks.data_bench`` (under two minutes on a 2-core machine). Prints one
JSON object per measurement and a short table.

- Permutation: ``Permutation.take`` indices/s at ``n = 2**20 + 1`` (worst case for
  cycle-walking: half the Feistel domain is out of range) and ``n = 1e8``; peak traced memory of
  ``take`` on a fixed batch for ``n = 1e3`` and ``n = 1e15`` (independent of ``n``); and
  ``numpy.random.permutation(1e8)`` for reference (time and the 800 MB it materialises).
- Loader: raw sequential read rate of the dataset's files (page cache warm, as in the loader
  run) versus tokens and bytes per second delivered by :class:`DataPipeline`, with 1 and 4
  reader threads and with the reader processes this process's CPU share allows.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from hpcrun.data import DataPipeline, Permutation, build_manifest, write_token_shards
from hpcrun.data.workers import reader_workers


def _emit(name: str, **values: Any) -> dict[str, Any]:
    row = {"bench": name, **values}
    print(json.dumps(row), flush=True)
    return row


def bench_permutation_rate(n: int, count: int) -> dict[str, Any]:
    p = Permutation(n, seed=1, epoch=0)
    idx = np.arange(count, dtype=np.int64)
    p.take(idx[:1000])
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        p.take(idx)
        best = min(best, time.perf_counter() - t0)
    return _emit("permutation_take", n=n, indices=count, seconds=best,
                 m_indices_per_s=count / best / 1e6)


def bench_permutation_memory(batch: int) -> list[dict[str, Any]]:
    rows = []
    for n in (1_000, 10**15):
        p = Permutation(n, seed=1, epoch=0)
        idx = np.arange(min(batch, n), dtype=np.int64)
        tracemalloc.start()
        p.take(idx)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append(_emit("permutation_memory", n=n, batch=idx.size,
                          peak_mib=peak / 2**20, state_bytes=p._keys.nbytes))
    return rows


def bench_numpy_permutation(n: int) -> dict[str, Any]:
    tracemalloc.start()
    t0 = time.perf_counter()
    out = np.random.default_rng(0).permutation(n)
    dt = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del out
    return _emit("numpy_permutation", n=n, seconds=dt, m_indices_per_s=n / dt / 1e6,
                 peak_mib=peak / 2**20)


def _raw_read_rate(paths: list[Path]) -> tuple[float, int]:
    t0 = time.perf_counter()
    nbytes = 0
    for path in paths:
        with open(path, "rb") as fh:
            nbytes += len(fh.read())
    return nbytes / (time.perf_counter() - t0), nbytes


def bench_loader(root: Path, docs: int, batches: int, workers: int,
                 executor: str = "thread") -> dict[str, Any]:
    paths = write_token_shards(root / "tok", docs, vocab=32_000, seed=0, min_len=64,
                               max_len=2048)
    if not (root / "m.json").exists():
        build_manifest([str(root / "tok")], root / "m.json", progress=False)
    raw_bps, nbytes = _raw_read_rate(paths)
    tokens_on_disk = sum(int(np.load(p, mmap_mode="r").size) for p in paths)
    pipe = DataPipeline(root / "m.json", seed=0, global_batch=32, seq_len=1024,
                        workers=workers, executor=executor, prefetch_batches=4)
    next(pipe)  # readers started
    t0 = time.perf_counter()
    delivered = 0
    for _, batch in zip(range(batches), pipe, strict=False):
        delivered += batch["tokens"].size
    dt = time.perf_counter() - t0
    summary = pipe.metrics.summary()
    pipe.close()
    raw_tps = raw_bps / (nbytes / tokens_on_disk)
    return _emit("loader", executor=executor, workers=workers, batches=batches,
                 raw_read_mib_s=raw_bps / 2**20,
                 raw_read_tokens_per_s=raw_tps, delivered_tokens_per_s=delivered / dt,
                 delivered_over_raw=delivered / dt / raw_tps,
                 time_to_batch_p50_s=summary["time_to_batch_p50_s"],
                 time_to_batch_p99_s=summary["time_to_batch_p99_s"],
                 input_wait_mean_s=summary["input_wait_mean_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    bench_permutation_rate(2**20 + 1, 2**20 + 1)
    bench_permutation_rate(10**8, 10**7 // scale)
    bench_permutation_memory(1_000)
    bench_numpy_permutation(10**8 // scale)
    with tempfile.TemporaryDirectory() as tmp:
        for executor, workers in (("thread", 1), ("thread", 4), ("process", reader_workers())):
            bench_loader(Path(tmp), docs=2000 // scale, batches=40 // scale, workers=workers,
                         executor=executor)
    print(f"cpus={os.cpu_count()}", flush=True)


if __name__ == "__main__":
    main()
