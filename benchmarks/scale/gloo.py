"""Host agreement: gloo process-group creation and one all-reduce at 2, 4, 8 and 16 ranks.

Each rank is its own process on this machine (127.0.0.1, a TCPStore rendezvous as
``init_process_group`` makes it); the ranks wait on one barrier with torch imported, then
time ``init_process_group`` and one 1-element all-reduce. The gang's figure is its slowest
rank. Both a linear fit (``a + b n``) and a log fit (``a + b log2 n``) are made over the
medians; the one with the smaller squared error is extrapolated to 16,384 ranks
(:func:`fit`), and :mod:`benchmarks.scale.rto` carries it into the start phase.

What this cannot show: 16 ranks share 2 vCPUs here, so the figures include CPU contention
that separate nodes do not have, and a real fabric's latency, which this host's loopback
does not.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

SIZES = (2, 4, 8, 16)
REPEATS = 3


def _rank(rank: int, world: int, port: int, barrier: Any, out: Any) -> None:
    import torch
    import torch.distributed as dist

    barrier.wait()
    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t1 = time.perf_counter()
    x = torch.ones(1)
    dist.all_reduce(x)
    t2 = time.perf_counter()
    assert int(x.item()) == world, x
    out.put((rank, t1 - t0, t2 - t1))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gang_once(world: int) -> tuple[float, float]:
    """(group creation, all-reduce) of the slowest rank of one gang of ``world`` processes."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(world), ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, barrier, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = [out.get(timeout=300) for _ in range(world)]
    for p in procs:
        p.join(timeout=60)
    return max(g[1] for g in got), max(g[2] for g in got)


def measure(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> list[dict[str, float]]:
    """Median group creation and all-reduce (slowest rank) per gang size."""
    rows = []
    for n in sizes:
        runs = [gang_once(n) for _ in range(repeats)]
        rows.append({"ranks": n, "init_s": statistics.median(r[0] for r in runs),
                     "allreduce_s": statistics.median(r[1] for r in runs)})
    return rows


def _least_squares(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    return a, b, sum((a + b * x - y) ** 2 for x, y in zip(xs, ys, strict=True))


def fit(rows: list[dict[str, float]], *, at: int = 16384) -> dict[str, Any]:
    """Linear and log fits of group creation + all-reduce; the better one at ``at`` ranks."""
    ns = [float(r["ranks"]) for r in rows]
    ys = [r["init_s"] + r["allreduce_s"] for r in rows]
    lin = _least_squares(ns, ys)
    log = _least_squares([math.log2(n) for n in ns], ys)
    best = "log" if log[2] <= lin[2] else "linear"
    a, b, _ = log if best == "log" else lin
    x = math.log2(at) if best == "log" else float(at)
    return {"best": best, "a_s": a, "b_s": b, "at": at, "projected_s": a + b * x,
            "linear": {"a_s": lin[0], "b_s": lin[1], "sse": lin[2], "at_s": lin[0] + lin[1] * at},
            "log": {"a_s": log[0], "b_s": log[1], "sse": log[2],
                    "at_s": log[0] + log[1] * math.log2(at)}}


def render(rows: list[dict[str, float]], fitted: dict[str, Any]) -> str:
    lines = ["| ranks | group creation | one all-reduce |", "|---|---|---|"]
    lines += [f"| {int(r['ranks'])} | {r['init_s'] * 1e3:.0f} ms | "
              f"{r['allreduce_s'] * 1e3:.1f} ms |" for r in rows]
    lin, log = fitted["linear"], fitted["log"]
    return "\n".join([*lines, "",
                      f"- linear fit {lin['a_s'] * 1e3:.0f} ms + {lin['b_s'] * 1e3:.1f} ms x n "
                      f"(squared error {lin['sse']:.2g}): {lin['at_s']:.1f} s at "
                      f"{fitted['at']:,}; log fit {log['a_s'] * 1e3:.0f} ms + "
                      f"{log['b_s'] * 1e3:.1f} ms x log2 n (squared error {log['sse']:.2g}): "
                      f"{log['at_s']:.2f} s; the {fitted['best']} fit fits better"])
