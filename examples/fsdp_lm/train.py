"""The tiny GPT trained under FSDP2 (``fully_shard``), or tensor parallel + FSDP2, by hpcrun.

``config.parallel`` picks the layout: ``fsdp`` shards every block and the root over one mesh
of all ranks; ``tp`` builds a 2-D ``(dp, tp=2)`` mesh, splits each block's MLP with
``ColwiseParallel`` / ``RowwiseParallel`` over ``tp`` and shards with FSDP2 over ``dp`` (the two
ranks of a ``tp`` group read the same batch). The model and optimizer are registered with
``ctx.restore`` as they are: hpcrun saves their DTensor state, reshards it onto another mesh or
world size on restore, and compares SDC fingerprints only among replicas of the same shard.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from examples.tiny_lm.model import GPTConfig, TinyGPT
from examples.tiny_lm.train import SampleLedger, seed_all
from hpcrun.data.pipeline import DataPipeline

TP = 2
"""Ranks of a tensor-parallel group (``parallel: tp``)."""


def shard(model: TinyGPT, ctx: Any) -> tuple[int, int]:
    """Shard ``model`` in place; (this rank's data-parallel index, data-parallel size)."""
    kind = "cuda" if torch.device(ctx.device).type == "cuda" else "cpu"
    if ctx.config.get("parallel", "fsdp") == "tp":
        if ctx.world_size % TP:
            raise ValueError(f"parallel: tp needs a multiple of {TP} ranks, got "
                             f"{ctx.world_size}; change resources or use parallel: fsdp")
        mesh = init_device_mesh(kind, (ctx.world_size // TP, TP), mesh_dim_names=("dp", "tp"))
        for block in model.blocks:
            parallelize_module(block.mlp, mesh["tp"], {"0": ColwiseParallel(),
                                                       "2": RowwiseParallel()})
        dp: DeviceMesh = mesh["dp"]
    else:
        dp = init_device_mesh(kind, (ctx.world_size,), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return int(dp.get_local_rank()), int(dp.size())


def build(ctx: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, DataPipeline]:
    cfg = ctx.config
    seed_all(cfg)  # identical initial weights everywhere, before sharding
    model = TinyGPT(GPTConfig(vocab=cfg["vocab"], seq_len=cfg["seq_len"],
                              d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                              n_heads=cfg["n_heads"])).to(ctx.device)
    replica, replicas = shard(model, ctx)
    optim = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]), weight_decay=0.01)
    data = DataPipeline(ctx.spec.data.manifest, seed=ctx.spec.data.seed,
                        global_batch=ctx.spec.data.global_batch, seq_len=cfg["seq_len"] + 1,
                        replica=replica, num_replicas=replicas, workers=1,
                        prefetch_batches=2, as_torch=True)
    return model, optim, data


def main(ctx: Any) -> None:
    model, optim, data = build(ctx)
    ctx.restore(model=model, optim=optim, data=data)

    def train_step(batch: dict[str, Any]) -> float:
        tokens = batch["tokens"].to(ctx.device, non_blocking=True).long()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        return float(loss.item())

    # the ranks of a tp group share one batch: only the first counts its tokens
    counts = ctx.config.get("parallel", "fsdp") != "tp" or ctx.rank % TP == 0
    ledger = SampleLedger(ctx, data)  # config.ledger: rank 0 records each step's samples
    for step in ctx.steps(int(ctx.config["steps"])):
        ledger.skips(ctx.skipped_steps)
        batch = next(data)
        loss = ctx.run_step(train_step, batch)
        ledger.record(step, int(batch["batch"]))
        ctx.step_done(tokens=int(batch["tokens"][:, 1:].numel()) if counts else 0, loss=loss)
    ledger.skips(ctx.skipped_steps)
    data.close()
