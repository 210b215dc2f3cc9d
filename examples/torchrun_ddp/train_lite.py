"""``train.py`` with hpcrun.lite: hpcrun commits, stops and resumes it (four lite calls).

The script keeps its own ``init_process_group`` and its own loop; ``lite.restore`` loads the
newest committed checkpoint, ``lite.should_stop`` is the step boundary (a preemption commits
there, on every rank at the same step), ``lite.report`` gives status its steps and loss, and
``lite.save`` commits the end. Under plain torchrun the four calls do nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch.distributed as dist
import torch.nn.functional as F

import hpcrun.lite as lite

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported by name
from train import batch, build  # the plain script beside this one


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (demo pacing)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optim = build()
    start = lite.restore({"model": model.module, "optim": optim})
    for step in range(start, args.steps):
        if lite.should_stop():
            break
        x, y = batch(step, rank)
        loss = F.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        time.sleep(args.step_time)
        lite.report(step + 1, loss=loss.item(), tokens=x.shape[0])
    else:
        lite.save()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
