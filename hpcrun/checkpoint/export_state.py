"""What an export holds, as values (pure): which checkpoint, which state, under which keys.

A committed checkpoint read back as global tensors (:func:`hpcrun.checkpoint.export.read_global`)
holds each registered state (``ctx.restore(model=..., optim=...)``) under its logical keys
(``model/<%-escaped key>``). Decoding the rank's meta tree gives each state dict back with the
object's own keys (the escaping undone), and this module shapes them for the two formats:

- the model's state dict, its keys exactly as ``model.state_dict()`` names them;
- the optimizer's state keyed by parameter name, as
  ``torch.distributed.checkpoint.state_dict.get_state_dict`` returns it (``state.<fqn>.<name>``,
  ``param_groups[i].params`` a list of names), mapped from the optimizer's parameter indices
  with the names every checkpoint records (``extra["param_names"]``, written by the runtime);
- for safetensors, the optimizer flattened into dotted keys plus a JSON tree of its non-tensor
  values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hpcrun.checkpoint.tiers import CommittedCheckpoint
from hpcrun.errors import CheckpointError

OPTIM_NAMES = ("optim", "optimizer", "opt")
"""State names tried, in order, for the optimizer when none is named."""


def select_checkpoint(committed: Sequence[CommittedCheckpoint], *, run: str,
                      step: int | None = None, ckpt_id: str | None = None,
                      ) -> CommittedCheckpoint:
    """The committed checkpoint asked for (by id, by step, else the newest) on the shared tier.

    Raises:
        CheckpointError: none is committed, or none matches (the message lists what is).
    """
    shared = [c for c in committed if "shared" in c.tiers]
    if not shared:
        raise CheckpointError(f"run {run} has no checkpoint committed on the shared tier; "
                              "let it commit one (checkpoint.every_steps) and drain, then export")
    if ckpt_id is not None:
        found = [c for c in shared if c.ckpt_id == ckpt_id]
        what = f"checkpoint {ckpt_id}"
    elif step is not None:
        found = [c for c in shared if c.step == step]
        what = f"step {step}"
    else:
        return shared[-1]
    if not found:
        steps = ", ".join(str(c.step) for c in shared[-10:])
        raise CheckpointError(f"run {run} has no committed checkpoint at {what} on the shared "
                              f"tier; committed steps: {steps}; pass one of them with --step")
    return found[-1]


def named_state(states: Mapping[str, Any], name: str) -> Any:
    """The decoded state registered as ``name``; CheckpointError listing the names there are."""
    if name not in states:
        raise CheckpointError(f"the checkpoint holds no state named {name!r}; it holds "
                              f"{sorted(states)}; pass --state NAME for the model")
    return states[name]


def model_tensors(sd: Any, name: str) -> dict[str, torch.Tensor]:
    """The model's state dict as ``{key: tensor}``: a flat mapping of tensors, or refused."""
    if not isinstance(sd, Mapping) or not sd:
        raise CheckpointError(f"state {name!r} is not a model state dict (a mapping of names "
                              f"to tensors); found a {type(sd).__name__}; pass --state NAME")
    bad = [k for k, v in sd.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"state {name!r} is not a flat model state dict: {bad[:3]} are not "
                              "tensors under string keys; pass the model's --state NAME")
    return dict(sd)


def find_optimizer(states: Mapping[str, Any], *, model: str) -> str | None:
    """The name of the registered optimizer state (``state`` + ``param_groups``), if any."""
    names = [n for n in OPTIM_NAMES if n in states and n != model]
    names += [n for n in states if n not in names and n != model]
    for n in names:
        sd = states[n]
        if isinstance(sd, Mapping) and {"state", "param_groups"} <= set(sd):
            return n
    return None


def optimizer_by_name(osd: Mapping[str, Any], model: Mapping[str, torch.Tensor],
                      names: Sequence[str] | None) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name, as ``get_state_dict`` returns it.

    ``names`` are the optimizer's parameters' names in ``param_groups`` order, as the
    checkpoint recorded them (``extra["param_names"]``); an optimizer already keyed by name is
    returned as is.

    Raises:
        CheckpointError: the checkpoint does not name the parameters, or names do not fit.
    """
    ids = [p for g in osd["param_groups"] for p in g.get("params", [])]
    if all(isinstance(p, str) for p in ids):
        return dict(osd)
    if names is None or len(names) != len(ids) or len(set(ids)) != len(ids):
        raise CheckpointError(
            f"the checkpoint does not name the optimizer's {len(ids)} parameters (it predates "
            "param_names, or a parameter belongs to no registered module); export the model "
            "alone (leave out --include optim)")
    name = dict(zip(ids, names, strict=True))
    unknown = sorted({n for n in names if n not in model})
    if unknown:
        raise CheckpointError(f"optimizer parameters {unknown[:3]} are not keys of the model's "
                              "state dict; export the model alone")
    state = {name[i]: dict(v) for i, v in osd["state"].items()}
    for fqn, entry in state.items():
        _check_shapes(fqn, entry, model[fqn])
    groups = [{**g, "params": [name[p] for p in g["params"]]} for g in osd["param_groups"]]
    return {"state": state, "param_groups": groups}


def _check_shapes(fqn: str, entry: Mapping[str, Any], param: torch.Tensor) -> None:
    for k, v in entry.items():
        if isinstance(v, torch.Tensor) and v.dim() and tuple(v.shape) != tuple(param.shape):
            raise CheckpointError(
                f"optimizer entry {k!r} of {fqn!r} has shape {list(v.shape)} but the parameter "
                f"{list(param.shape)}: the optimizer's parameter order is not the model's; "
                "export the model alone or save the optimizer with get_state_dict")


def flatten_optimizer(osd: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], str]:
    """Dotted tensor keys (``state.<fqn>.<name>``) and a JSON text of everything else."""
    tensors: dict[str, torch.Tensor] = {}
    rest: dict[str, Any] = {"param_groups": _jsonable(osd.get("param_groups", []))}
    scalars: dict[str, Any] = {}
    for fqn, entry in osd.get("state", {}).items():
        for k, v in entry.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{fqn}.{k}"] = v
            else:
                scalars[f"state.{fqn}.{k}"] = _jsonable(v)
    if scalars:
        rest["scalars"] = scalars
    return tensors, json.dumps(rest, sort_keys=True, allow_nan=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value
