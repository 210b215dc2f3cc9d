"""One rank of a gloo gang that starts a DTensor-sharded model from an outside checkpoint.

Usage: python -m tests.unit.checkpoint.initfrom_worker LAYOUT RANK WORLD PORT SOURCE OUT NAME

A differently seeded model on LAYOUT (see :mod:`tests.unit.checkpoint.dtensor_worker`) and its
AdamW optimizer are loaded with ``hpcrun.checkpoint.initfrom.load_init(SOURCE, ...)`` over the
world group; rank 0 writes the global tensors (``full_tensor()``) of the model (and optimizer
state, when loaded) to OUT/NAME.npz.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from hpcrun.checkpoint.initfrom import load_init
from tests.unit.checkpoint.dtensor_worker import build, global_state


def main(layout: str, rank: int, world: int, port: int, source: str, out: Path,
         name: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    model = build(layout, world, seed=99)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = {"model": model, "optim": optim}
    loaded = load_init(source, state, group=dist.group.WORLD)
    whole = global_state(state if loaded.optimizer else {"model": model})
    if rank == 0:
        np.savez(out / f"{name}.npz", **whole)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
         Path(sys.argv[6]), sys.argv[7])
