"""Elastic shrink on the real Slurm testbed: a node lost with no spare left, the elastic gang
goes on without it in the same job (``docs/recovery.md``, node-loss row). Run with ``-s`` to see
the RTO split.
"""

from __future__ import annotations

import pytest

from hpcrun.checkpoint.peer.ledger import fold_partner_copies
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import row_for
from hpcrun.drill.rto import rto_splits
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import (
    RunFactory,
    crash_noted,
    first_after,
    paced,
    slurm_spec,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 300
EVERY = 10



def test_node_crash_without_a_spare_shrinks_the_elastic_gang_within_the_same_job(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    # 12 rows per global batch: 2 per rank on 3 x 2 ranks, 3 per rank on 2 x 2
    spec = slurm_spec(testbed, nodes=3, tasks_per_node=2, steps=STEPS, every_steps=EVERY,
                      membership={"mode": "elastic", "min_nodes": 2},
                      data={"global_batch": 12}, config={"ledger": True})
    run = runs.submit(spec, inject=paced(0.05, 6))
    run.wait_for("a checkpoint on the shared tier and progress past it", lambda: (
        (rec := run.record()).step >= 3 * EVERY
        and any(c.tier == "shared" for c in rec.checkpoints)), timeout=180)
    first = run.record()
    gang = first.membership
    assert len(gang) == 3, "--nodes=2-3 on an idle testbed grants 3 nodes"
    victim = gang[1]  # never the batch host (the supervising node); the last one moves up
    try:
        crash_noted(testbed, run, victim, "node-loss-shrink", step=first.step)
        rec = run.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(victim)
    survivors = tuple(n for n in gang if n != victim)
    # the same job, no requeue: the gang went on without the lost node
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0, rec
    assert rec.quarantined == (victim,)
    assert rec.membership == survivors
    assert rec.step == STEPS
    assert [f.fault for f in rec.faults if not f.detail.startswith("checkpoint")][:1] == [
        "node_failure"] and victim in rec.faults[0].detail
    states = run.states()
    shrunk = first_after(states, "RECOVERING")
    assert shrunk.payload["nodes"] == list(survivors)
    assert "shrinks from 3 to 2 nodes" in shrunk.payload["reason"]
    restarted = first_after(states, "STARTING", shrunk.slot)
    assert restarted.payload["nodes"] == list(survivors)
    # world size is the smaller gang's, node ranks dense: 4 ranks, 0..3
    starts = [e for e in run.rank_events("restored") if e["generation"] == restarted.generation]
    assert {e["rank"] for e in starts} == {0, 1, 2, 3}
    # no rollback past the lost node's newest complete partner copy: the survivors read its
    # shards from the copy (the peer tier) when tier 1 had nothing as new
    before = [e for e in run.valid() if e.slot < restarted.slot]
    steps = {c.ckpt_id: c.step for c in fold_checkpoints(before)}
    held = [steps[c.ckpt_id] for c in fold_partner_copies(before).values()
            if c.owner == victim and c.complete and c.ckpt_id in steps]
    assert held, "the lost node's shards had a complete partner copy before the crash"
    assert len({e["step"] for e in starts}) == 1 and starts[0]["step"] >= max(held), (
        held, starts)
    # the drill contracts: exact samples (same global batches, none skipped or repeated),
    # cursor, fencing, no torn checkpoint, a restart not a requeue
    ev = collect(run.run_dir, victim_rank=3)
    results = check_contracts(ev, row_for("node-loss-shrink"))
    broken = not_held(results, row_for("node-loss-shrink"))
    assert not broken, broken
    assert {r.name for r in results if r.ok} >= {"samples", "cursor"}
    splits = [s for s in rto_splits(ev.entries, ev.events) if s.cause == "node_failure"]
    assert len(splits) == 1
    print(f"\nnode loss, elastic shrink: {victim} crashed, gang {len(gang)} -> "
          f"{len(survivors)} nodes, restored step {starts[0]['step']} (tiers "
          f"{sorted({e['data']['tier'] for e in starts})}, "
          f"{sum(e['data'].get('peer_bytes', 0) for e in starts)} B from peers), "
          f"RTO {splits[0].total_s:.1f} s: " + ", ".join(
              f"{k} {v:.1f} s" for k, v in splits[0].phases.items()))
    history = slurm.wait_for_accounting(int(run.job_id), {"COMPLETED"}, timeout=60)
    assert [r.state for r in history] in (["COMPLETED"], ["RESIZING", "COMPLETED"]), history
    wait_until(f"{victim} back in service", lambda: slurm.run(
        "sinfo", "-h", "-n", victim, "-o", "%T").stdout.strip() in ("idle", "mixed", "allocated"),
        timeout=60)


def test_an_elastic_gang_at_min_nodes_requeues_asking_for_a_range_and_runs_on_what_it_got(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    spec = slurm_spec(testbed, nodes=3, tasks_per_node=2, steps=STEPS, every_steps=EVERY,
                      membership={"mode": "elastic", "min_nodes": 2},
                      data={"global_batch": 12}, config={"ledger": True})
    run = runs.submit(spec, inject=paced(0.05, 6))
    run.wait_for("a checkpoint on the shared tier and progress past it", lambda: (
        (rec := run.record()).step >= 3 * EVERY
        and any(c.tier == "shared" for c in rec.checkpoints)), timeout=180)
    gang = run.record().membership
    first, second = gang[1], gang[2]
    survivors = (gang[0], second)
    try:
        crash_noted(testbed, run, first, "node-loss-shrink")
        run.wait_for("the shrunk gang past a new shared checkpoint", lambda: (
            (rec := run.record()).membership == survivors and rec.state == "RUNNING"
            and any(c.tier == "shared" and c.generation == rec.generation
                    for c in rec.checkpoints)), timeout=180)
        # at min_nodes now: the next loss requeues, asking Slurm for 2-3 nodes
        crash_noted(testbed, run, second, "node-loss")
        rec = run.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(first)
        testbed.boot(second)
    assert rec.requeues == 1 and rec.job_ids == (run.job_id,), rec
    assert set(rec.quarantined) == {first, second}
    assert rec.step == STEPS
    requeue = next(e for e in run.valid("note") if e.payload.get("event") == "requeue_sent")
    assert "nodes 2-3" in requeue.payload["detail"], requeue.payload
    # the requeued job got 2 of the 2-3 nodes it asked for (the quarantined ones excluded):
    # the gang formed on them, 4 ranks
    allocation = [e.payload["nodes"] for e in run.valid("job") if "nodes" in e.payload][-1]
    assert len(allocation) == 2 and not {first, second} & set(allocation), allocation
    assert rec.membership == tuple(allocation)
    last = [e for e in run.rank_events("restored") if e["generation"] == rec.generation]
    assert {e["rank"] for e in last} == {0, 1, 2, 3}
    ev = collect(run.run_dir, victim_rank=3)
    broken = not_held(check_contracts(ev, row_for("node-loss")), row_for("node-loss"))
    assert not broken, broken
