"""A small LightningModule on a synthetic regression task, with a resumable seeded loader.

The loader is deterministic: epoch ``e`` visits the samples in the order of a permutation
seeded by ``(seed, e)``, each rank taking every ``world_size``-th batch. It is stateful
(``state_dict`` / ``load_state_dict``), so Lightning saves its position with the loops and a
resumed run continues at the next unseen batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn


def synthetic_data(*, seed: int, samples: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and noisy targets of a fixed random linear map (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    return x, x @ w + 0.1 * torch.randn(samples, 1, generator=gen)


class SeededBatches:
    """This rank's batches of ``(x, y)``, in a seeded order per epoch, resumable mid-epoch.

    ``state_dict`` counts the batches the trainer *took* (``taken``), not the ones the loader
    produced: Lightning's fetcher reads one batch ahead of the step it is training.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.x, self.y = x, y
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.taken = 0
        """Batches of ``epoch`` already trained on (where an iteration starts)."""
        self._start = 0

    def __len__(self) -> int:
        return len(self.x) // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(len(self.x), generator=gen)
        start, self._start = self._start, 0
        for i in range(start, len(self)):
            first = (i * self.world_size + self.rank) * self.batch_size
            idx = order[first:first + self.batch_size]
            yield self.x[idx], self.y[idx]
        self.epoch += 1

    def took(self, batch_idx: int) -> None:
        """The trainer finished batch ``batch_idx`` of the current epoch."""
        self.taken = batch_idx + 1

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.taken = int(state["epoch"]), int(state["taken"])
        self._start = self.taken if self.taken < len(self) else 0


class Regressor(pl.LightningModule):
    """A two-layer MLP trained with SGD + momentum (optimizer state that must survive)."""

    def __init__(self, *, features: int = 8, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=False)
        # Counted here, not in on_train_batch_end: the callbacks' batch-end hooks (hpcrun's
        # commit among them) run before the module's, and must see this batch as taken.
        loader = self.trainer.train_dataloader
        if isinstance(loader, SeededBatches):
            loader.took(batch_idx)
        return loss

    def on_train_epoch_start(self) -> None:
        loader = self.trainer.train_dataloader
        if isinstance(loader, SeededBatches) and loader.taken >= len(loader):
            loader.taken = 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
