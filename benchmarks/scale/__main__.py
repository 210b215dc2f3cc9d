"""Scale benchmark of the real Checkpointer: ``python -m benchmarks.scale``.

    python -m benchmarks.scale [--ranks 1 64 1024 16384] [--tensors 800]
                               [--only checkpoint rto metaops]
                               [--json out.json]

Rank 0 is a real :class:`~hpcrun.checkpoint.Checkpointer` (save, hierarchical commit, restore:
the code a run calls), on a real run directory behind a counting storage seam; the other N - 1
ranks are simulated by :class:`~benchmarks.scale.gang.SimulatedGang`, the collective seam,
which hands rank 0 what their own Checkpointers would send. Every rank holds one row block of
each of ``--tensors`` dim-0 sharded tensors (8 ranks per node).

Reported per gang size: commit latency (coordinator receive + verify + publish, first commit
and steady state, when nodes leave out the key table the coordinator already has), the node
leader's share, restore planning latency (until rank 0 holds its read plan), bytes and files
each rank reads on restore, metadata operations per rank and per node (save and restore), and
the coordinator's peak Python memory during the commit. ``--only rto`` projects a node loss
with a hot spare to the largest gang, phase by phase (:mod:`benchmarks.scale.rto`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.scale.gang import SimulatedGang, node_name
from hpcrun.checkpoint import (
    Checkpointer,
    CheckpointIdentity,
    Layout,
    RowShard,
    TierLayout,
    rawio,
    shards,
)
from hpcrun.checkpoint.tiers import checkpoint_id, manifest_relpath
from hpcrun.control.log import RunLog
from hpcrun.storage import LOCAL_STORAGE, CountingStorage

COMMIT_TARGET_S = 1.0
PLAN_TARGET_S = 1.0
HOLDER = "scale-holder"
META_OPS = ("create_exclusive", "write_atomic", "makedirs", "rename", "fsync_path", "size",
            "exists", "listdir", "remove", "read_bytes")
"""Seam operations that touch metadata (``read_bytes`` is an open: it counts once)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleConfig:
    """One gang."""

    ranks: int
    """Ranks (rank 0 real, the rest simulated)."""
    per_node: int = 8
    """Ranks per node (16,384 ranks on 2,048 nodes)."""
    tensors: int = 800
    """Dim-0 sharded tensors; each rank holds ``rows`` rows of each."""
    rows: int = 1
    """Rows per rank per tensor."""
    width: int = 2
    """float32 elements per row (tiny shards: the benchmark is about metadata)."""


def rank0_state(cfg: ScaleConfig, fill: float) -> dict[str, Any]:
    return {"model": {f"layers.{i:03d}.weight": RowShard(
        tensor=torch.full((cfg.rows, cfg.width), fill), row_start=0,
        global_rows=cfg.ranks * cfg.rows) for i in range(cfg.tensors)}}


class _CountingProxy:
    """A module stand-in that logs chosen calls (the opens past the storage seam)."""

    def __init__(self, inner: Any, names: tuple[str, ...], log: list[str]) -> None:
        self._inner, self._names, self._log = inner, names, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._log.append(name)
            return attr(*args, **kwargs)

        return counted


@contextlib.contextmanager
def bypass_log() -> Iterator[list[str]]:
    """Log HDF5 file creates/opens and raw ``os.open``/``os.fsync`` of the shard code."""
    log: list[str] = []
    saved = shards.h5py, rawio.os
    shards.h5py = _CountingProxy(saved[0], ("File",), log)  # type: ignore[assignment]
    rawio.os = _CountingProxy(saved[1], ("open", "fsync"), log)  # type: ignore[assignment]
    try:
        yield log
    finally:
        shards.h5py, rawio.os = saved  # type: ignore[assignment]


class _Meter:
    """Metadata operations (seam + bypass) snapshotted at the gang's marks."""

    def __init__(self, storage: CountingStorage, bypass: list[str]) -> None:
        self.storage, self.bypass = storage, bypass
        self.at: dict[str, int] = {}
        self.peak = 0

    def now(self) -> int:
        return sum(self.storage.counts.get(op, 0) for op in META_OPS) + len(self.bypass)

    def mark(self, name: str) -> None:
        self.at[name] = self.now()
        if name == "receive" and tracemalloc.is_tracing():
            tracemalloc.reset_peak()
        if name == "broadcast" and tracemalloc.is_tracing():
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1])


def _checkpointer(cfg: ScaleConfig, run_dir: Path, log: RunLog, gang: SimulatedGang,
                  storage: CountingStorage, generation: int, fence: int) -> Checkpointer:
    layout = Layout(rank=0, world_size=cfg.ranks, node_rank=0, local_rank=0,
                    num_nodes=gang.num_nodes, node=node_name(0, cfg.per_node))
    ident = CheckpointIdentity(run_id="scale", spec_id="scale", generation=generation,
                               holder=HOLDER)
    return Checkpointer(identity=ident, tiers=TierLayout(run_dir=run_dir), layout=layout,
                        log=log, fence_slot=fence, group=gang, storage=storage)


def _save(ck: Checkpointer, gang: SimulatedGang, meter: _Meter, cfg: ScaleConfig, step: int,
          ) -> dict[str, float]:
    gang.prepare(checkpoint_id(generation=ck.id.generation, step=step, holder=HOLDER))
    gang.others_s = 0.0
    start = meter.now()
    t0 = time.perf_counter()
    res = ck.save(step, rank0_state(cfg, 1.0), blocking=True)
    if res is None or not res.committed:
        raise RuntimeError(f"commit at {cfg.ranks} ranks failed: {res}")
    m, at = gang.marks, meter.at
    return {"commit_s": m["broadcast"] - m["receive"], "receive_s": m["received"] - m["receive"],
            "verify_publish_s": m["broadcast"] - m["received"],
            "leader_s": m["receive"] - m["gather"] - gang.others_s,
            "save_wall_s": time.perf_counter() - t0 - gang.others_s,
            "shard_ops": at["gather"] - start, "leader_ops": at["receive"] - at["gather"],
            "coordinator_ops": at["broadcast"] - at["received"]}


def _restore(cfg: ScaleConfig, reader: Checkpointer, gang: SimulatedGang, meter: _Meter,
             log: RunLog) -> dict[str, Any]:
    target = rank0_state(cfg, 0.0)
    before = meter.now()
    log.read()  # what every rank's restore reads first: the run log
    log_ops = meter.now() - before
    start = meter.now()
    t0 = time.perf_counter()
    res = reader.restore(target)
    total = time.perf_counter() - t0
    if res is None or not all(bool((v.tensor == 1.0).all()) if isinstance(v, RowShard) else
                              bool((v == 1.0).all()) for v in target["model"].values()):
        raise RuntimeError(f"restore at {cfg.ranks} ranks did not bring the rows back: {res}")
    planned = meter.at["scatter"]
    return {"restore_plan_s": gang.marks["scatter"] - t0, "restore_s": total,
            "bytes_read_per_rank": res.bytes_read, "files_read_per_rank": res.files_read,
            "log_ops": log_ops, "restore_leader_ops": planned - start - log_ops,
            "restore_rank_ops": meter.now() - planned}


def run_one(cfg: ScaleConfig, root: Path) -> dict[str, Any]:
    """One gang: three saves (first, steady, steady under tracemalloc) and one restore."""
    t_start = time.perf_counter()
    storage = CountingStorage(LOCAL_STORAGE)
    run_dir = root / "run"
    storage.makedirs(run_dir / "log")
    log = RunLog(run_dir, storage=storage)
    fence = log.claim(HOLDER)
    gang = SimulatedGang(cfg.ranks, cfg.per_node, cfg.rows)
    ck = _checkpointer(cfg, run_dir, log, gang, storage, fence.generation, fence.slot)
    with bypass_log() as bypass:
        meter = _Meter(storage, bypass)
        gang.on_mark = meter.mark
        first = _save(ck, gang, meter, cfg, 1)
        steady = _save(ck, gang, meter, cfg, 2)
        tracemalloc.start()
        _save(ck, gang, meter, cfg, 3)
        tracemalloc.stop()
        ck.close()
        reader = _checkpointer(cfg, run_dir, log, gang, storage, fence.generation, -1)
        restored = _restore(cfg, reader, gang, meter, log)
        reader.close()
    ckpt_dir = run_dir / manifest_relpath(ck.results[-1].ckpt_id)
    nodes = gang.num_nodes
    # The first save's shard window has no retention in it (retention of a commit runs on rank
    # 0's writer thread before the next shard write): it is the coordinator's.
    coordinator = steady["coordinator_ops"] + steady["shard_ops"] - first["shard_ops"]
    save_ops_rank = first["shard_ops"] + (steady["leader_ops"] * nodes + coordinator) / cfg.ranks
    restore_ops_rank = restored["restore_rank_ops"] + restored["log_ops"] + (
        restored["restore_leader_ops"] * nodes) / cfg.ranks
    return {"ranks": cfg.ranks, "nodes": nodes, "tensors": cfg.tensors,
            "datasets": cfg.ranks * (cfg.tensors + 1),
            "commit_first_s": first["commit_s"], **steady, "shard_ops": first["shard_ops"],
            "coordinator_ops": coordinator,
            "summary_wire_bytes": gang.wire_bytes,
            "top_manifest_bytes": ckpt_dir.stat().st_size,
            "sub_manifest_bytes": (ckpt_dir.parent / "manifests"
                                   / f"{node_name(0, cfg.per_node)}.json").stat().st_size,
            "peak_coordinator_bytes": meter.peak + gang.wire_bytes, **restored,
            "save_metadata_ops_per_rank": save_ops_rank,
            "save_metadata_ops_per_node": save_ops_rank * cfg.ranks / nodes,
            "restore_metadata_ops_per_rank": restore_ops_rank,
            "restore_metadata_ops_per_node": restore_ops_rank * cfg.ranks / nodes,
            "wall_s": time.perf_counter() - t_start}


def run(ranks: list[int], *, tensors: int) -> list[dict[str, Any]]:
    """One row per gang size; each is printed as it completes."""
    rows = []
    for n in ranks:
        with tempfile.TemporaryDirectory(prefix="hpcrun-scale-") as tmp:
            row = run_one(ScaleConfig(ranks=n, tensors=tensors), Path(tmp))
        print(f"scale: {n} ranks done in {row['wall_s']:.1f} s", flush=True)
        rows.append(row)
    return rows


def _fmt_s(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def render(rows: list[dict[str, Any]]) -> str:
    """The scale table in Markdown, with the targets marked."""
    lines = ["| ranks | nodes | datasets | commit (first) | commit (steady): receive + verify + "
             "publish | node leader | restore planning | bytes / files read per rank | "
             "metadata ops per rank (save / restore) | per node (save / restore) | "
             "coordinator peak memory | summaries received |", "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['ranks']:,} | {r['nodes']:,} | {r['datasets']:,} | "
            f"{_fmt_s(r['commit_first_s'])} | {_fmt_s(r['commit_s'])} "
            f"({_fmt_s(r['receive_s'])} + {_fmt_s(r['verify_publish_s'])}) | "
            f"{_fmt_s(r['leader_s'])} | {_fmt_s(r['restore_plan_s'])} | "
            f"{r['bytes_read_per_rank']:,} B / {r['files_read_per_rank']} | "
            f"{r['save_metadata_ops_per_rank']:.2f} / {r['restore_metadata_ops_per_rank']:.2f} | "
            f"{r['save_metadata_ops_per_node']:.1f} / {r['restore_metadata_ops_per_node']:.1f} | "
            f"{r['peak_coordinator_bytes'] / 2**20:.1f} MiB | "
            f"{r['summary_wire_bytes'] / 2**20:.2f} MiB |")
    return "\n".join([*lines, "", *verdicts(rows)])


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Each scale target, met or not, from the rows."""
    rows = sorted(rows, key=lambda r: r["ranks"])
    big, small = rows[-1], rows[0]
    ops = [r["save_metadata_ops_per_rank"] for r in rows]
    growth = [(b["commit_s"] / max(a["commit_s"], 1e-9)) / (b["ranks"] / a["ranks"])
              for a, b in itertools.pairwise(rows) if b["ranks"] > a["ranks"]]
    return [
        f"- commit (coordinator receive + verify + publish) at {big['ranks']:,} ranks x "
        f"{big['tensors']} tensors: {_fmt_s(big['commit_s'])} steady, "
        f"{_fmt_s(big['commit_first_s'])} first (target ≤ 1 s): "
        f"{'met' if big['commit_s'] <= COMMIT_TARGET_S else 'NOT met'}",
        f"- restore planning at {big['ranks']:,} ranks: {_fmt_s(big['restore_plan_s'])} "
        f"(target ≤ 1 s): {'met' if big['restore_plan_s'] <= PLAN_TARGET_S else 'NOT met'}",
        f"- commit grows at most linearly (largest step/ranks ratio "
        f"{max(growth, default=0):.2f} ≤ 1): "
        f"{'met' if all(g <= 1.0 for g in growth) else 'NOT met'}",
        f"- save metadata ops per rank {ops[0]:.2f} at {small['ranks']:,} ranks, {ops[-1]:.2f} "
        f"at {big['ranks']:,} (constant): "
        f"{'met' if ops[-1] <= 1.05 * max(ops[1:] or ops) else 'NOT met'}",
        f"- files opened per rank on restore: {big['files_read_per_rank']} shard (+ 1 "
        "sub-manifest on a node leader, + the top manifest on rank 0) (target ≤ 2): "
        f"{'met' if big['files_read_per_rank'] <= 2 else 'NOT met'}",
    ]


PARTS = ("checkpoint", "rto", "metaops")
"""``--only`` choices: the Checkpointer at scale, the recovery time projection
(:mod:`benchmarks.scale.rto`), the shared filesystem's metadata load
(:mod:`benchmarks.scale.metaops`)."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 64, 1024, 16384])
    ap.add_argument("--tensors", type=int, default=800)
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    if "checkpoint" in args.only:
        out["checkpoint"] = rows = run(args.ranks, tensors=args.tensors)
        print(render(rows))
    if "rto" in args.only:
        from benchmarks.scale import rto

        out["rto"] = projected = rto.run(max(args.ranks))
        print(rto.render(projected))
    if "metaops" in args.only:
        from benchmarks.scale import metaops

        out["metaops"] = counted = metaops.run([n for n in args.ranks if n >= 8] or [64])
        print(metaops.render(counted))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()


__all__ = ["ScaleConfig", "main", "render", "run", "run_one"]
