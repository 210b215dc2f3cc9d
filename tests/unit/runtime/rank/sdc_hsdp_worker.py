"""One rank of a 4-rank gloo gang training an HSDP model (a (2, 2) mesh: replicate over dim 0,
shard over dim 1) under the SDC guard; rank 3 flips one bit of its shard after step 3.

Usage: python -m tests.unit.runtime.rank.sdc_hsdp_worker RANK PORT OUT_DIR

Writes OUT_DIR/rank-<r>.json: the replica groups the guard took from the mesh, how training
ended (the exception's type and message) and, on rank 0, the FAULT entries it logged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hpcrun.control.entries import FaultPayload
from hpcrun.control.spec import SdcPolicy
from hpcrun.runtime.rank.sdc_guard import SdcGuard
from hpcrun.testing import FakeClock
from tests.unit.runtime.rank.sdc_fakes import RecordingEvents, RecordingLog

WORLD, FLIP_AFTER, STEPS = 4, 3, 8


def main(rank: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    fully_shard(model, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard")))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    log = RecordingLog()
    guard = SdcGuard(policy=SdcPolicy(every_steps=2), rank=rank, node=f"n{rank // 2}",
                     world_size=WORLD, log=log,  # type: ignore[arg-type]
                     incarnation=SimpleNamespace(generation=1, holder="h"),  # type: ignore[arg-type]
                     events=RecordingEvents(), clock=FakeClock(), device="cpu")  # type: ignore[arg-type]
    guard.start({"model": model, "optim": optim})
    g = torch.Generator().manual_seed(10 + rank)  # each data-parallel rank its own batches
    batches = [torch.randn(4, 8, generator=g) for _ in range(STEPS)]

    def step(x: torch.Tensor) -> float:
        loss = model(x).square().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        return float(loss.item())

    ended = ["finished", ""]
    try:
        for s, x in enumerate(batches):
            guard.at_boundary(s, suspect=False)
            guard.observe_loss(guard.run_step(step, x, s), s + 1)
            if rank == 3 and s + 1 == FLIP_AFTER:
                guard.inject()  # a mantissa bit: the loss stays plausible
        guard.at_boundary(STEPS, suspect=False)
    except Exception as exc:  # what the rank's context would see
        ended = [type(exc).__name__, str(exc)]
    faults = [{"fault": str(e.fault), "rank": e.rank, "node": e.node, "step": e.step}
              for e in log.entries if isinstance(e, FaultPayload)]
    (out / f"rank-{rank}.json").write_text(json.dumps(
        {"groups": [list(gr) for gr in guard.groups], "ended": ended, "faults": faults}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
