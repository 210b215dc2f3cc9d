"""The tiny example's training main: a small GPT trained with DDP, driven by hpcrun.

Everything operational (signals, checkpoint cadence and commits, the stop agreement, requeue)
is hpcrun's; this file only builds the model, the optimizer and the data, and trains. Model,
optimizer state and batches live on ``ctx.device`` (``cuda:<local_rank>`` on a GPU node, else the
CPU); ``config.deterministic`` asks torch for deterministic kernels, which a bitwise resume on a
GPU needs.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from examples.tiny_lm.model import GPTConfig, TinyGPT
from hpcrun.data.pipeline import DataPipeline
from hpcrun.integrations.ddp import ddp


def seed_all(cfg: Any) -> None:
    """Every RNG stream starts from the config's seed: identical initial weights on every rank,
    and a run that is the same bit for bit as its interrupted twin (the checkpoint carries the
    streams from there on; an unseeded stream would differ between the two from the start).
    ``deterministic`` asks torch for deterministic kernels."""
    seed = int(cfg.get("seed", 0))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if cfg.get("deterministic"):
        # warn_only: an op without a deterministic kernel warns (and a bitwise check then
        # shows the difference) instead of ending the run.
        torch.use_deterministic_algorithms(True, warn_only=True)


def build(ctx: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, DataPipeline]:
    cfg = ctx.config
    seed_all(cfg)
    model = TinyGPT(GPTConfig(vocab=cfg["vocab"], seq_len=cfg["seq_len"],
                              d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                              n_heads=cfg["n_heads"])).to(ctx.device)
    # AdamW creates its state next to each parameter, so it lives on ctx.device too.
    optim = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]), weight_decay=0.01)
    delay = float(cfg.get("read_delay_s", 0.0))
    data = DataPipeline(ctx.spec.data.manifest, seed=ctx.spec.data.seed,
                        global_batch=ctx.spec.data.global_batch, seq_len=cfg["seq_len"] + 1,
                        replica=ctx.rank, num_replicas=ctx.world_size, workers=1,
                        prefetch_batches=2, as_torch=True,
                        transform=SlowRead(delay) if delay > 0 else None)
    return model, optim, data


class SlowRead:
    """``config.read_delay_s``: every document read takes this much longer (a slow filesystem).

    The pipeline measures how long each step then waits for its batch, and the step events,
    ``hpcrun status`` and ``hpcrun report`` show it as input wait.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        time.sleep(self.delay_s)
        return tokens


def main(ctx: Any) -> None:
    model, optim, data = build(ctx)
    ctx.restore(model=model, optim=optim, data=data)
    # hpcrun's DDP: under data.contract bitwise its gradient buckets keep one layout, so a
    # resumed run reduces every step as the uninterrupted one does (docs/recovery.md).
    net = ddp(ctx, model)
    ledger = SampleLedger(ctx, data)

    def train_step(batch: dict[str, Any]) -> float:
        # The whole optimizer step from the batch alone: hpcrun can replay it on a suspect
        # step (silent data corruption check) with the same inputs.
        tokens = batch["tokens"].to(ctx.device, non_blocking=True).long()
        logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        return float(loss.item())

    for step in ctx.steps(int(ctx.config["steps"])):
        ledger.skips(ctx.skipped_steps)
        batch = next(data)
        loss = ctx.run_step(train_step, batch)
        ledger.record(step, int(batch["batch"]))
        ctx.step_done(tokens=int(batch["tokens"][:, 1:].numel()), loss=loss)
    ledger.skips(ctx.skipped_steps)
    data.close()


class SampleLedger:
    """Rank 0 records which samples each global step consumed (the sample ledger), and, written
    again with ``skipped``, a step whose update hpcrun dropped (``sdc.policy: skip_batch``)."""

    def __init__(self, ctx: Any, data: DataPipeline) -> None:
        self.on = bool(ctx.config.get("ledger")) and ctx.rank == 0
        self.ctx, self.data, self.written = ctx, data, 0
        self.path = ctx.inc.run_dir / "ledger.jsonl" if self.on else None

    def record(self, step: int, batch: int, *, skipped: bool = False) -> None:
        if self.path is None:
            return
        ids = self.data.sample_ids(batch)
        line = {"step": step, "batch": batch, "generation": self.ctx.generation,
                "samples": [[int(x) for x in row] for row in ids.tolist()],
                **({"skipped": True} if skipped else {})}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def skips(self, skipped: tuple[tuple[int, str], ...]) -> None:
        for done, batch in skipped[self.written:]:
            self.record(done - 1, int(batch), skipped=True)  # ``done`` counts completed steps
        self.written = len(skipped)

