"""A plain torchrun DDP training script: nothing in it knows hpcrun.

Run it with ``torchrun --nnodes 1 --nproc-per-node 2 train.py --ckpt /tmp/ddp.pt`` or, unchanged,
with ``hpcrun submit examples/torchrun_ddp/run.yaml``. It does what torchrun scripts commonly do
about preemption: on SIGTERM (what torchrun forwards) or SIGUSR1 (what Slurm sends) it finishes
the step in flight, saves with ``torch.save`` and exits; at start it resumes from its own file.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

STOP = {"asked": False}


def on_signal(signum: int, frame: object) -> None:
    STOP["asked"] = True


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt", default="checkpoints/torchrun_ddp.pt")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (demo pacing)")
    return p.parse_args()


def build() -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    # find_unused_parameters keeps DDP's first gradient-bucket layout for the whole run: a
    # resumed run then reduces every step as the uninterrupted one does, bit for bit on 3+
    # ranks too (torch otherwise rebuilds the buckets after the first step; docs/recovery.md).
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def save(path: str, model: DistributedDataParallel, optim: torch.optim.Optimizer,
         step: int) -> None:
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        torch.save({"model": model.module.state_dict(), "optim": optim.state_dict(),
                    "step": step}, tmp)
        os.replace(tmp, path)
        print(f"saved step {step} to {path}", flush=True)
    dist.barrier()


def load(path: str, model: DistributedDataParallel, optim: torch.optim.Optimizer) -> int:
    if not os.path.exists(path):
        return 0
    state = torch.load(path, weights_only=True)
    model.module.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    return int(state["step"])


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optim = build()
    start = load(args.ckpt, model, optim)
    print(f"rank {rank}/{dist.get_world_size()} starts at step {start}", flush=True)
    for step in range(start, args.steps):
        asked = torch.tensor([int(STOP["asked"])])
        dist.all_reduce(asked)  # every rank stops at the same step
        if asked.item():
            save(args.ckpt, model, optim, step)
            dist.destroy_process_group()
            return 0
        x, y = batch(step, rank)
        loss = F.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        time.sleep(args.step_time)
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1} loss {loss.item():.5f}", flush=True)
        if (step + 1) % args.save_every == 0:
            save(args.ckpt, model, optim, step + 1)
    save(args.ckpt, model, optim, args.steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
