"""``hpcrun ckpt export``: a committed checkpoint leaves hpcrun as DCP or safetensors.

The steps, in order:

1. pick the committed checkpoint (``--ckpt``, ``--step``, else the newest) on the shared tier
   (:func:`~.export_state.select_checkpoint`);
2. read it back as global tensors with the restore's own path (manifest digest and coverage,
   per-dataset checksums, the exchange plan, assembly; :func:`read_global`), and decode the
   meta tree into each registered state dict with its own keys;
3. shape the model (and optimizer) state for the format (:mod:`.export_state`);
4. write into a fresh directory beside the target (``<DIR>.partial-<pid>``): for safetensors the
   Hugging Face layout (:mod:`.export_safetensors`), for DCP ``torch.distributed.checkpoint.save``
   in this one process without a process group; then ``hpcrun-export.json`` and a
   ``SHA256SUMS`` (``sha256sum -c`` format) over every file;
5. move it into place (``--force`` replaces an existing export only after the new one is
   complete).

Nothing written needs hpcrun to be read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcrun.checkpoint import export_safetensors as st
from hpcrun.checkpoint.commit import read_manifest
from hpcrun.checkpoint.export_state import (
    find_optimizer,
    flatten_optimizer,
    model_tensors,
    named_state,
    optimizer_by_name,
    select_checkpoint,
)
from hpcrun.checkpoint.keys import META_KEY, Placement
from hpcrun.checkpoint.manifest import Manifest, safe_relpath
from hpcrun.checkpoint.restore import assemble, plan_gather, read_assigned
from hpcrun.checkpoint.stage import torch_dtype
from hpcrun.checkpoint.state import TensorLeaf, decode_tree
from hpcrun.checkpoint.tiers import CKPT_DIR, fold_checkpoints, shared_root
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError
from hpcrun.vocab import CheckpointFormat, Tier

EXPORT_SCHEMA_VERSION = 1
RECORD_NAME = "hpcrun-export.json"
SUMS_NAME = "SHA256SUMS"
EXPORTS_DIR = "exports"
"""Default parent of a run's exports, inside its run directory."""
OPTIM_STEM = "optimizer"
"""Stem of the optimizer's safetensors files (``optimizer.safetensors`` or shards + index)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GlobalCheckpoint:
    """A committed checkpoint read back whole: every tensor at its global shape."""

    manifest: Manifest
    """Its verified manifest."""
    states: Mapping[str, Any]
    """Each registered state's state dict, decoded with its own keys (rank 0's meta tree)."""
    rank_local: frozenset[str]
    """Logical keys of rank-local tensors (rank 0's value only: no global value exists)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportRequest:
    """What ``hpcrun ckpt export`` was asked for."""

    fmt: CheckpointFormat
    """Format to write."""
    out: Path | None = None
    """Output directory (None: ``<run>/exports/<ckpt id>.<format>``)."""
    step: int | None = None
    """Step of the checkpoint (None: newest unless ``ckpt_id``)."""
    ckpt_id: str | None = None
    """Checkpoint id (wins over ``step``)."""
    model: str = "model"
    """Registered state name of the model."""
    include_optim: bool | None = None
    """Export the optimizer too (None: yes for DCP when there is one, no for safetensors)."""
    force: bool = False
    """Replace a non-empty output directory."""
    max_file_bytes: int = st.DEFAULT_MAX_FILE_BYTES
    """Largest safetensors file before the export is split."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportResult:
    """What was written."""

    out: Path
    """The export directory."""
    ckpt_id: str
    """Checkpoint exported."""
    step: int
    """Its step."""
    files: tuple[str, ...]
    """Files written, relative to ``out`` (SHA256SUMS last)."""
    tensors: int
    """Tensors exported."""
    nbytes: int
    """Tensor bytes exported."""


def read_global(run_dir: Path, ckpt: Any) -> GlobalCheckpoint:
    """Read committed checkpoint ``ckpt`` from the shared tier as global tensors.

    Every shard is verified (manifest digest from the commit, each dataset's checksum) and the
    pieces are assembled with the restore's exchange path as its writing layout would hold
    them, every row of a sharded tensor included.

    Raises:
        CorruptCheckpointError: the manifest or a shard fails verification.
    """
    m = read_manifest(run_dir, ckpt)
    plan = plan_gather(m, m.world_size)
    base = shared_root(run_dir) / m.ckpt_id
    bufs = [read_assigned(m, plan, r, lambda j: [(Tier.SHARED, base / safe_relpath(
        m.shards[j].path))])[0] for r in range(m.world_size)]
    tensors, meta = assemble(m, plan, bufs, rank=0, world_size=m.world_size,
                             rows=_all_rows(m))
    local = frozenset(d.key for s in m.shards for d in s.datasets
                      if d.placement == Placement.LOCAL and d.key != META_KEY)
    states = {name: decode_tree(node, tensors) for name, node in meta.items()
              if not name.startswith("__")}
    return GlobalCheckpoint(manifest=m, states=states, rank_local=local)


def _all_rows(m: Manifest) -> dict[str, TensorLeaf]:
    """A leaf per dim-0 sharded tensor asking for all of its rows (no memory: meta tensors)."""
    rows = {}
    for shard in m.shards:
        for d in shard.datasets:
            if d.placement == Placement.ROW and d.key not in rows:
                t = torch.empty(d.global_shape, dtype=torch_dtype(d.dtype), device="meta")
                rows[d.key] = TensorLeaf(key=d.key, tensor=t, placement=Placement.ROW,
                                         global_shape=tuple(d.global_shape))
    return rows


def export_checkpoint(run_dir: Path, req: ExportRequest) -> ExportResult:
    """Write the export ``req`` asks for; the steps are in this module's docstring.

    Raises:
        CheckpointError: no such committed checkpoint, an output directory in the way or inside
            the run's checkpoints, or state the format cannot hold.
        CorruptCheckpointError: the checkpoint fails verification.
    """
    ckpt = select_checkpoint(fold_checkpoints(RunLog(run_dir).read()), run=run_dir.name,
                             step=req.step, ckpt_id=req.ckpt_id)
    out = _check_out(run_dir, req.out or run_dir / EXPORTS_DIR / f"{ckpt.ckpt_id}.{req.fmt}",
                     force=req.force)
    g = read_global(run_dir, ckpt)
    model, optim, left_out = _shape(g, req)
    tmp = out.parent / f"{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = _write(tmp, req, model, optim)
        files.append(_write_record(tmp, g.manifest, req.fmt, model, optim, left_out))
        files.append(write_sums(tmp, files))
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tensors = list(model.values()) + list(_optim_tensors(optim))
    return ExportResult(out=out, ckpt_id=g.manifest.ckpt_id, step=g.manifest.step,
                        files=tuple(files), tensors=len(tensors),
                        nbytes=sum(st.tensor_nbytes(t) for t in tensors))


def _check_out(run_dir: Path, out: Path, *, force: bool) -> Path:
    out = out.expanduser().absolute()
    ckpts = (run_dir / CKPT_DIR).absolute()
    if out.resolve() == ckpts.resolve() or ckpts.resolve() in out.resolve().parents:
        raise CheckpointError(f"output directory {out} is inside the run's checkpoints "
                              f"({ckpts}); pass -o a directory outside {ckpts}")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"output {out} exists and is not a directory; pass -o a new "
                              "directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CheckpointError(f"output directory {out} exists and is not empty; pass -o a new "
                              "directory, or --force to replace it")
    return out


def _shape(g: GlobalCheckpoint, req: ExportRequest
           ) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, str]:
    """Model and optimizer state for the format, and why the optimizer was left out ("")."""
    model = model_tensors(named_state(g.states, req.model), req.model)
    _refuse_local(g, req.model)
    optim_name = find_optimizer(g.states, model=req.model)
    if req.include_optim and optim_name is None:
        raise CheckpointError(f"--include optim: the checkpoint holds no optimizer state "
                              f"(states: {sorted(g.states)}); export without it")
    wanted = req.include_optim or (req.include_optim is None
                                   and req.fmt == CheckpointFormat.DCP)
    if not wanted or optim_name is None:
        return model, None, ""
    _refuse_local(g, optim_name)
    names = (g.manifest.extra.get("param_names") or {}).get(optim_name)
    try:
        return model, optimizer_by_name(g.states[optim_name], model, names), ""
    except CheckpointError as exc:
        if req.include_optim:
            raise
        return model, None, str(exc)


def _refuse_local(g: GlobalCheckpoint, name: str) -> None:
    mine = sorted(k for k in g.rank_local if k.split("/", 1)[0] == name)
    if mine:
        raise CheckpointError(f"state {name!r} holds rank-local tensors {mine[:3]}, which have "
                              "no global value to export; make them replicated or RowShard")


def _optim_tensors(optim: Mapping[str, Any] | None) -> list[torch.Tensor]:
    if optim is None:
        return []
    return [v for entry in optim["state"].values() for v in entry.values()
            if isinstance(v, torch.Tensor)]


def _write(tmp: Path, req: ExportRequest, model: dict[str, torch.Tensor],
           optim: dict[str, Any] | None) -> list[str]:
    if req.fmt == CheckpointFormat.DCP:
        return write_dcp(tmp, model, optim)
    files = write_safetensors(tmp, model, stem="model", max_bytes=req.max_file_bytes)
    if optim is not None:
        tensors, rest = flatten_optimizer(optim)
        files += write_safetensors(tmp, tensors, stem=OPTIM_STEM, max_bytes=req.max_file_bytes,
                                   metadata={"hpcrun_optimizer": rest})
    return files


def write_safetensors(out: Path, tensors: Mapping[str, torch.Tensor], *, stem: str,
                      max_bytes: int, metadata: Mapping[str, str] | None = None) -> list[str]:
    """One safetensors file, or shards plus an index when larger than ``max_bytes``."""
    keys = sorted(tensors)
    plans = st.plan_files([(k, st.tensor_nbytes(tensors[k])) for k in keys], stem=stem,
                          max_bytes=max_bytes)
    meta = {"format": "pt", **(metadata or {})}
    for p in plans:
        st.write_file(out / p.name, [(k, tensors[k]) for k in p.keys], meta)
    names = [p.name for p in plans]
    if len(plans) > 1:
        index = st.build_index(plans, metadata={k: v for k, v in (metadata or {}).items()})
        _write_json(out / st.index_name(stem), index)
        names.append(st.index_name(stem))
    return names


def write_dcp(out: Path, model: Mapping[str, torch.Tensor],
              optim: Mapping[str, Any] | None) -> list[str]:
    """``torch.distributed.checkpoint.save`` of ``{"model": ..., "optim": ...}`` in this process
    alone (no process group), the keys ``get_state_dict`` gives (``model.<fqn>``,
    ``optim.state.<fqn>.<name>``)."""
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {"model": dict(model)}
    if optim is not None:
        state["optim"] = optim
    with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(state, checkpoint_id=str(out), no_dist=True)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def _write_record(out: Path, m: Manifest, fmt: CheckpointFormat,
                  model: Mapping[str, torch.Tensor], optim: Any, left_out: str) -> str:
    record: dict[str, Any] = {"schema_version": EXPORT_SCHEMA_VERSION, "format": fmt.value,
              "run_id": m.run_id, "ckpt_id": m.ckpt_id, "step": m.step, "spec_id": m.spec_id,
              "dataset_id": m.dataset_id, "world_size": m.world_size,
              "model_tensors": len(model), "optimizer": optim is not None}
    if left_out:
        record["optimizer_left_out"] = left_out
    _write_json(out / RECORD_NAME, record)
    return RECORD_NAME


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_sums(out: Path, files: list[str]) -> str:
    """``SHA256SUMS`` over ``files`` (relative to ``out``), in ``sha256sum -c`` format."""
    lines = [f"{sha256_file(out / name)}  {name}\n" for name in sorted(files)]
    with open(out / SUMS_NAME, "w") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    return SUMS_NAME


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished export to ``out``; an old one goes only after the new one is in."""
    old = out.parent / f"{out.name}.replaced-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
