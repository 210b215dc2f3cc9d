"""A one-rank writer that SIGKILLs itself at a named stage of its second save.

Usage: python -m tests.unit.checkpoint.crash_worker RUN_DIR NODE_LOCAL_ROOT STAGE
(NODE_LOCAL_ROOT "-" for none). The first save (step 1, seed 1) commits; the second (step 2,
seed 2) dies at STAGE.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, TierLayout
from hpcrun.control.log import RunLog, new_holder

from .conftest import SINGLE, trained


def main(run_dir: str, local_root: str, stage: str) -> None:
    torch.set_num_threads(1)
    log = RunLog(run_dir)
    holder = new_holder()
    fence = log.claim(holder)

    def hook(at: str, step: int) -> None:
        if at == stage and armed:
            os.kill(os.getpid(), signal.SIGKILL)

    armed = False
    tiers = TierLayout(run_dir=Path(run_dir),
                       node_local_root=None if local_root == "-" else Path(local_root))
    ident = CheckpointIdentity(run_id="run1", spec_id="spec1", generation=fence.generation,
                               holder=holder)
    ck = Checkpointer(identity=ident, tiers=tiers, layout=SINGLE, log=log, fence_slot=fence.slot,
                      fault_hook=hook)
    for step, seed in ((1, 1), (2, 2)):
        armed = step == 2
        model, opt = trained(seed)
        ck.save(step, {"model": model, "optim": opt}, blocking=True)
    ck.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
