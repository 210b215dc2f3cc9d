"""A ``main(ctx)`` that builds its DistributedDataParallel by hand, with torch's defaults, as a
user's own script does (for the bitwise warning test)."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel


def main(ctx: Any) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.restore(model=model, optim=optim)
    for _ in ctx.steps(ctx.config["steps"]):
        optim.zero_grad()
        loss = model(torch.ones(2, 4)).square().mean()
        loss.backward()
        optim.step()
        ctx.step_done(loss=float(loss))
