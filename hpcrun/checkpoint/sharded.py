"""Sharded modules and their optimizers as checkpoint state, through PyTorch's own state dicts.

A module sharded with DTensor (FSDP2 ``fully_shard``, tensor parallel, HSDP) and its optimizer
are registered as the user passes them (``ctx.restore(model=model, optim=optim)``);
:func:`wrap_sharded` puts them behind ``torch.distributed.checkpoint.state_dict``'s
``get_model_state_dict`` / ``get_optimizer_state_dict`` (DTensor values, FQN keys) and the
matching ``set_*`` calls, so the checkpointer sees DTensor leaves and can reshard them.

An optimizer has no state before its first step, so a restore onto a fresh one would have no
DTensor boxes to fill: :meth:`ShardedOptimizer.prepare_restore` (called by the checkpointer
only when a checkpoint is about to be restored) lets PyTorch create it (one zero-learning-rate
step that the restored state then overwrites). A fresh start never takes that step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hpcrun.checkpoint.chunks import is_dtensor


class ShardedModel:
    """A DTensor-sharded module as checkpoint state (its sharded state dict)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        """The module's sharded state dict (DTensor values, FQN keys)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return dict(get_model_state_dict(self.module))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a sharded state dict (DTensors on this module's mesh)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, dict(state))


class ShardedOptimizer:
    """The optimizer of a DTensor-sharded module as checkpoint state (FQN-keyed state dict)."""

    def __init__(self, module: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.module, self.optim = module, optim
        self._prepared = False

    def prepare_restore(self) -> None:
        """A checkpoint is about to be restored: let its DTensor state exist to be filled."""
        self._prepared = True

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state dict with DTensor state and FQN keys (a fresh optimizer's
        plain, empty one until a restore prepares it)."""
        if not self.optim.state and not self._prepared:
            return dict(self.optim.state_dict())
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return dict(get_optimizer_state_dict(self.module, self.optim))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load an FQN-keyed optimizer state dict (or a plain one, saved while the optimizer
        had no state)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        groups = state.get("param_groups") or [{}]
        if all(isinstance(p, int) for g in groups for p in g.get("params", [])):
            self.optim.load_state_dict(dict(state))
            return
        set_optimizer_state_dict(self.module, self.optim, dict(state))


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether any parameter of ``module`` is a DTensor."""
    return any(is_dtensor(p) for p in module.parameters())


def _owner(optim: torch.optim.Optimizer, modules: Mapping[str, torch.nn.Module],
           ) -> torch.nn.Module | None:
    ids = {id(p) for g in optim.param_groups for p in g["params"]}
    for module in modules.values():
        if ids & {id(p) for p in module.parameters()}:
            return module
    return None


def wrap_sharded(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with each DTensor-sharded module and its optimizer behind PyTorch's
    distributed state dicts; everything else (DDP, plain modules, loaders) as it is."""
    modules = {k: v for k, v in state.items()
               if isinstance(v, torch.nn.Module) and is_sharded(v)}
    out: dict[str, Any] = {}
    for name, obj in state.items():
        if name in modules:
            out[name] = ShardedModel(obj)
        elif isinstance(obj, torch.optim.Optimizer) and (owner := _owner(obj, modules)):
            out[name] = ShardedOptimizer(owner, obj)
        else:
            out[name] = obj
    return out


__all__ = ["ShardedModel", "ShardedOptimizer", "is_sharded", "wrap_sharded"]
