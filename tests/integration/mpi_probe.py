"""One rank started by an MPI launcher: form hpcrun's process groups from the MPI environment
(rank, world size and rank 0's address over ``MPI.COMM_WORLD``) and print what it formed.

Run as ``mpiexec -n 2 python -m tests.integration.mpi_probe`` (tests/integration/
test_mpi_bootstrap.py); not collected by pytest.
"""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist

from hpcrun.launch.dist import destroy_process_group, form_groups
from hpcrun.launch.env import DistEnv
from hpcrun.launch.gpu import GpuSettings


def main() -> None:
    environ = dict(os.environ)
    env = DistEnv.from_environ(environ)
    groups = form_groups(env, GpuSettings.from_environ(environ))
    ranks = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(ranks, torch.tensor([float(dist.get_rank())]))
    total = torch.tensor([1.0])
    dist.all_reduce(total, group=groups.checkpoint_group)
    print(json.dumps({"launcher": str(env.launcher), "rank": dist.get_rank(),
                      "world": dist.get_world_size(), "local_rank": env.local_rank,
                      "host": socket.gethostname(), "backend": groups.backend,
                      "gathered": [int(r.item()) for r in ranks],
                      "checkpoint_group_sum": total.item()}), flush=True)
    destroy_process_group()


if __name__ == "__main__":
    main()
