"""One rank of a 2 nodes x 2 ranks srun step: save dim-0 sharded state, restore it, report.

Usage (under srun, MASTER_ADDR/MASTER_PORT set): python sharded_restore.py RUN_DIR
Prints one JSON line per rank: bytes and files the restore read, the bytes of the rank's own
shard (from the committed manifest), and whether the rows came back equal.
"""

from __future__ import annotations

import json
import os
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
    fold_checkpoints,
    read_manifest,
)
from hpcrun.control.log import RunLog, new_holder

ROWS, COLS = 1024, 256


def table(key: int) -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS) + 1000 * key


def state(rank: int, world: int, fill: bool) -> dict[str, dict[str, RowShard]]:
    per = ROWS // world
    return {"shards": {f"t{k}": RowShard(
        tensor=table(k)[rank * per:(rank + 1) * per].clone() if fill else torch.zeros(per, COLS),
        row_start=rank * per, global_rows=ROWS) for k in range(3)}}


def main(run_dir: Path) -> None:
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    dist.init_process_group("gloo", rank=rank, world_size=world)
    layout = Layout(rank=rank, world_size=world, node_rank=int(os.environ["SLURM_NODEID"]),
                    local_rank=int(os.environ["SLURM_LOCALID"]),
                    num_nodes=int(os.environ["SLURM_NNODES"]), node=node)
    log = RunLog(run_dir)
    box: list[object] = [None]
    if rank == 0:
        (run_dir / "log").mkdir(parents=True, exist_ok=True)
        holder = new_holder()
        box = [(log.claim(holder).generation, holder)]
    dist.broadcast_object_list(box, group_src=0)
    generation, holder = box[0]  # type: ignore[misc]
    ident = CheckpointIdentity(run_id="sharded", spec_id="s", generation=generation,
                               holder=holder)

    def checkpointer() -> Checkpointer:
        return Checkpointer(identity=ident, tiers=TierLayout(run_dir=run_dir), layout=layout,
                            log=log)

    saver = checkpointer()
    saved = saver.save(5, state(rank, world, fill=True), blocking=True)
    saver.close()
    assert saved is not None and saved.committed, saved
    target = state(rank, world, fill=False)
    reader = checkpointer()
    result = reader.restore(target)
    reader.close()
    assert result is not None
    ckpt = fold_checkpoints(log.read())[-1]
    own = read_manifest(run_dir, ckpt).shards[rank]
    per = ROWS // world
    rows_ok = all(torch.equal(target["shards"][f"t{k}"], table(k)[rank * per:(rank + 1) * per])
                  for k in range(3))
    print(json.dumps({"rank": rank, "node": node, "bytes_read": result.bytes_read,
                      "files_read": result.files_read,
                      "own_bytes": sum(d.nbytes for d in own.datasets), "rows_ok": rows_ok}),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
