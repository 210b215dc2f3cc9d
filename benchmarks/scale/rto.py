"""Recovery time at 16,384 ranks / 2,048 nodes, projected phase by phase from measured figures.

    python -m benchmarks.scale --only rto [--json out.json]

A node loss with a hot spare goes through detect → swap → start → restore → first step
(:mod:`hpcrun.drill.rto`). Each phase is a per-node cost measured on this machine (the testbed's
spare swap and the warm restart of ``benchmarks/suite_restart.py``: :data:`PER_NODE`) plus what
grows with the number of nodes N or ranks R, measured here as far as one 2-vCPU machine allows
and extrapolated:

- **detect**: the staleness bound (:data:`hpcrun.runtime.node.membership.NODE_STALE_S`, or
  ``NODE_STALE_ECHO_S`` once the survivors' collectives lost a peer) plus one beat period;
  beats go over the network, so a shared-filesystem stall does not move it (the liveness
  files, read per file on this disk, are shown: they are off the path);
- **swap**: the decision and the new fence (log appends: constant in N), measured, plus their
  metadata operations (:mod:`benchmarks.scale.metaops`) at :data:`MDS_OPS_S`;
- **start**: the per-node part of a warm start (hand-off, process, imports, context,
  entrypoint, the script's setup; measured) plus the rendezvous: every rank's store operations
  (connect, set its address, join the counter, read the bootstrap key) served one after
  another by one TCPStore server, at the server CPU time per client measured in its own process
  with 256 and 1,024 clients, on top of the process groups of a 4-rank gang as measured in real
  restarts (the wall time of 16 to 1,024 clients on this host is shown too: it is bound by the
  clients, which a real gang runs on separate nodes, and by c10d's 5 s connect retries that
  this loaded host sometimes hits), plus a ring bootstrap
  (NCCL's: R - 1 hops of one small message) at the measured hop latency of this host's TCP;
- **restore**: restore planning at 16,384 ranks (the scale benchmark's figure, which this
  module does not rerun), every rank's restart metadata operations (counted by
  :mod:`benchmarks.scale.metaops`) served at :data:`MDS_OPS_S`, plus the bytes each node reads
  at the tier's rate (the seed's 30 GB at
  2 GB/s: the bytes per node do not grow with N; survivors read their own shards, the spare the
  lost node's from its partner's copy through the peer tier, measured at 0.96-1.3x a
  node-local restore by ``benchmarks/suite_partner.py``);
- **first step**: the measured first step plus one all-reduce across R ranks (a tree: 2 log2 R
  hops at the hop latency).

What this cannot show: contention of a real fabric and shared filesystem at 2,048 nodes, and
NCCL's communicator setup (no GPU here). The projection is a floor for those terms.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hpcrun.runtime.node.membership import (
    ALIVE_EVERY_S,
    NODE_STALE_ECHO_S,
    NODE_STALE_S,
    LivenessBeat,
    read_liveness,
)

BUDGET_S = {"detect": 15.0, "swap": 10.0, "start": 5.0 + 10.0, "restore": 15.0,
            "first_step": 0.0}
"""The seed's restart budget per phase (pod init 5 s and process-group init 10 s are start)."""
TARGET_S = 30.0
"""Crash to first validated step at 16,384 ranks with spares."""
TARGET_BUT_RESTORE_S = 6.0
"""Every phase but the restore, at 16,384 ranks."""
MDS_OPS_S = 50_000.0
"""The metadata server's rate the projection charges a restart's shared-filesystem operations
at (a Lustre MDS sustains some 10^4-10^5 ops/s; one run gets the whole of it here)."""
RESTORE_PLAN_16K_S = 0.654
"""Restore planning at 16,384 ranks (docs/performance.md, scale section)."""
SEED_BYTES_PER_NODE = 30e9
SEED_READ_RATE = 2e9


DETECT_EXTRA_S = 0.0
"""Detect beyond the staleness bound and the read period, as measured on the testbed: the
largest detect of the final tree was 3.4 s (the supervising node's loss, the 3 s bound; the
spare swaps, with the 1.5 s bound, 1.4-1.7 s), within bound + read period (3.5 s), so nothing
is added. (Earlier figures of 5.1-5.8 s counted from the first step of a test's per-step
pacing, not from the crash.)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class PerNode:
    """Per-node figures of one recovery, measured on this machine (seconds)."""

    detect_extra_s: float
    """Detect beyond the staleness bound and the read period: the survivors' gang exits and
    the decision (testbed, spare swap)."""
    swap_s: float
    """Decision → the new fence, in the same job (testbed, spare swap)."""
    start_local_s: float
    """The warm start without the rendezvous: hand-off, process, imports, context,
    entrypoint, the script's setup (suite_restart, warm, median)."""
    groups_s: float
    """The process groups as measured with 4 ranks (shown; replaced by the model at scale)."""
    first_step_s: float
    """The first step after the restore (tiny example)."""
    source: str
    """Where the figures come from."""


PER_NODE = PerNode(detect_extra_s=DETECT_EXTRA_S, swap_s=0.05, start_local_s=1.4,
                   groups_s=0.11, first_step_s=0.3,
                   source="the testbed's spare swap (tests/integration/test_spares_slurm.py: "
                          "detect, swap, first step, and the spare node's warm start without "
                          "the rendezvous); process groups of a 4-rank gang: "
                          "benchmarks/suite_restart.py warm medians (docs/performance.md)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """``a + b x n``."""

    a: float
    """Fixed part (seconds)."""
    b: float
    """Seconds per unit of n."""

    def at(self, n: float) -> float:
        return self.a + self.b * n


# -- measurements ----------------------------------------------------------------------------

def store_rendezvous_s(clients: int, *, burst: bool = False) -> float:
    """Wall time of ``clients`` ranks joining one TCPStore: connect, set an address, add to the
    counter, wait for the bootstrap key, read it (the store part of a process-group init).

    Clients start one after another (tens of µs apart), or all at once with ``burst``: on this
    host a burst of connects makes some of them retry after 5 s (c10d's connect backoff).
    """
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120),
                           wait_for_workers=False)
    ready = threading.Barrier(clients + 1 if burst else 1)
    errors: list[BaseException] = []

    def client(rank: int) -> None:
        try:
            ready.wait()
            store = dist.TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=120))
            store.set(f"addr/{rank}", f"127.0.0.1:{20000 + rank}")
            if store.add("joined", 1) == clients:
                store.set("bootstrap", "unique-id")
            store.wait(["bootstrap"])
            store.get("bootstrap")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    if burst:
        ready.wait()
        start = time.perf_counter()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"store rendezvous with {clients} clients failed: {errors[0]}")
    return took


_SERVER = """
import sys, os, datetime
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300),
                      wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()
"""


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_server_cpu_s(clients: int) -> float:
    """CPU seconds the TCPStore server (its own process) spends per client's rendezvous: the
    part one server does serially for every rank, whatever the number of nodes."""
    import torch.distributed as dist

    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = _cpu_s(server.pid)

        def client(rank: int) -> None:
            store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=120))
            store.set(f"addr/{rank}", f"127.0.0.1:{20000 + rank}")
            if store.add("joined", 1) == clients:
                store.set("bootstrap", "unique-id")
            store.wait(["bootstrap"])
            store.get("bootstrap")

        threads = [threading.Thread(target=client, args=(r,), daemon=True)
                   for r in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (_cpu_s(server.pid) - before) / clients
    finally:
        server.communicate("", timeout=30)


def hop_latency_s(rounds: int = 2000) -> float:
    """One-way latency of a small message over this host's TCP (half a ping-pong)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        for _ in range(rounds):
            c.sendall(b"x" * 16)
            c.recv(64)
        took = time.perf_counter() - start
    t.join(timeout=5)
    server.close()
    return took / rounds / 2


def liveness_read_s(nodes: int) -> float:
    """One supervisor round reading ``nodes`` liveness files written by real beats."""
    with tempfile.TemporaryDirectory(prefix="hpcrun-rto-") as tmp:
        run_dir = Path(tmp)
        for n in range(nodes):  # one real beat each, then stopped (the files stay)
            with LivenessBeat(run_dir, f"node{n:05d}", file_every_s=3600):
                pass
        names = [f"node{n:05d}" for n in range(nodes)]
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            beats = read_liveness(run_dir, names)
            runs.append(time.perf_counter() - start)
        assert len(beats) == nodes
    return statistics.median(runs)


def measure(*, clients: tuple[int, ...] = (16, 64, 256, 1024),
            liveness_nodes: int = 2048) -> dict[str, Any]:
    """What this machine can measure of the terms that grow with N."""
    store = [(n, statistics.median(store_rendezvous_s(n) for _ in range(5))) for n in clients]
    burst = [(n, max(store_rendezvous_s(n, burst=True) for _ in range(3))) for n in clients[:2]]
    server = [(n, store_server_cpu_s(n)) for n in clients if n >= 256]
    from benchmarks.scale import gloo, metaops

    counted = metaops.run([16384], tensors=2)
    meta = {"restart_per_rank": counted["rows"][0]["restart_per_rank"],
            "swap_decision_ops": counted["swap_decision_ops"]}
    return {"gloo": gloo.measure(), "metaops": meta, "store_rendezvous": store,
            "store_burst_worst": burst,
            "store_server_cpu": server,
            "hop_latency_s": hop_latency_s(),
            "liveness_nodes": liveness_nodes,
            "liveness_read_s": liveness_read_s(liveness_nodes)}


# -- projection (pure) ----------------------------------------------------------------------

def project(measured: dict[str, Any], *, ranks: int = 16384, ranks_per_node: int = 8,
            per_node: PerNode = PER_NODE, bytes_per_node: float = SEED_BYTES_PER_NODE,
            read_rate: float = SEED_READ_RATE, echo: bool = False) -> dict[str, Any]:
    """Each phase at ``ranks`` ranks: its per-node part, its part that grows, and the sum.

    Args:
        measured: :func:`measure`'s output.
        echo: the survivors' collectives lost a peer (the short staleness bound applies).
    """
    nodes = ranks // ranks_per_node
    # the fixed part: a small gang's process groups as measured in real restarts
    per_client = statistics.median(float(c) for _, c in measured["store_server_cpu"])
    store = Fit(a=per_node.groups_s, b=per_client)
    hop = float(measured["hop_latency_s"])
    per_file = float(measured["liveness_read_s"]) / int(measured["liveness_nodes"])
    bound = NODE_STALE_ECHO_S if echo else NODE_STALE_S
    modelled = store.at(ranks) + (ranks - 1) * hop
    agreed, agreement = 0.0, "not measured"
    if measured.get("gloo"):
        from benchmarks.scale import gloo

        # the groups connect lazily and the agreement is log2 n rounds: the log fit is the
        # model's shape (on 2 CPUs the 16-process point is mostly contention)
        fitted = gloo.fit(measured["gloo"], at=ranks)
        agreed = fitted["log"]["at_s"]
        agreement = f"log fit, {agreed:.2f} s at {ranks:,}"
    meta = measured.get("metaops") or {}
    meta_rank = float(meta.get("restart_per_rank", 0.0))
    restart_meta_s = meta_rank * ranks / MDS_OPS_S
    swap_meta_s = float(meta.get("swap_decision_ops", 0.0)) / MDS_OPS_S
    phases = {
        # beats are heard by a receiver thread and judged in memory: the liveness files (read
        # every FILE_EVERY_S as a fallback) are off the detection path
        "detect": (bound + ALIVE_EVERY_S + per_node.detect_extra_s, 0.0,
                   f"staleness {bound:g} s + beat period {ALIVE_EVERY_S:g} s + gang exit and "
                   f"decision {per_node.detect_extra_s:g} s; beats over the network, none of "
                   f"the {nodes:,} liveness files ({per_file * 1e6:.0f} µs each, a fallback "
                   "read every 5 s) on the path"),
        "swap": (per_node.swap_s, swap_meta_s,
                 f"decision, quarantine, new fence: log appends "
                 f"({meta.get('swap_decision_ops', 0):.0f} metadata ops at "
                 f"{MDS_OPS_S:,.0f} ops/s)"),
        "start": (per_node.start_local_s, max(modelled, agreed),
                  f"warm start without the rendezvous; the larger of: process groups of 4 "
                  f"ranks {store.a * 1e3:.0f} ms + "
                  f"{store.b * 1e6:.0f} µs of server CPU x {ranks:,} ranks (served one after "
                  f"another) + ring bootstrap {ranks - 1:,} hops x {hop * 1e6:.1f} µs = "
                  f"{modelled:.2f} s, and gloo group creation + one all-reduce measured at "
                  f"2-16 ranks, {agreement}"),
        "restore": (bytes_per_node / read_rate,
                    (RESTORE_PLAN_16K_S if ranks >= 16384 else 0.0) + restart_meta_s,
                    f"{bytes_per_node / 1e9:g} GB per node at {read_rate / 1e9:g} GB/s; "
                    f"restore planning {RESTORE_PLAN_16K_S:g} s at 16,384 ranks; "
                    f"{meta_rank:.1f} metadata ops per rank x {ranks:,} ranks at "
                    f"{MDS_OPS_S:,.0f} ops/s = {restart_meta_s:.2f} s"),
        "first_step": (per_node.first_step_s, 2 * math.ceil(math.log2(max(ranks, 2))) * hop,
                       "measured first step + one all-reduce (tree, 2 log2 R hops)"),
    }
    rows = {p: {"per_node_s": a, "grows_s": g, "total_s": a + g, "budget_s": BUDGET_S[p],
                "how": how} for p, (a, g, how) in phases.items()}
    total = sum(r["total_s"] for r in rows.values())
    return {"ranks": ranks, "nodes": nodes, "phases": rows, "total_s": total,
            "but_restore_s": total - rows["restore"]["total_s"],
            "budget_s": sum(BUDGET_S.values()), "target_s": TARGET_S, "echo": echo,
            "store_fit": {"a_s": store.a, "b_s_per_client": store.b},
            "per_node_source": per_node.source}


def run(ranks: int = 16384) -> dict[str, Any]:
    """Measure, then project a node loss with a spare (both staleness bounds)."""
    measured = measure()
    return {"measured": measured, "silent": project(measured, ranks=ranks),
            "echo": project(measured, ranks=ranks, echo=True)}


def render(result: dict[str, Any]) -> str:
    """The projection as a Markdown table, with the measured inputs under it."""
    silent, echo = result["silent"], result["echo"]
    lines = [f"| phase | seed budget | per node (measured) | grows with N | projected at "
             f"{silent['ranks']:,} ranks / {silent['nodes']:,} nodes | how |",
             "|---|---|---|---|---|---|"]
    for name, row in silent["phases"].items():
        lines.append(f"| {name} | {row['budget_s']:g} s | {row['per_node_s']:.2f} s | "
                     f"{row['grows_s']:.2f} s | {row['total_s']:.2f} s | {row['how']} |")
    lines.append(f"| total | {silent['budget_s']:g} s | | | {silent['total_s']:.1f} s "
                 f"({echo['total_s']:.1f} s when the survivors saw the peer go) | |")
    m = result["measured"]
    store = ", ".join(f"{n:,}: {s * 1e3:.1f} ms" for n, s in m["store_rendezvous"])
    cpu = ", ".join(f"{n:,}: {c * 1e6:.0f} µs" for n, c in m["store_server_cpu"])
    burst = ", ".join(f"{n:,}: {s * 1e3:.1f} ms" for n, s in m.get("store_burst_worst", []))
    ok = silent["total_s"] <= silent["target_s"]
    if m.get("gloo"):
        from benchmarks.scale import gloo

        lines += ["", gloo.render(m["gloo"], gloo.fit(m["gloo"], at=silent["ranks"]))]
    return "\n".join([*lines, "",
                      f"- TCPStore rendezvous measured (clients: wall): {store}",
                      f"- the same, every client connecting at once (worst of 3): {burst}",
                      f"- TCPStore server CPU per client (clients: CPU): {cpu}",
                      f"- TCP hop latency (one way): {m['hop_latency_s'] * 1e6:.1f} µs; one "
                      f"round of {m['liveness_nodes']:,} liveness reads: "
                      f"{m['liveness_read_s'] * 1e3:.1f} ms",
                      f"- crash → first step at {silent['ranks']:,} ranks ≤ "
                      f"{silent['target_s']:g} s: {'met' if ok else 'NOT met'} "
                      f"({silent['total_s']:.1f} s)",
                      f"- every phase but the restore ≤ {TARGET_BUT_RESTORE_S:g} s: "
                      f"{'met' if silent['but_restore_s'] <= TARGET_BUT_RESTORE_S else 'NOT met'}"
                      f" ({silent['but_restore_s']:.2f} s; {echo['but_restore_s']:.2f} s when "
                      "the survivors saw the peer go)"])
