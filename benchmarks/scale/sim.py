"""Scale simulation of the checkpoint commit and restore protocols (in one process).

For N simulated ranks on N/8 nodes, each holding one row of each of 800 dim-0 sharded tensors:

- shards: with ``real_files`` every rank runs the real save path (``flatten_state`` →
  ``plan_pieces`` → ``stage`` → ``write_shard``, HDF5 on disk). Otherwise each rank's shard
  record is built from the same plan and the storage calls ``write_shard`` makes are replayed on
  an in-memory storage; the operations ``write_shard`` makes past the storage seam (HDF5 create,
  O_DIRECT opens, fsyncs) are taken from one real, instrumented shard write of the same shape
  (the calibration), so both modes count the same operations (a unit test checks they agree);
- node agents: :func:`hpcrun.checkpoint.hierarchy.summarize_node` + ``write_node_manifest``;
- coordinator: :func:`hpcrun.checkpoint.hierarchy.commit_nodes` (verify + top manifest +
  COMMIT in the run log), timed; the flat path of ``hpcrun.checkpoint.commit`` (one process
  builds, checks and encodes every dataset) is timed for comparison up to ``flat_limit`` ranks;
- restore: ``plan_gather`` assigns files to ranks; with real files every rank runs
  ``read_assigned`` under instrumentation, so the files each rank opens are observed, not
  assumed; sampled node leaders read the top manifest and only their own sub-manifest.

Every metadata operation goes through :class:`hpcrun.storage.CountingStorage`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import pickle
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from benchmarks.scale.memfs import MemStorage
from hpcrun.checkpoint import hierarchy, rawio, shards
from hpcrun.checkpoint.commit import CheckpointInfo, ShardReport, build_manifest
from hpcrun.checkpoint.identity import CheckpointIdentity
from hpcrun.checkpoint.manifest import (
    DatasetRecord,
    Manifest,
    ShardRecord,
    check_coverage,
    encode_manifest,
)
from hpcrun.checkpoint.restore import plan_gather, read_assigned
from hpcrun.checkpoint.stage import StagingBuffer, plan_pieces, stage
from hpcrun.checkpoint.state import META_KEY, RowShard, flatten_state
from hpcrun.checkpoint.tiers import Tier, checkpoint_id, fold_checkpoints, manifest_relpath
from hpcrun.control.log import RunLog
from hpcrun.storage import LOCAL_STORAGE, CountingStorage, Storage

CKPT_ROOT = "ckpt"


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleConfig:
    """One simulated gang."""

    ranks: int
    """Simulated ranks."""
    ranks_per_node: int = 8
    """Ranks per node (16,384 ranks on 2,048 nodes)."""
    tensors: int = 800
    """Logical tensors, each sharded along dim 0 across all ranks."""
    rows: int = 1
    """Rows of each tensor per rank."""
    width: int = 2
    """float32 elements per row (tiny shards)."""
    real_files: bool = False
    """Write real HDF5 shards (else: records + replayed storage calls in memory)."""
    sample_nodes: int = 4
    """Node leaders that really read their sub-manifest back on restore."""
    flat_limit: int = 1024
    """Largest gang for which the flat (single-process) commit is timed."""

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.ranks_per_node < 1 or self.tensors < 1:
            raise ValueError(f"ranks, ranks_per_node and tensors must be >= 1, got {self}")

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)

    def node_of(self, rank: int) -> str:
        return f"n{rank // self.ranks_per_node:05d}"

    def key(self, i: int) -> str:
        """Logical key of tensor ``i`` as ``flatten_state`` names it (state ``model``)."""
        return f"model/layers.{i:03d}.weight"


# -- instrumentation of the operations that bypass the storage seam ----------------------------

class _CountingProxy:
    """A module stand-in that records chosen calls as ``(op, path)`` and forwards everything."""

    def __init__(self, inner: Any, ops: dict[str, Any], log: list[tuple[str, str]]) -> None:
        self._inner, self._ops, self._log = inner, ops, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._ops:
            return attr
        classify = self._ops[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._log.append((classify(args, kwargs), str(args[0]) if args else ""))
            return attr(*args, **kwargs)

        return counted


def _h5_op(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
    return "create" if mode in ("w", "w-", "x") else "open"


@contextlib.contextmanager
def bypass_log() -> Iterator[list[tuple[str, str]]]:
    """Record HDF5 file creates/opens and raw ``os.open``/``os.fsync`` of the shard code."""
    log: list[tuple[str, str]] = []
    saved = shards.h5py, rawio.os
    shards.h5py = _CountingProxy(saved[0], {"File": _h5_op}, log)  # type: ignore[assignment]
    rawio.os = _CountingProxy(saved[1], {"open": lambda a, k: "open",  # type: ignore[assignment]
                                         "fsync": lambda a, k: "fsync"}, log)
    try:
        yield log
    finally:
        shards.h5py, rawio.os = saved  # type: ignore[assignment]


# -- shards ------------------------------------------------------------------------------------

def rank_state(cfg: ScaleConfig, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s state: one row block of every tensor, filled with the rank number."""
    block = torch.full((cfg.rows, cfg.width), float(rank), dtype=torch.float32)
    start, total = rank * cfg.rows, cfg.ranks * cfg.rows
    return {"model": {cfg.key(i).removeprefix("model/"): RowShard(
        tensor=block.clone(), row_start=start, global_rows=total) for i in range(cfg.tensors)}}


def shard_path(ckpt_dir: Path, cfg: ScaleConfig, rank: int) -> Path:
    return ckpt_dir / shards.shard_relpath(cfg.node_of(rank), rank)


def write_real_shard(cfg: ScaleConfig, rank: int, ckpt_dir: Path, ckpt_id: str,
                     storage: Storage, buffer: StagingBuffer) -> ShardRecord:
    """The real save path of one rank (stage + HDF5 shard) into ``ckpt_dir``."""
    flat = flatten_state(rank_state(cfg, rank))
    pieces = plan_pieces(flat, rank=rank, world_size=cfg.ranks)
    staged = stage(flat, pieces, b'{"sim":true}', buffer)
    header = shards.ShardHeader(run_id="sim", ckpt_id=ckpt_id, generation=1, step=1, rank=rank,
                                world_size=cfg.ranks, node=cfg.node_of(rank))
    return shards.write_shard(shard_path(ckpt_dir, cfg, rank), header, buffer, staged,
                              storage=storage)


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """One real shard write of the gang's shape: what the synthetic writer replays."""

    file_bytes: int
    """Size of a shard file."""
    meta: DatasetRecord
    """The meta dataset record (identical on every rank in the simulation)."""
    bypass: dict[str, int]
    """Operations past the storage seam per shard write."""


def calibrate(cfg: ScaleConfig) -> Calibration:
    """Write rank 0's shard for real (instrumented) in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="hpcrun-scale-cal-") as tmp, bypass_log() as log:
        rec = write_real_shard(cfg, 0, Path(tmp), "cal", LOCAL_STORAGE, StagingBuffer())
    meta = next(d for d in rec.datasets if d.key == META_KEY)
    return Calibration(file_bytes=rec.bytes, meta=meta,
                       bypass=dict(collections.Counter(op for op, _ in log)))


def synthetic_shard(cfg: ScaleConfig, rank: int, ckpt_dir: Path, cal: Calibration,
                    storage: Storage, mem: MemStorage,
                    bypass: collections.Counter[str]) -> ShardRecord:
    """The record ``write_shard`` returns for ``rank``, with its storage calls replayed."""
    path = shard_path(ckpt_dir, cfg, rank)
    storage.makedirs(path.parent)
    mem.put(path.with_name(f".{path.name}.tmp"), cal.file_bytes)  # created by HDF5
    bypass.update(cal.bypass)
    storage.rename(path.with_name(f".{path.name}.tmp"), path)
    storage.fsync_path(path.parent)
    size = storage.size(path)
    data = np.full((cfg.rows, cfg.width), rank, dtype=np.float32).tobytes()
    digest = "xxh3:" + xxhash.xxh3_64_hexdigest(data)
    start, total = rank * cfg.rows, cfg.ranks * cfg.rows
    records = [DatasetRecord(key=key, h5path="/" + key, placement="row",
                             dtype="float32", global_shape=(total, cfg.width), row_start=start,
                             row_stop=start + cfg.rows, offset=-1, nbytes=len(data),
                             checksum=digest) for key in _keys(cfg.tensors)]
    return ShardRecord(rank=rank, node=cfg.node_of(rank),
                       path=shards.shard_relpath(cfg.node_of(rank), rank), bytes=size,
                       datasets=(*records, cal.meta))


@functools.lru_cache(maxsize=4)
def _keys(tensors: int) -> tuple[str, ...]:
    return tuple(ScaleConfig(ranks=1, tensors=tensors).key(i) for i in range(tensors))


# -- the simulation ----------------------------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class _Sim:
    cfg: ScaleConfig
    run_dir: Path
    storage: CountingStorage
    mem: MemStorage | None
    info: CheckpointInfo
    bypass: collections.Counter[str] = field(default_factory=collections.Counter)
    node_s: list[float] = field(default_factory=list)
    flat_reports: list[ShardReport] = field(default_factory=list)
    sub_bytes: int = 0
    node_shards: dict[str, tuple[ShardRecord, ...]] = field(default_factory=dict)
    known_keys: str = ""

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / CKPT_ROOT / self.info.ckpt_id


def _node_ranks(cfg: ScaleConfig, n: int) -> range:
    return range(n * cfg.ranks_per_node, min(cfg.ranks, (n + 1) * cfg.ranks_per_node))


def _write_node(sim: _Sim, n: int, cal: Calibration | None,
                buffer: StagingBuffer) -> hierarchy.NodeSummary:
    cfg, node = sim.cfg, sim.cfg.node_of(n * sim.cfg.ranks_per_node)
    if cfg.real_files:
        with bypass_log() as log:
            recs = [write_real_shard(cfg, r, sim.ckpt_dir, sim.info.ckpt_id, sim.storage, buffer)
                    for r in _node_ranks(cfg, n)]
        sim.bypass.update(op for op, _ in log)
    else:
        assert cal is not None and sim.mem is not None
        recs = [synthetic_shard(cfg, r, sim.ckpt_dir, cal, sim.storage, sim.mem, sim.bypass)
                for r in _node_ranks(cfg, n)]
    if cfg.ranks <= cfg.flat_limit:
        sim.flat_reports += [ShardReport(rank=r.rank, record=r) for r in recs]
    t0 = time.perf_counter()
    data, summary = hierarchy.summarize_node(sim.info.ckpt_id, node, recs,
                                             known_keys=sim.known_keys)
    sim.known_keys = sim.known_keys or summary.keys_digest  # rank 0's table, sent with a save
    hierarchy.write_node_manifest(sim.run_dir, sim.info.ckpt_id, node, data,
                                  storage=sim.storage)
    sim.node_s.append(time.perf_counter() - t0)
    sim.sub_bytes += len(data)
    if n in _sampled(cfg):
        sim.node_shards[node] = tuple(recs)
    return summary


def _sampled(cfg: ScaleConfig) -> set[int]:
    k = min(cfg.sample_nodes, cfg.nodes)
    return {round(i * (cfg.nodes - 1) / max(1, k - 1)) for i in range(k)}


def _coordinate(sim: _Sim, summaries: list[hierarchy.NodeSummary], log: RunLog,
                ) -> dict[str, Any]:
    wire = pickle.dumps(summaries, protocol=pickle.HIGHEST_PROTOCOL)
    t0 = time.perf_counter()
    received = pickle.loads(wire)
    t1 = time.perf_counter()
    before = collections.Counter(sim.storage.counts)
    verdict = hierarchy.commit_nodes(sim.run_dir, log, sim.info, received, tier=Tier.SHARED,
                                     storage=sim.storage)
    t2 = time.perf_counter()
    if verdict.outcome != "committed":
        raise RuntimeError(f"simulated commit refused: {verdict.message}")
    top = sim.storage.inner.size(sim.run_dir / manifest_relpath(sim.info.ckpt_id))
    return {"receive_s": t1 - t0, "verify_publish_s": t2 - t1, "summary_wire_bytes": len(wire),
            "top_manifest_bytes": top,
            "coordinator_ops": dict(collections.Counter(sim.storage.counts) - before)}


def _flat_commit_s(sim: _Sim) -> float | None:
    """Seconds the single-process path takes to build, check and encode the manifest."""
    if not sim.flat_reports:
        return None
    t0 = time.perf_counter()
    m = build_manifest(sim.info, sim.flat_reports)
    if problems := check_coverage(m):
        raise RuntimeError(f"flat coverage check failed: {problems[:2]}")
    encode_manifest(m)
    return time.perf_counter() - t0


def _restore(sim: _Sim, log: RunLog) -> dict[str, Any]:
    cfg = sim.cfg
    ckpt = fold_checkpoints(log.read())[-1]
    t0 = time.perf_counter()
    top = hierarchy.read_top_manifest(sim.run_dir, ckpt, storage=sim.storage)
    top_s = time.perf_counter() - t0
    node_s = []
    for node, written in sim.node_shards.items():
        t0 = time.perf_counter()
        got = hierarchy.read_node_shards(sim.run_dir, ckpt.ckpt_id, top, node,
                                         storage=sim.storage)
        node_s.append(time.perf_counter() - t0)
        if got != written:
            raise RuntimeError(f"sub-manifest of {node} does not read back as written")
    skeleton = Manifest(ckpt_id=ckpt.ckpt_id, run_id="sim", spec_id="sim", dataset_id="",
                        contract="exact-order", generation=1, step=1, parent=None,
                        world_size=cfg.ranks, nodes=sim.info.nodes, checksum="xxh3", created=0.0,
                        shards=tuple(ShardRecord(rank=r, node=cfg.node_of(r),
                                                 path=shards.shard_relpath(cfg.node_of(r), r),
                                                 bytes=0, datasets=()) for r in range(cfg.ranks)))
    plan = plan_gather(skeleton, cfg.ranks)
    opens = collections.Counter(j for files in plan.files.values() for j in files)
    out = {"top_read_s": top_s, "node_manifest_read_s": statistics.median(node_s),
           "shard_files_per_rank_max": max(len(f) for f in plan.files.values()),
           "max_opens_of_one_shard": max(opens.values()),
           "manifest_files_per_node": 1, "top_manifest_opens": 1,
           "flat_restore_manifest_read_s_est": top_s + statistics.median(node_s) * cfg.nodes}
    if cfg.real_files:
        out.update(_real_restore(sim, ckpt))
    return out


def _real_restore(sim: _Sim, ckpt: Any) -> dict[str, Any]:
    """Every rank runs the real read path; count the files each one actually opens."""
    from hpcrun.checkpoint.commit import read_manifest

    t0 = time.perf_counter()
    m = read_manifest(sim.run_dir, ckpt, storage=sim.storage)
    flat_read = time.perf_counter() - t0
    plan = plan_gather(m, sim.cfg.ranks)
    per_rank: list[set[str]] = []
    per_file: collections.Counter[str] = collections.Counter()
    for r in range(sim.cfg.ranks):
        with bypass_log() as log:
            read_assigned(m, plan, r, lambda j: [("shared", sim.ckpt_dir / m.shards[j].path)])
        files = {Path(p).name for _, p in log}
        per_rank.append(files)
        per_file.update(files)
        if files != {Path(m.shards[r].path).name}:
            raise RuntimeError(f"rank {r} opened {sorted(files)[:4]}, expected only its shard")
    return {"observed_files_per_rank_max": max(len(f) for f in per_rank),
            "observed_max_ranks_per_file": max(per_file.values()),
            "flat_restore_manifest_read_s": flat_read}


def _tree_counts(sim: _Sim) -> tuple[int, int]:
    """Files and directories of the checkpoint (not the run log)."""
    if sim.mem is not None:
        root = str(sim.ckpt_dir)
        files = sum(1 for f in sim.mem.sizes if f.startswith(root + "/"))
        dirs = sum(1 for d in sim.mem.dirs if d == root or d.startswith(root + "/"))
        return files, dirs
    paths = list(sim.ckpt_dir.rglob("*"))
    return sum(p.is_file() for p in paths), 1 + sum(p.is_dir() for p in paths)


def _setup(cfg: ScaleConfig, root: Path) -> tuple[_Sim, RunLog]:
    mem = None if cfg.real_files else MemStorage(keep=lambda p: "/log/" in p or p.endswith(
        "manifest.json") or any(f"/{cfg.node_of(n * cfg.ranks_per_node)}.json" in p
                                for n in _sampled(cfg)))
    storage = CountingStorage(mem if mem is not None else LOCAL_STORAGE)
    run_dir = root / "run"
    storage.makedirs(run_dir / "log")
    log = RunLog(run_dir, storage=storage)
    fence = log.claim("sim-holder")
    info = CheckpointInfo(ckpt_id=checkpoint_id(generation=fence.generation, step=1,
                                                holder="sim-holder"),
                          identity=CheckpointIdentity(run_id="sim", spec_id="sim",
                                                      generation=fence.generation,
                                                      holder="sim-holder"),
                          step=1, parent=None,
                          nodes=tuple(cfg.node_of(r) for r in range(cfg.ranks)),
                          checksum="xxh3", created=0.0)
    storage.counts.clear()
    if mem is not None:
        mem.dirs_created = mem.files_created = 0
    return _Sim(cfg=cfg, run_dir=run_dir, storage=storage, mem=mem, info=info), log


def simulate(cfg: ScaleConfig, root: Path | None = None) -> dict[str, Any]:
    """Run one simulated checkpoint (commit, then restore) and return its figures."""
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpcrun-scale-") as tmp:
        sim, log = _setup(cfg, Path(root or tmp))
        cal = None if cfg.real_files else calibrate(cfg)
        buffer = StagingBuffer()
        summaries = [_write_node(sim, n, cal, buffer) for n in range(cfg.nodes)]
        write_ops = dict(sim.storage.counts)
        coord = _coordinate(sim, summaries, log)
        files, dirs = _tree_counts(sim)
        flat_s = _flat_commit_s(sim)
        sim.flat_reports.clear()
        restore = _restore(sim, log)
    ops = collections.Counter(sim.storage.counts)
    return {
        "ranks": cfg.ranks, "nodes": cfg.nodes, "tensors": cfg.tensors,
        "mode": "real HDF5 files" if cfg.real_files else "in-memory storage, replayed calls",
        "datasets": cfg.ranks * (cfg.tensors + 1), "files": files, "dirs": dirs,
        "seam_ops_commit": dict(collections.Counter(write_ops) + collections.Counter(
            coord["coordinator_ops"])),
        "seam_ops_total": dict(ops), "bypass_ops": dict(sim.bypass),
        "metadata_ops_per_rank": metadata_ops(write_ops, sim.bypass) / cfg.ranks,
        "sub_manifest_bytes": sim.sub_bytes, **coord,
        "node_agent_s_median": statistics.median(sim.node_s),
        "node_agent_s_max": max(sim.node_s), "flat_commit_s": flat_s, **restore,
        "sim_wall_s": time.perf_counter() - t_start,
    }


META_OPS = ("create_exclusive", "write_atomic", "makedirs", "rename", "fsync_path", "size",
            "exists", "listdir", "remove")
"""Seam operations that touch metadata (``read_bytes`` moves data, it is an open + read)."""


def metadata_ops(seam: dict[str, int], bypass: collections.Counter[str]) -> int:
    """Metadata operations: seam calls that touch metadata plus creates/opens/fsyncs past it."""
    return sum(seam.get(op, 0) for op in META_OPS) + sum(bypass.values())
