"""Train a small next-token model with DDP under torchrun: the "before" of docs/quickstart.md.

    torchrun --standalone --nproc-per-node 2 train_ddp.py --steps 300

Rank 0 saves snapshot.pt every --save-every steps; started again, the script resumes from it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SEQ_LEN = 32
GLOBAL_BATCH = 8


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


class Windows(Dataset[torch.Tensor]):
    """Every document end to end, cut into rows of SEQ_LEN + 1 tokens."""

    def __init__(self, directory: str) -> None:
        docs = [np.load(p) for p in sorted(Path(directory).glob("*.npy"))]
        flat = torch.from_numpy(np.concatenate(docs).astype(np.int64))
        rows = flat.numel() // (SEQ_LEN + 1)
        self.rows = flat[: rows * (SEQ_LEN + 1)].view(rows, SEQ_LEN + 1)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


def batches_from(loader: DataLoader[torch.Tensor], sampler: DistributedSampler[torch.Tensor],
                 step: int) -> Iterator[torch.Tensor]:
    """Batches from step ``step`` on: its epoch's order, without the batches already trained."""
    epoch, skip = divmod(step, len(loader))
    while True:
        sampler.set_epoch(epoch)
        for i, tokens in enumerate(loader):
            if i >= skip:
                yield tokens
        epoch, skip = epoch + 1, 0


def load_snapshot(path: Path, model: nn.Module, optim: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    snapshot = torch.load(path, weights_only=True)
    model.load_state_dict(snapshot["model"])
    optim.load_state_dict(snapshot["optim"])
    return int(snapshot["step"])


def save_snapshot(path: Path, model: nn.Module, optim: torch.optim.Optimizer,
                  step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, tmp)
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--data", default="data/docs")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--snapshot", type=Path, default=Path("snapshot.pt"))
    args = p.parse_args()
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous; "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = NextToken()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = load_snapshot(args.snapshot, model, optim)
    data = Windows(args.data)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=1234)
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler, drop_last=True)
    batches = batches_from(loader, sampler, step)
    net = DDP(model)
    while step < args.steps:
        tokens = next(batches)
        loss = loss_of(net, tokens)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        step += 1
        if rank == 0 and step % args.save_every == 0:
            save_snapshot(args.snapshot, model, optim, step)
            print(f"step {step}  loss {loss.item():.3f}  saved {args.snapshot}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
