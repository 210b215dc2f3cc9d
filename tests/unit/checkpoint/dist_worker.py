"""One rank of a 4-process gloo gang on two emulated nodes (each with its own tier 0).

Usage: python -m tests.unit.checkpoint.dist_worker RANK PORT RUN_DIR TIER0_BASE OUT_DIR

Scenario (writes OUT_DIR/rank-<r>-<phase>.json for the test to assert on):
  A. 4 ranks on nodes a,b save step 10 on tier 0 (replicated model, dim-0 sharded table);
     each node's agent role drains, the node-0 agent role commits tier 1.
  B. ranks 0,1 (a 2-rank group, node a) restore the 4-rank checkpoint (4 → 2) and save step 20.
  C. all 4 ranks restore the 2-rank checkpoint (2 → 4).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hpcrun.checkpoint import (
    Checkpointer,
    CheckpointIdentity,
    Layout,
    RowShard,
    TierLayout,
    drain_pending,
    finalize_tier1,
)
from hpcrun.control.log import RunLog, new_holder

from .conftest import trained

ROWS, COLS = 37, 5


def table(scale: float) -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS) * scale + 1


class Sharded:
    """A user object holding this rank's rows of a dim-0 sharded table."""

    def __init__(self, rank: int, world: int, scale: float) -> None:
        self.bounds = [len(p) for p in torch.tensor_split(torch.arange(ROWS), world)]
        self.start = sum(self.bounds[:rank])
        self.rows = table(scale)[self.start:self.start + self.bounds[rank]].clone()

    def state_dict(self) -> dict:
        return {"table": RowShard(tensor=self.rows, row_start=self.start, global_rows=ROWS)}

    def load_state_dict(self, sd: dict) -> None:
        self.rows = sd["table"].clone()


def claim(log: RunLog, group, rank: int) -> tuple[int, str, int]:
    box = [None]
    if rank == 0:
        holder = new_holder()
        fence = log.claim(holder)
        box = [(fence.generation, holder, fence.slot)]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]


def checkpointer(run_dir: Path, tier0: Path, layout: Layout, group, log: RunLog) -> Checkpointer:
    gen, holder, slot = claim(log, group, layout.rank)
    return Checkpointer(
        identity=CheckpointIdentity(run_id="run1", spec_id="spec1", generation=gen,
                                    holder=holder),
        tiers=TierLayout(run_dir=run_dir, node_local_root=tier0 / layout.node), layout=layout,
        log=log, fence_slot=slot, group=group)


def report(out: Path, rank: int, phase: str, res, model, sharded: Sharded, seed: int,
           scale: float) -> None:
    want_model, _ = trained(seed)
    body = {"step": res.step if res else None, "tier": res.tier if res else None,
            "model_ok": all(torch.equal(a, b) and a.dtype == b.dtype for a, b in
                            zip(model.state_dict().values(), want_model.state_dict().values(),
                                strict=True)),
            "rows_ok": torch.equal(sharded.rows, table(scale)[sharded.start:sharded.start
                                                             + len(sharded.rows)]),
            "nrows": len(sharded.rows)}
    (out / f"rank-{rank}-{phase}.json").write_text(json.dumps(body))


def main(rank: int, port: int, run_dir: Path, tier0: Path, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4)
    log = RunLog(run_dir)
    node = "a" if rank < 2 else "b"
    lay4 = Layout(rank=rank, world_size=4, node_rank=rank // 2, local_rank=rank % 2,
                  num_nodes=2, node=node)
    # A: save on 4 ranks, drain per node, finalize tier 1.
    model, opt = trained(1)
    ck = checkpointer(run_dir, tier0, lay4, None, log)
    res = ck.save(10, {"model": model, "optim": opt, "sharded": Sharded(rank, 4, 1.0)},
                  blocking=True)
    ck.close()
    assert res is not None and res.committed
    if lay4.local_rank == 0:
        gen, holder = ck.id.generation, ck.id.holder
        drain_pending(run_dir, tier0 / node, node=node, log=log, generation=gen, holder=holder)
    dist.barrier()
    if rank == 0:
        finalize_tier1(run_dir, log=log, generation=ck.id.generation, holder=ck.id.holder)
    dist.barrier()
    # B: 4 → 2 on node a, then save step 20 there.
    group2 = dist.new_group([0, 1])
    if rank < 2:
        lay2 = Layout(rank=rank, world_size=2, node_rank=0, local_rank=rank, num_nodes=1,
                      node="a")
        ck2 = checkpointer(run_dir, tier0, lay2, group2, log)
        model, opt, sh = *trained(7), Sharded(rank, 2, 0.0)
        res = ck2.restore({"model": model, "optim": opt, "sharded": sh})
        report(out, rank, "B", res, model, sh, 1, 1.0)
        model, _ = trained(2)
        ck2.save(20, {"model": model, "optim": opt, "sharded": Sharded(rank, 2, 3.0)},
                 blocking=True)
        ck2.close()
    dist.barrier()
    # C: 2 → 4 on nodes a, b.
    ck4 = checkpointer(run_dir, tier0, lay4, None, log)
    model, opt, sh = *trained(7), Sharded(rank, 4, 0.0)
    res = ck4.restore({"model": model, "optim": opt, "sharded": sh})
    report(out, rank, "C", res, model, sh, 2, 3.0)
    ck4.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]),
         Path(sys.argv[5]))
