"""A ``main(ctx)`` whose state holds a tensor subclass hpcrun cannot checkpoint (``extra/odd``):
``ctx.restore`` refuses it, naming the path, before any step (preflight's registration row)."""

from __future__ import annotations

from typing import Any

import torch


class Odd(torch.Tensor):
    """A tensor subclass the checkpointer does not know."""


def main(ctx: Any) -> None:
    model = torch.nn.Linear(4, 4)
    ctx.restore(model=model, extra={"odd": torch.zeros(3).as_subclass(Odd)})
    for _ in ctx.steps(int(ctx.config.get("steps", 1))):
        raise AssertionError("a state hpcrun cannot save must be refused before any step")
