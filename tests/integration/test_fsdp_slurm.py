"""examples/fsdp_lm on the real Slurm testbed: an FSDP2 run over 2 nodes x 1 rank and an
FSDP2 + TP run over 2 nodes x 2 ranks (TP inside each node, FSDP2 across), preempted,
rank-crashed and node-crashed, end bitwise identical to the same run uninterrupted, with the
SDC checks on (the replica check finds no replicas and notes it; it never faults)."""

from __future__ import annotations

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import row_for
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.testbed import Testbed
from tests.integration.helpers import RunFactory, crash_noted, paced, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 30
FAULTS = "preempt@step=6;crash@step=14,rank=1,restart=1;nodecrash@step=22,rank={last},restart=2"


@pytest.mark.parametrize(("parallel", "per_node"), [("fsdp", 1), ("tp", 2)])
def test_interrupted_sharded_run_is_bitwise_identical_on_the_testbed(
        testbed: Testbed, runs: RunFactory, parallel: str, per_node: int) -> None:
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=per_node, steps=STEPS, every_steps=5,
                      entrypoint="examples.fsdp_lm.train:main", data={"contract": "bitwise"},
                      sdc={"every_steps": 5}, config={"parallel": parallel})
    ref = runs.submit(spec)
    run = runs.submit(spec, inject=FAULTS.format(last=2 * per_node - 1))
    assert run.wait({"SUCCEEDED"}, timeout=600).step == STEPS
    assert ref.wait({"SUCCEEDED"}, timeout=300).step == STEPS
    faults = [str(e.payload.get("fault")) for e in run.valid(EntryKind.FAULT)]
    assert "sdc" not in faults and "user_error" not in faults, faults
    assert any(e.payload.get("event") == "replica_check_off" for e in run.valid(EntryKind.NOTE))
    a = load_state(ref.run_dir, find_committed(ref.run_dir))
    b = load_state(run.run_dir, find_committed(run.run_dir))
    assert diff_states(a, b) == []


def test_an_elastic_fsdp_run_shrinks_onto_the_surviving_nodes_and_reshards(
        testbed: Testbed, runs: RunFactory) -> None:
    """FSDP2 over 3 nodes x 1 rank, elastic: a node lost with no spare, the gang goes on with
    2 ranks in the same job, its DTensor state resharded 3 → 2 (uneven rows to even), every
    global batch consumed once."""
    steps = 200
    spec = slurm_spec(testbed, nodes=3, tasks_per_node=1, steps=steps, every_steps=10,
                      entrypoint="examples.fsdp_lm.train:main", data={"global_batch": 6},
                      membership={"mode": "elastic", "min_nodes": 2},
                      config={"parallel": "fsdp", "ledger": True})
    run = runs.submit(spec, inject=paced(0.05, 3))
    run.wait_for("a checkpoint on the shared tier and progress past it", lambda: (
        (rec := run.record()).step >= 30
        and any(c.tier == "shared" for c in rec.checkpoints)), timeout=240)
    gang = run.record().membership
    assert len(gang) == 3, "--nodes=2-3 on an idle testbed grants 3 nodes"
    victim = gang[1]
    try:
        crash_noted(testbed, run, victim, "node-loss-shrink")
        rec = run.wait({"SUCCEEDED"}, timeout=400)
    finally:
        testbed.boot(victim)
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0, rec
    assert rec.membership == tuple(n for n in gang if n != victim) and rec.step == steps
    restored = [e for e in run.rank_events("restored") if e["generation"] == rec.generation]
    assert {e["rank"] for e in restored} == {0, 1} and len({e["step"] for e in restored}) == 1
    faults = [str(e.payload.get("fault")) for e in run.valid(EntryKind.FAULT)]
    assert "sdc" not in faults and "user_error" not in faults, faults
    ev = collect(run.run_dir, victim_rank=1)
    broken = not_held(check_contracts(ev, row_for("node-loss-shrink")),
                      row_for("node-loss-shrink"))
    assert not broken, broken
