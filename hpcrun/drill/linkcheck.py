"""``hpcrun preflight``'s links between nodes: a pairwise all-reduce bandwidth check.

The within-node NCCL check (:func:`hpcrun.drill.preflight.nccl_bandwidth_check`) cannot see a
bad link between two nodes. This check can:

1. One rank per node starts: on Slurm an ``srun`` step over the spec's nodes (a new allocation
   from a login node, a step of the current one inside ``salloc``/``sbatch``,
   :func:`srun_argv`); on the local backend one process per emulated node (at most
   :data:`LOCAL_MAX_NODES`). The ranks form one process group: NCCL when CUDA is present
   on Slurm, gloo otherwise (always gloo locally).
2. The pairs are measured in rounds of disjoint pairs, a round-robin tournament schedule
   (:func:`round_robin_rounds`): n-1 rounds for n nodes (n rounds when n is odd, one node
   sitting out each), so every pair is measured once and each node is in one pair at a time,
   as it would be in a ring. A barrier separates the rounds.
3. In a round, each pair runs an all-reduce of two ranks as a send/recv exchange of a fixed
   buffer followed by the sum: :data:`WARMUP` untimed in a first pass over the rounds, then
   one timed in each of :data:`TIMED` passes; the pair's figure is the median of its timed
   ones, as bus bandwidth (for two ranks, bytes / seconds).
4. Rank 0 prints one line (:data:`MARKER` + JSON) with the node names and per-pair seconds;
   the caller turns it into one row (:func:`link_verdict`): the median pair bandwidth and the
   slowest pair, failing when that pair is below :data:`SLOW_LINK_FRACTION` of the median.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hpcrun.drill.contracts import ContractResult
from hpcrun.errors import FormatError

Check = ContractResult
ROW = "node links"
"""The name of the preflight row."""
SLOW_LINK_FRACTION = 0.5
"""The slowest pair fails the row when its bandwidth is below this fraction of the median
pair's. Links of one fabric run within a few percent of each other; a pair at half the median
has a degraded link (a port down to a lower rate, a bad cable, a congested or misrouted path)
that slows every collective of a run placed on both nodes to its pace."""
CPU_BYTES = 4 << 20
"""Bytes each pair all-reduces on CPU (gloo): small, so a 2-core test machine runs it in
seconds."""
GPU_BYTES = 256 << 20
"""Bytes each pair all-reduces on GPU (NCCL): large enough to reach link bandwidth."""
WARMUP = 3
"""Untimed all-reduces per pair (connection setup, buffers)."""
TIMED = 11
"""Timed all-reduces per pair, one per pass over all rounds; the pair's time is their
median."""
LOCAL_MAX_NODES = 4
"""Emulated nodes the local backend measures (every one is a process on this machine)."""
MARKER = "HPCRUN_LINKCHECK "
"""Prefix of the one result line rank 0 prints."""
BACKEND_ENV = "HPCRUN_LINKCHECK_BACKEND"
"""Overrides the process group backend of the ranks (the local backend sets ``gloo``)."""
BYTES_ENV = "HPCRUN_LINKCHECK_BYTES"
"""Overrides the bytes each pair all-reduces."""


# -- the pure part -----------------------------------------------------------------------------

def round_robin_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The circle method: rounds of disjoint pairs ``(a, b)``, ``a < b``, covering every pair
    of ``0..n-1`` exactly once; n-1 rounds for even n, n for odd n (one rank sits out each)."""
    if n < 2:
        return []
    slots = list(range(n)) + ([-1] if n % 2 else [])  # -1: the bye
    size = len(slots)
    rounds = []
    for _ in range(size - 1):
        pairs = [(slots[i], slots[size - 1 - i]) for i in range(size // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a >= 0 and b >= 0))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def partner(pairs: Sequence[tuple[int, int]], rank: int) -> int | None:
    """``rank``'s peer in one round, or None when it sits out."""
    for a, b in pairs:
        if rank in (a, b):
            return b if rank == a else a
    return None


def pair_bandwidths(names: Sequence[str], pair_seconds: Mapping[tuple[int, int], float],
                    nbytes: int) -> dict[tuple[str, str], float]:
    """GB/s per pair of node names: a two-rank all-reduce's bus bandwidth, bytes / seconds."""
    return {(names[a], names[b]): (nbytes / s / 1e9 if s > 0 else 0.0)
            for (a, b), s in pair_seconds.items()}


def link_verdict(bandwidths: Mapping[tuple[str, str], float], *, detail_prefix: str = "",
                 fraction: float = SLOW_LINK_FRACTION) -> Check:
    """The row: the median pair bandwidth and the slowest pair, named, against the median;
    failing when the slowest is below ``fraction`` of the median (a value in, a value out)."""
    if not bandwidths:
        return Check(name=ROW, ok=None, detail=f"{detail_prefix}no pair of nodes measured")
    median = statistics.median(bandwidths.values())
    (a, b), slowest = min(bandwidths.items(), key=lambda kv: (kv[1], kv[0]))
    times = median / slowest if slowest > 0 else float("inf")
    line = (f"{detail_prefix}median pair {median:.2f} GB/s; slowest {a}<->{b} {slowest:.2f} "
            f"GB/s ({times:.1f}× below median)")
    if slowest >= fraction * median and slowest > 0:
        return Check(name=ROW, ok=True, detail=line)
    return Check(name=ROW, ok=False, detail=(
        f"{line}; expected every pair at >= {fraction:g}× the median: the link between {a} and "
        f"{b} is degraded; add one of them to resources.exclude and rerun to find which"))


def parse_result(stdout: str) -> dict[str, Any]:
    """Rank 0's result line out of the step's output.

    Raises:
        FormatError: no result line (the ranks failed before measuring).
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            return dict(json.loads(line[len(MARKER):]))
    raise FormatError("the link check printed no result; its ranks' last output: "
                         f"{' | '.join(stdout.strip().splitlines()[-3:]) or 'none'}")


def result_row(result: Mapping[str, Any]) -> Check:
    """The row of one result line (see :func:`parse_result`)."""
    names = list(result["nodes"])
    seconds = {(int(a), int(b)): float(s) for a, b, s in result["pairs"]}
    nbytes = int(result["nbytes"])
    prefix = (f"{len(names)} nodes, {len(seconds)} pairs ({result['backend']}, "
              f"{nbytes >> 20} MiB): ")
    return link_verdict(pair_bandwidths(names, seconds, nbytes), detail_prefix=prefix)


# -- the launchers (login node / preflight process) --------------------------------------------

def srun_argv(spec: Any, site: Any, *, python: str, in_allocation: bool) -> list[str]:
    """The ``srun`` line starting one link-check rank on each of the spec's nodes (pure).

    Outside an allocation it asks for one (partition, account, QoS, constraint, excluded
    nodes and GPUs of the spec or the site, a 5-minute limit); inside one it is a step of it.
    The site's ``modules`` and ``setup`` lines run first on each node.
    """
    r = spec.resources
    nodes = r.nodes + r.spare_nodes
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", f"--job-name={spec.name}-links"]
    gpu = site.gpu_flag(min(r.gpus_per_node, site.gpus_per_node))
    if gpu is not None:
        argv.append(f"--{gpu[0]}={gpu[1]}")
    if not in_allocation:
        chosen = {"partition": r.partition or site.partition, "account": r.account or site.account,
                  "qos": r.qos or site.qos, "constraint": r.constraint or site.constraint,
                  "exclude": ",".join(sorted(r.exclude)), "time": "5"}
        argv += [f"--{key}={value}" for key, value in chosen.items() if value]
    argv += list(site.srun_extra_flags)
    command = f"exec {shlex.quote(python)} -m hpcrun.drill.linkcheck"
    setup = [f"module load {shlex.quote(m)}" for m in site.modules] + list(site.setup)
    if setup:
        return [*argv, "bash", "-c", "set -e; " + "; ".join([*setup, command])]
    return [*argv, python, "-m", "hpcrun.drill.linkcheck"]


def slurm_link_check(spec: Any, site: Any, runner: Any, *, environ: Mapping[str, str],
                     timeout_s: float = 900.0) -> Check:
    """Run the check across the spec's nodes with ``srun``; one row."""
    nodes = spec.resources.nodes + spec.resources.spare_nodes
    if nodes < 2:
        return Check(name=ROW, ok=None, detail="one node: no link between nodes to measure")
    argv = srun_argv(spec, site, python=site.python or sys.executable,
                     in_allocation=bool(environ.get("SLURM_JOB_ID")))
    # the fabric settings a run's NCCL ranks get (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...)
    env = {**site.env, **{k: v for k, v in site.nccl_env.items() if v}}
    done = runner.run(argv, env=env, timeout=timeout_s)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-2:]
        return Check(name=ROW, ok=False, detail=f"`srun` over {nodes} nodes exited "
                     f"{done.returncode}: {' | '.join(last)[:200] or 'no output'}")
    return result_row(parse_result(done.stdout))


def local_link_check(nodes: int, *, timeout_s: float = 120.0) -> Check:
    """Run the check over ``min(nodes, LOCAL_MAX_NODES)`` emulated nodes (local processes,
    gloo on 127.0.0.1); one row."""
    from hpcrun.launch.env import DistEnv

    count = min(nodes, LOCAL_MAX_NODES)
    if count < 2:
        return Check(name=ROW, ok=None, detail="one node: no link between nodes to measure")
    names, port = tuple(f"local{i}" for i in range(count)), _free_port()
    envs = [DistEnv(rank=i, local_rank=0, node_rank=i, world_size=count, local_world_size=1,
                    num_nodes=count, nodes=names, master_addr="127.0.0.1", master_port=port,
                    job_id="preflight", restart_count=0, attempt=0).to_environ()
            for i in range(count)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "hpcrun.drill.linkcheck"],
        env={**os.environ, **e, BACKEND_ENV: "gloo", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for e in envs]
    outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    failed = [r for r, p in enumerate(procs) if p.returncode]
    if failed:
        last = outs[failed[0]].strip().splitlines()[-1:] or [""]
        return Check(name=ROW, ok=False, detail=f"rank {failed[0]} ({names[failed[0]]}) "
                     f"failed: {last[0][:160]}")
    return result_row(parse_result(outs[0]))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the ranks (one per node) ------------------------------------------------------------------

def _exchange(dist: Any, send: Any, recv: Any, peer: int) -> None:
    """An all-reduce of two ranks: swap buffers, then add."""
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    recv.add_(send)


def _timed_exchange(dist: Any, send: Any, recv: Any, peer: int, sync: Any) -> float:
    import time

    sync()
    t0 = time.perf_counter()
    _exchange(dist, send, recv, peer)
    sync()
    return time.perf_counter() - t0


def measure(env: Any, backend: str, nbytes: int) -> dict[str, Any] | None:
    """Every round of the schedule on this rank, :data:`TIMED` passes over all rounds (so a
    burst of noise on a node spreads over several pairs rather than landing on one pair's
    samples); rank 0 returns the result, others None."""
    import torch
    import torch.distributed as dist

    from hpcrun.launch.dist import device_for

    device = device_for(env) if backend == "nccl" else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    send = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    rounds = round_robin_rounds(env.world_size)
    # [pass, round, rank]: this rank's seconds (0 when it sat out); the last pass's first row
    # carries each rank's node index instead
    table = torch.zeros(TIMED + 1, len(rounds), env.world_size, dtype=torch.float64,
                        device=device)
    table[TIMED, 0, env.rank] = env.node_rank
    for p in range(-1, TIMED):  # pass -1: the warm-up
        for r, pairs in enumerate(rounds):
            dist.barrier()
            peer = partner(pairs, env.rank)
            if peer is None:
                continue
            if p < 0:
                for _ in range(WARMUP):
                    _exchange(dist, send, recv, peer)
            else:
                table[p, r, env.rank] = _timed_exchange(dist, send, recv, peer, sync)
    dist.all_reduce(table)
    return None if env.rank != 0 else _result(env, table.cpu().tolist(), rounds, backend,
                                               nbytes)


def _result(env: Any, table: list[Any], rounds: list[list[tuple[int, int]]], backend: str,
            nbytes: int) -> dict[str, Any]:
    """Rank 0's result line: node names by rank, per pair the median over passes of the
    shorter end's time (both ends timed the same exchange; the longer one also waited for
    its peer to arrive)."""
    nodes = [env.nodes[int(i)] if env.nodes else f"rank{k}"
             for k, i in enumerate(table[TIMED][0])]
    pairs = [[a, b, statistics.median(min(table[p][r][a], table[p][r][b]) for p in range(TIMED))]
             for r, round_pairs in enumerate(rounds) for a, b in round_pairs]
    return {"nodes": nodes, "pairs": pairs, "nbytes": nbytes, "backend": backend}


def main(environ: Mapping[str, str] | None = None) -> int:
    """One rank of the check (``python -m hpcrun.drill.linkcheck``, one per node)."""
    import torch

    from hpcrun.launch.dist import destroy_process_group, init_process_group
    from hpcrun.launch.env import DistEnv, Launcher, derive_master_port

    env_map = dict(os.environ if environ is None else environ)
    env = DistEnv.from_environ(env_map)
    if env.launcher is Launcher.SLURM and "MASTER_PORT" not in env_map:
        # a step of its own: never the port of a run's gang in the same allocation
        step = f"links-{env.job_id}.{env_map.get('SLURM_STEP_ID', '0')}"
        env = DistEnv.from_environ({**env_map, "MASTER_PORT": str(
            derive_master_port(step, 0, 0))})
    backend = env_map.get(BACKEND_ENV) or ("nccl" if torch.cuda.is_available() else "gloo")
    nbytes = int(env_map.get(BYTES_ENV) or (GPU_BYTES if backend == "nccl" else CPU_BYTES))
    init_process_group(env, backend=backend, timeout_s=120)
    try:
        result = measure(env, backend, nbytes)
    finally:
        destroy_process_group()
    if result is not None:
        print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
