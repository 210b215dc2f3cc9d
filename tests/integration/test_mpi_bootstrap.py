"""Ranks started by Open MPI's ``mpiexec`` (no Slurm, no hpcrun agent) form hpcrun's process
groups through mpi4py: rank and world size from the MPI runtime, rank 0's host and port over
``MPI.COMM_WORLD``, then real gloo collectives on the default and checkpoint groups."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.integration.local_helpers import REPO_ROOT

MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(
    MPIEXEC is None, reason="no mpiexec: apt-get install -y openmpi-bin libopenmpi-dev")


def test_two_ranks_started_by_mpiexec_bootstrap_over_comm_world() -> None:
    pytest.importorskip("mpi4py", reason="pip install 'hpcrun[mpi]' (mpi4py)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPCRUN_", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    assert MPIEXEC is not None
    done = subprocess.run(
        [MPIEXEC, "-n", "2", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
         sys.executable, "-m", "tests.integration.mpi_probe"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in seen] == [0, 1]
    for r in seen:
        assert (r["launcher"], r["world"], r["backend"]) == ("mpi", 2, "gloo")
        assert r["gathered"] == [0, 1] and r["checkpoint_group_sum"] == 2.0
    assert sorted(r["local_rank"] for r in seen) == [0, 1]  # one host: two local ranks
