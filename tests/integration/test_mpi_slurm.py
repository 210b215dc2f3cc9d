"""Ranks started by Slurm's PMIx launcher (``srun --mpi=pmix``, one task per slot) on the real
testbed form hpcrun's process groups through mpi4py: rank, world size and rank 0's address from
``MPI.COMM_WORLD`` across two nodes."""

from __future__ import annotations

import json
import sys

import pytest

from hpcrun.testbed import JobClient
from tests.integration.helpers import REPO_ROOT

pytest.importorskip("mpi4py", reason="pip install 'hpcrun[mpi]' (mpi4py)")
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_srun_mpi_pmix_ranks_bootstrap_over_comm_world_on_two_nodes(slurm: JobClient) -> None:
    done = slurm.run("srun", "--mpi=pmix", "-N", "2", "--ntasks-per-node=1",
                     f"--chdir={REPO_ROOT}", "--export=ALL,OMP_NUM_THREADS=1",
                     sys.executable, "-m", "tests.integration.mpi_probe", timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in seen] == [0, 1]
    assert all((r["launcher"], r["world"], r["gathered"]) == ("mpi", 2, [0, 1]) for r in seen)
    assert seen[0]["host"] != seen[1]["host"]  # one rank per testbed node
