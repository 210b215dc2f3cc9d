"""Liveness over the network on the real Slurm testbed: the ``shared-fs-stall`` drill row
(``docs/recovery.md``). Every shared-tier operation of the gang's ranks and agents blocks for
10 s; with liveness read from files alone, every node would have been declared lost after 3 s.
Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import DrillFault, injection, row_for
from hpcrun.testbed import Testbed
from tests.integration.helpers import RunFactory, paced, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 120
EVERY = 10
AT = 35


def test_a_stalled_shared_filesystem_loses_no_node_and_no_commit(
        testbed: Testbed, runs: RunFactory) -> None:
    row = row_for(DrillFault.SHARED_FS_STALL)
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=1, steps=STEPS, every_steps=EVERY,
                      resources={"spare_nodes": 1}, config={"ledger": True})
    stall = injection(row, at=AT, world_size=2, tasks_per_node=1)
    run = runs.submit(spec, inject=f"{paced(0.05, 2)};{stall}")
    rec = run.wait({"SUCCEEDED"}, timeout=180)
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0 and rec.restarts == 0, rec
    assert rec.quarantined == (), "no healthy node is quarantined"
    assert rec.step == STEPS
    allocation = next(e.payload["nodes"] for e in run.valid("job") if "nodes" in e.payload)
    assert len(allocation) == 3, "the gang and its hot spare"
    stalls = [e for e in run.valid(EntryKind.FAULT)
              if e.payload.get("signature") == "storage:stall"]
    assert stalls and stalls[0].payload["background"] is True, "the stall is reported"
    assert not [e for e in run.valid(EntryKind.FAULT)
                if e.payload.get("fault") == "node_failure"], "no node declared lost"
    commits = [e.payload["step"] for e in run.valid(EntryKind.COMMIT)]
    assert max(commits) == STEPS and [s for s in commits if s > AT], "commits after the stall"
    ev = collect(run.run_dir, victim_rank=1)
    broken = not_held(check_contracts(ev, row), row)
    assert not broken, broken
    status = run.cli("status", str(run.run_dir))
    assert "shared filesystem stalled" in status.stdout, status.stdout
    print(f"\nshared-fs-stall: {stalls[0].payload['detail']}")
