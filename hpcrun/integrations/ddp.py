"""DistributedDataParallel on hpcrun's gang, with a bucket layout a resume reproduces.

Why a helper: torch's ``DistributedDataParallel`` reduces gradients in buckets, and its
Reducer lays them out twice. The first iteration runs with every parameter in one bucket in
reverse definition order; after it, the Reducer rebuilds the buckets in the order the
gradients became ready (a 1 MiB first bucket, then 25 MiB ones) and keeps that layout. A run
resumed from a checkpoint builds a fresh DDP, so its first step after the restore uses the
initial layout where the run that kept going uses the rebuilt one. Gloo's ring all-reduce sums
each element in a rank order set by the element's offset in its bucket: with 3 or more ranks a
different offset gives a different float sum (with 2, ``a + b == b + a``), and the two runs
part from the first step after the restore.

``find_unused_parameters=True`` is torch's documented switch that keeps the constructor's
layout for the whole run (the Reducer rebuilds only when it is off or the graph is static), so
an uninterrupted and a resumed run reduce every step with the same buckets. Its cost is one
traversal of the autograd graph per step, and torch warns once per rank that no parameter was
unused; the helper asks for it only under the ``bitwise`` contract, the one that promises the
same bits (docs/recovery.md, "Bitwise resume and DDP buckets").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcrun.errors import SpecError
from hpcrun.vocab import ResumeContract

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpcrun.protocols import RunContext

_FIXED_LAYOUT = {"find_unused_parameters": True, "static_graph": False}
"""The DDP arguments under which the Reducer never rebuilds its buckets."""


def ddp_kwargs(contract: ResumeContract, device: torch.device,
               **user_kwargs: Any) -> dict[str, Any]:
    """The ``DistributedDataParallel`` arguments for a rank on ``device`` under ``contract``.

    Args:
        contract: the run's ``data.contract``.
        device: the rank's device; a CUDA device becomes ``device_ids=[index]``.
        user_kwargs: the caller's own DDP arguments; they win, except where ``bitwise`` needs
            the fixed bucket layout.

    Returns:
        Keyword arguments for ``DistributedDataParallel(model, **kwargs)``.

    Raises:
        SpecError: under ``bitwise``, an argument that lets the Reducer rebuild its buckets.
    """
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index]
    return {**kwargs, **bucket_layout_kwargs(contract, user_kwargs), **user_kwargs}


def bucket_layout_kwargs(contract: ResumeContract,
                         user_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The DDP arguments that keep one gradient-bucket layout, under ``bitwise`` ({} else).

    Raises:
        SpecError: under ``bitwise``, one of ``user_kwargs`` lets the Reducer rebuild.
    """
    if contract is not ResumeContract.BITWISE:
        return {}
    clash = {k: v for k, v in user_kwargs.items() if k in _FIXED_LAYOUT and v != _FIXED_LAYOUT[k]}
    if clash:
        raise SpecError(
            f"DDP arguments {clash} let torch rebuild the gradient buckets after the first "
            f"step, so a resumed run would reduce differently from an uninterrupted one; "
            f"data.contract: bitwise needs {_FIXED_LAYOUT}. Drop those arguments, or set "
            f"data.contract to exact-order if the same bits after a resume are not needed")
    return dict(_FIXED_LAYOUT)


def ddp(ctx: RunContext, model: nn.Module, **user_kwargs: Any) -> nn.Module:
    """Wrap ``model`` in DDP over the run's gang; the bare model when the gang has one rank.

    Args:
        ctx: the run's context (its device, world size and ``data.contract``).
        model: the module, already on ``ctx.device`` and restored (``ctx.restore``).
        user_kwargs: further ``DistributedDataParallel`` arguments (see :func:`ddp_kwargs`).

    Returns:
        The module to call in the training step.
    """
    if ctx.world_size == 1:
        return model
    import torch
    from torch.nn.parallel import DistributedDataParallel

    kwargs = ddp_kwargs(ResumeContract(ctx.spec.data.contract), torch.device(ctx.device),
                        **user_kwargs)
    return DistributedDataParallel(model, **kwargs)
