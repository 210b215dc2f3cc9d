"""A run starts from a checkpoint made elsewhere: a DCP directory or Hugging Face safetensors.

``ctx.restore(model=..., optim=..., init_from=PATH)`` (or the spec's ``checkpoint.init_from``)
uses it only when the run has no committed checkpoint of its own; once the run commits, every
later restore (a requeue, a restart) reads the run's own checkpoints. The steps, on every rank:

1. :func:`detect_source`: what PATH is (a DCP directory holds ``.metadata``; safetensors is a
   ``.safetensors`` file, an ``.index.json``, or a directory holding ``model.safetensors`` or
   its index); :func:`source_digest` names its bytes (``sha256:`` over names and contents);
2. the registered model (the state named ``model``, else the one ``nn.Module``) and optimizer
   (the one ``torch.optim.Optimizer``, DCP only) are found (:func:`pick_targets`);
3. the keys and shapes are checked against the model (:func:`check_keys`, pure): missing,
   unexpected and mismatched keys are one error naming the first few;
4. the tensors land in the model's own parameters and buffers in place: a DTensor parameter
   gets the slice of the global tensor its rank holds (``distribute_tensor`` without
   communication), or DCP's own ``load`` reshards (a collective over the run's group).

:func:`param_names` is the other half of the bridge: the names of each registered optimizer's
parameters, which every checkpoint carries so an export can key the optimizer by name.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcrun.checkpoint import export_safetensors as st
from hpcrun.errors import CheckpointError
from hpcrun.vocab import CheckpointFormat

DCP_METADATA = ".metadata"
"""The file that makes a directory a DCP checkpoint."""
SHOWN_KEYS = 3
"""Keys an error names of each kind."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InitSource:
    """A checkpoint from outside the run, resolved."""

    path: Path
    """The DCP directory, the safetensors file, or the index."""
    fmt: CheckpointFormat
    """Its format."""
    files: tuple[Path, ...]
    """The files its bytes are in (what the digest covers)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InitResult:
    """What :func:`load_init` loaded."""

    source: InitSource
    """Where from."""
    tensors: int
    """Tensors loaded (model, and optimizer for DCP)."""
    optimizer: bool
    """Whether the optimizer state was loaded too."""


def detect_source(path: str | Path) -> InitSource:
    """What ``path`` is; CheckpointError (one line) when it is neither format or unreadable."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"init_from {path}: no such file or directory; pass a DCP "
                              "directory, a .safetensors file or its .index.json")
    if p.is_dir() and (p / DCP_METADATA).is_file():
        files = sorted(f for f in p.iterdir() if f.is_file() and
                       (f.suffix == ".distcp" or f.name == DCP_METADATA))
        return InitSource(path=p, fmt=CheckpointFormat.DCP, files=tuple(files))
    found = st.find_in_dir(p) if p.is_dir() else p
    if found is None or not (found.name.endswith(".safetensors")
                             or found.name.endswith(".index.json")):
        raise CheckpointError(f"init_from {path} is neither a DCP directory (no {DCP_METADATA}) "
                              "nor safetensors (a .safetensors file, an .index.json, or a "
                              "directory holding model.safetensors); pass one of those")
    return InitSource(path=found, fmt=CheckpointFormat.SAFETENSORS,
                      files=tuple(_safetensors_files(found)))


def _safetensors_files(path: Path) -> list[Path]:
    if not path.name.endswith(".json"):
        return [path]
    import json

    try:
        names = sorted(set(json.loads(path.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"init_from {path} is not a safetensors index (expected JSON "
                              "with a weight_map)") from exc
    return [path, *(path.parent / n for n in names)]


def check_readable(src: InitSource) -> None:
    """Open each file of ``src`` and read its first bytes (what submit checks: cheap at any
    size; the digest is taken when the run loads it).

    Raises:
        CheckpointError: a file cannot be read.
    """
    for f in src.files:
        try:
            with open(f, "rb") as fh:
                fh.read(8)
        except OSError as exc:
            raise CheckpointError(f"init_from {src.path}: cannot read {f} ({exc.strerror}); "
                                  "check the path and its permissions") from exc


def source_digest(src: InitSource) -> str:
    """``sha256:`` over each file's name and bytes, in name order (what the run log records).

    Raises:
        CheckpointError: a file cannot be read.
    """
    h = hashlib.sha256()
    for f in sorted(src.files, key=lambda x: x.name):
        h.update(f.name.encode() + b"\0")
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(8 << 20):
                    h.update(chunk)
        except OSError as exc:
            raise CheckpointError(f"init_from {src.path}: cannot read {f} ({exc.strerror}); "
                                  "check the path and its permissions") from exc
    return "sha256:" + h.hexdigest()


def check_keys(found: Mapping[str, Sequence[int]], wanted: Mapping[str, Sequence[int]], *,
               source: str) -> None:
    """Refuse missing, unexpected and mismatched keys, naming the first few of each (pure)."""
    missing = [k for k in wanted if k not in found]
    unexpected = [k for k in found if k not in wanted]
    shapes = [f"{k} {list(found[k])} vs {list(wanted[k])}" for k in wanted
              if k in found and tuple(found[k]) != tuple(wanted[k])]
    parts = [f"{len(v)} {what} ({', '.join(v[:SHOWN_KEYS])}{', …' if len(v) > SHOWN_KEYS else ''})"
             for what, v in (("missing", missing), ("unexpected", unexpected),
                             ("with another shape (source vs model)", shapes)) if v]
    if parts:
        raise CheckpointError(f"init_from {source} does not fit the model: "
                              f"{'; '.join(parts)}; start from a checkpoint of this model")


def pick_targets(state: Mapping[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
    """The registered model and optimizer an outside checkpoint is loaded into."""
    modules = {n: v for n, v in state.items() if isinstance(v, torch.nn.Module)}
    model = modules.get("model") or (next(iter(modules.values())) if len(modules) == 1 else None)
    if model is None:
        raise CheckpointError(
            f"init_from needs one registered model: ctx.restore got modules {sorted(modules)}; "
            "register the one to initialise as model=")
    optims = [v for v in state.values() if isinstance(v, torch.optim.Optimizer)]
    return model, optims[0] if len(optims) == 1 else None


def param_names(state: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each registered optimizer's parameters, in its ``param_groups`` order, by their names in
    the registered modules' state dicts (a checkpoint's ``extra``; an export keys the optimizer
    with them). An optimizer with a parameter no module names is left out."""
    names: dict[int, str] = {}
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            for n, p in obj.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), n)
    out = {}
    for key, obj in state.items():
        if isinstance(obj, torch.optim.Optimizer):
            params = [p for g in obj.param_groups for p in g["params"]]
            if params and all(id(p) in names for p in params):
                out[key] = [names[id(p)] for p in params]
    return out


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape)


def load_init(path: str | Path, state: Mapping[str, Any], *, group: Any = None) -> InitResult:
    """Load an outside checkpoint into the registered ``state`` (steps in the module docstring).

    Collective for DCP when the run has a process group (``group``).

    Raises:
        CheckpointError: not a known format, unreadable, or the keys/shapes do not fit.
    """
    src = detect_source(path)
    model, optim = pick_targets(state)
    if src.fmt == CheckpointFormat.SAFETENSORS:
        return _load_safetensors(src, model)
    return _load_dcp(src, model, optim, group)


def _load_safetensors(src: InitSource, model: torch.nn.Module) -> InitResult:
    tensors = st.read_any(src.path)
    own = model.state_dict()
    check_keys({k: _shape(v) for k, v in tensors.items()},
               {k: _shape(v) for k, v in own.items()}, source=str(src.path))
    with torch.no_grad():
        for key, target in own.items():
            copy_global_into(target, tensors[key])
    return InitResult(source=src, tensors=len(own), optimizer=False)


def copy_global_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a global tensor into ``target`` in place; a DTensor gets its rank's slice."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        part = distribute_tensor(full.to(target.device, target.dtype), target.device_mesh,
                                 target.placements, src_data_rank=None)
        target.to_local().copy_(part.to_local())
        return
    target.copy_(full.to(target.dtype))


def _load_dcp(src: InitSource, model: torch.nn.Module, optim: torch.optim.Optimizer | None,
              group: Any) -> InitResult:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = dcp.FileSystemReader(str(src.path)).read_metadata().state_dict_metadata
    prefix = "model." if any(k.startswith("model.") for k in meta) else ""
    found = {k[len(prefix):]: tuple(getattr(v, "size", ())) for k, v in meta.items()
             if k.startswith(prefix) and not _is_optim_key(k)}
    with_optim = optim is not None and any(k.startswith("optim.") for k in meta)
    optims: list[torch.optim.Optimizer] = [optim] if optim is not None and with_optim else []
    msd, osd = get_state_dict(model, optims)
    check_keys(found, {k: _shape(v) for k, v in msd.items() if isinstance(v, torch.Tensor)},
               source=str(src.path))
    target: dict[str, Any] = {"model": msd} if prefix else dict(msd)
    if with_optim:
        target["optim"] = osd
    no_dist = group is None or not torch.distributed.is_initialized()
    with warnings.catch_warnings():  # "assuming ... a single process": a one-rank run
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(target, checkpoint_id=str(src.path), process_group=group, no_dist=no_dist)
    set_state_dict(model, optims,
                   model_state_dict=target["model"] if prefix else {k: target[k] for k in msd},
                   optim_state_dict=target["optim"] if with_optim else {})
    return InitResult(source=src, tensors=len(msd) + _count(osd if with_optim else {}),
                      optimizer=with_optim)


def _is_optim_key(key: str) -> bool:
    return key.startswith(("optim.", "optimizer."))


def _count(osd: Mapping[str, Any]) -> int:
    return sum(isinstance(v, torch.Tensor) for entry in osd.get("state", {}).values()
               for v in entry.values())
