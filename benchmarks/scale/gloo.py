"""Host agreement: gloo process-group creation and the step agreement at 2, 4, 8, 16 ranks.

Each rank is its own process on this machine (127.0.0.1, a TCPStore rendezvous as
``init_process_group`` makes it); the ranks wait on one barrier with torch imported, then
time ``init_process_group``, one 1-element all-reduce, and :data:`AGREEMENTS` step agreements
both ways (gloo's ring all-reduce of 4 int64, and the recursive doubling a run uses,
:func:`hpcrun.launch.hostsum.tree_sum`), and count the sockets each rank holds: every gang
lazily connected (``TORCH_GLOO_LAZY_INIT=1``, what a run does) and eager (gloo's default
full mesh). The gang's figure is its slowest rank. Both a linear fit (``a + b n``) and a
log fit (``a + b log2 n``) of the lazy gangs' creation and first all-reduce are made over the
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
AGREEMENTS = 20
"""Step agreements timed per gang (each rank's median, the gang's slowest rank)."""


def _sockets() -> int:
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


def _rank(rank: int, world: int, port: int, lazy: bool, barrier: Any, out: Any) -> None:
    import os

    os.environ["TORCH_GLOO_LAZY_INIT"] = "1" if lazy else "0"
    import torch
    import torch.distributed as dist

    from hpcrun.launch.hostsum import tree_sum

    barrier.wait()
    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t1 = time.perf_counter()
    sockets = _sockets()
    x = torch.ones(1)
    dist.all_reduce(x)
    t2 = time.perf_counter()
    assert int(x.item()) == world, x
    ring, tree = [], []
    for _ in range(AGREEMENTS):  # the step agreement: 4 int64, each way
        a = time.perf_counter()
        dist.all_reduce(torch.ones(4, dtype=torch.int64))
        b = time.perf_counter()
        assert tree_sum([1, 1, 1, 1]) == [world] * 4
        ring.append(b - a)
        tree.append(time.perf_counter() - b)
    out.put((rank, t1 - t0, t2 - t1, sockets, _sockets(), statistics.median(ring),
             statistics.median(tree)))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gang_once(world: int, *, lazy: bool = True) -> dict[str, float]:
    """One gang of ``world`` processes: its slowest rank's group creation, first all-reduce
    and step agreements (ring all-reduce, recursive doubling), and the sockets a rank holds
    after the group formed and after the agreements (the median rank)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(world), ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, lazy, barrier, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = [out.get(timeout=300) for _ in range(world)]
    for p in procs:
        p.join(timeout=60)
    # sockets: the median rank's (rank 0 also holds the store's connection to every rank)
    return {"init_s": max(g[1] for g in got), "allreduce_s": max(g[2] for g in got),
            "sockets_init": statistics.median(g[3] for g in got),
            "sockets_end": statistics.median(g[4] for g in got),
            "ring_s": max(g[5] for g in got), "tree_s": max(g[6] for g in got)}


def measure(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> list[dict[str, float]]:
    """Medians per gang size, lazily connected (what a run does) and eager (gloo's default)."""
    rows = []
    for n in sizes:
        lazy = [gang_once(n, lazy=True) for _ in range(repeats)]
        eager = [gang_once(n, lazy=False) for _ in range(repeats)]
        row: dict[str, float] = {"ranks": n}
        for key in lazy[0]:
            row[key] = statistics.median(r[key] for r in lazy)
            row[f"eager_{key}"] = statistics.median(r[key] for r in eager)
        rows.append(row)
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


def _pair(row: dict[str, float], key: str) -> str:
    return f"{row.get(key, math.nan):.0f} ({row.get(f'eager_{key}', math.nan):.0f})"


def render(rows: list[dict[str, float]], fitted: dict[str, Any]) -> str:
    lines = ["| ranks | group creation, lazy (eager) | sockets per rank after creation, lazy "
             "(eager) | after the agreements, lazy (eager) | one all-reduce | step agreement: "
             "ring all-reduce / recursive doubling |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {int(r['ranks'])} | {r['init_s'] * 1e3:.0f} ms "
              f"({r.get('eager_init_s', math.nan) * 1e3:.0f} ms) | "
              f"{_pair(r, 'sockets_init')} | {_pair(r, 'sockets_end')}"
              f" | {r['allreduce_s'] * 1e3:.1f} ms | {r.get('ring_s', math.nan) * 1e3:.2f} ms / "
              f"{r.get('tree_s', math.nan) * 1e3:.2f} ms |" for r in rows]
    lin, log = fitted["linear"], fitted["log"]
    return "\n".join([*lines, "",
                      f"- linear fit {lin['a_s'] * 1e3:.0f} ms + {lin['b_s'] * 1e3:.1f} ms x n "
                      f"(squared error {lin['sse']:.2g}): {lin['at_s']:.1f} s at "
                      f"{fitted['at']:,}; log fit {log['a_s'] * 1e3:.0f} ms + "
                      f"{log['b_s'] * 1e3:.1f} ms x log2 n (squared error {log['sse']:.2g}): "
                      f"{log['at_s']:.2f} s; the {fitted['best']} fit fits better",
                      "- per step at 16,384 ranks, by the count of sequential messages: ring "
                      "2 x 16,383 = 32,766, recursive doubling log2 16,384 = 14 rounds"])
