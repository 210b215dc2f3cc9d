"""Train a small next-token model with DDP under hpcrun: the "after" of docs/quickstart.md.

    hpcrun submit run.yaml --backend local

hpcrun starts the ranks, sets up the process group, checkpoints model, optimizer and data
position at the cadence of run.yaml, and resumes from the newest committed step after a
preemption, a crash or a requeue.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcrun.data.pipeline import DataPipeline
from hpcrun.integrations.ddp import ddp

SEQ_LEN = 32


class NextToken(nn.Module):
    """Embed each token, mix it with its left neighbour, predict the token after it."""

    def __init__(self, vocab: int = 256, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Sequential(nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        left = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
        return self.mix(torch.cat([x, left], dim=-1))


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def main(ctx: Any) -> None:
    torch.manual_seed(0)
    model = NextToken()
    optim = torch.optim.AdamW(model.parameters(), lr=float(ctx.config["lr"]))
    data = DataPipeline(ctx.spec.data.manifest, seed=ctx.spec.data.seed,
                        global_batch=ctx.spec.data.global_batch, seq_len=SEQ_LEN + 1,
                        replica=ctx.rank, num_replicas=ctx.world_size, as_torch=True)
    ctx.restore(model=model, optim=optim, data=data)  # the newest committed step, if any
    net = ddp(ctx, model)  # DDP over the gang (the bare model for one rank)
    for _ in ctx.steps(int(ctx.config["steps"])):
        tokens = next(data)["tokens"].long()
        loss = loss_of(net, tokens)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        ctx.step_done(tokens=tokens[:, 1:].numel(), loss=loss.item())
        if ctx.rank == 0 and ctx.step % 50 == 0:
            print(f"step {ctx.step}  loss {loss.item():.3f}", flush=True)
    data.close()
