"""A Lightning Trainer under hpcrun: ``hpcrun submit examples/lightning/run.yaml``.

The three hpcrun lines are marked; the rest is an ordinary Lightning script.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from examples.lightning.model import Regressor, SeededBatches, synthetic_data
from hpcrun.integrations import lightning as hl  # hpcrun


def main(ctx: Any) -> None:
    cfg = ctx.config
    seed = int(cfg.get("seed", 0))
    pl.seed_everything(seed, verbose=False)  # python, numpy, torch: the same on every rank
    features = int(cfg.get("features", 8))
    x, y = synthetic_data(seed=seed, samples=int(cfg.get("samples", 512)), features=features)
    loader = SeededBatches(x, y, batch_size=int(cfg.get("batch_size", 8)), seed=seed,
                           rank=ctx.rank, world_size=ctx.world_size)
    model = Regressor(features=features, lr=float(cfg.get("lr", 0.05)))
    trainer = pl.Trainer(max_steps=int(cfg.get("steps", 60)), logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False,  # the loader splits by rank itself
                         **hl.trainer_kwargs(ctx))  # hpcrun
    hl.fit(ctx, trainer, model, train_dataloaders=loader)  # hpcrun
