"""One rank of a gloo gang that saves or restores a DTensor-sharded model and its optimizer.

Usage: python -m tests.unit.checkpoint.dtensor_worker MODE LAYOUT RANK WORLD PORT RUN_DIR OUT

LAYOUT: ``fsdp`` (FSDP2 over all ranks), ``tp`` (a (dp, 2) mesh: tensor parallel over ``tp``,
FSDP2 over ``dp``), ``hsdp`` (a (2, dp) mesh: replicate over dim 0, shard over dim 1) or
``wide`` (FSDP2 over all ranks of one 4 MiB layer: boxes large enough to be checksummed in
row blocks, so a rank that needs part of an old box reads only those blocks).
MODE ``save``: seeded model, two AdamW steps, a blocking checkpoint at step 2; writes the
global tensors (``full_tensor()``) of the model and optimizer state to OUT/saved.npz.
MODE ``restore``: a differently seeded model on LAYOUT restores the newest checkpoint and
writes its global tensors to OUT/restored-<world>.npz (rank 0 writes; every rank checks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.checkpoint.sharded import wrap_sharded
from hpcrun.control.log import RunLog, new_holder


class Mlp(torch.nn.Module):
    """Dims that 3 and 4 ranks split unevenly (14 rows: 4, 4, 4, 2); even over 2 for TP."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.up = torch.nn.Linear(7, 14)
        self.down = torch.nn.Linear(14, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Wide(torch.nn.Module):
    """One 4096 x 256 fp32 layer (4 MiB): on 2 ranks each box is 2 MiB, two row blocks."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.up = torch.nn.Linear(7, 256, bias=False)
        self.wide = torch.nn.Linear(256, 4096, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(self.up(x))


def build(layout: str, world: int, seed: int) -> torch.nn.Module:
    model: torch.nn.Module = Wide(seed) if layout == "wide" else Mlp(seed)
    if layout == "tp":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(),
                                               "down": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    elif layout == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
        fully_shard(model, mesh=mesh)
    else:
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    return model


def train(model: torch.nn.Module, optim: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randn(4, 7, generator=g)
        model(x).square().mean().backward()
        optim.step()
        optim.zero_grad()


def global_state(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every tensor of the model's and optimizer's state dicts, whole, by path."""
    out: dict[str, np.ndarray] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, torch.Tensor):
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            out[prefix] = whole.detach().numpy().copy()

    for name, obj in wrap_sharded(state).items():
        walk(name, obj.state_dict())
    return out


def checkpointer(run_dir: Path, rank: int, world: int, log: RunLog) -> Checkpointer:
    box: list[Any] = [None]
    if rank == 0:
        holder = new_holder()
        fence = log.claim(holder)
        box = [(fence.generation, holder, fence.slot)]
    dist.broadcast_object_list(box, src=0)
    gen, holder, slot = box[0]
    per_node = 2 if world % 2 == 0 else world  # nodes of equal size, as Slurm gives them
    layout = Layout(rank=rank, world_size=world, node_rank=rank // per_node,
                    local_rank=rank % per_node, num_nodes=world // per_node,
                    node=f"n{rank // per_node}")
    return Checkpointer(
        identity=CheckpointIdentity(run_id="run1", spec_id="spec1", generation=gen,
                                    holder=holder),
        tiers=TierLayout(run_dir=run_dir), layout=layout, log=log, fence_slot=slot)


def main(mode: str, layout: str, rank: int, world: int, port: int, run_dir: Path,
         out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    log = RunLog(run_dir)
    model = build(layout, world, seed=1 if mode == "save" else 99)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = {"model": model, "optim": optim}  # as a user registers them: no adapter
    ck = checkpointer(run_dir, rank, world, log)
    if mode == "save":
        train(model, optim, 2)
        res = ck.save(2, state, blocking=True)
        assert res is not None and res.committed, res
        name = "saved"
    else:
        res = ck.restore(state)
        assert res is not None and res.step == 2, res
        name = f"restored-{world}"
        (out / f"read-{rank}.json").write_text(json.dumps(
            {"bytes_read": res.bytes_read, "files_read": res.files_read}))
    whole = global_state(state)
    if rank == 0:
        np.savez(out / f"{name}.npz", **whole)
    ck.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
         Path(sys.argv[6]), Path(sys.argv[7]))
