"""Node loss inside the allocation on the real Slurm testbed: a hot spare takes the lost node's
place in the same job (``docs/recovery.md``, node-loss row). Run with ``-s`` to see the RTO split.
"""

from __future__ import annotations

import time

import pytest

from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import row_for
from hpcrun.drill.rto import rto_splits
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import (
    TEARDOWN_S,
    RunFactory,
    TestbedRun,
    crash_noted,
    first_after,
    paced,
    run_figures_of,
    sacct_allocations,
    slurm_spec,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 300
EVERY = 10



def test_node_crash_with_a_spare_swaps_it_in_within_the_same_job(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=2, steps=STEPS, every_steps=EVERY,
                      resources={"spare_nodes": 1}, config={"ledger": True})
    run = runs.submit(spec, inject=paced(0.05, 4))
    run.wait_for("a checkpoint on the shared tier and progress past it", lambda: (
        (rec := run.record()).step >= 3 * EVERY
        and any(c.tier == "shared" for c in rec.checkpoints)), timeout=180)
    first = run.record()
    allocation = next(e.payload["nodes"] for e in run.valid("job") if "nodes" in e.payload)
    gang = first.membership
    assert len(allocation) == 3 and len(gang) == 2, "N+S nodes allocated, the gang on N"
    spare = next(n for n in allocation if n not in gang)
    victim = gang[-1]  # never the batch host (the supervising node)
    try:
        crash_noted(testbed, run, victim, "node-loss-spare", step=first.step)
        rec = run.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(victim)
    # the same job, no requeue: the spare took the lost node's place (and its ranks)
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0, rec
    assert rec.quarantined == (victim,)
    assert rec.membership == tuple(spare if n == victim else n for n in gang)
    assert rec.step == STEPS
    assert [f.fault for f in rec.faults if not f.detail.startswith("checkpoint")][:1] == [
        "node_failure"] and victim in rec.faults[0].detail
    states = run.states()
    swapped = first_after(states, "RECOVERING")
    assert swapped.payload["nodes"] == list(rec.membership)
    restarted = first_after(states, "STARTING", swapped.slot)
    assert restarted.payload["nodes"] == list(rec.membership)
    # world size counts the gang only: every rank of the swapped-in gang saw 4 ranks
    starts = [e for e in run.rank_events("restored") if e["generation"] == restarted.generation]
    assert {e["rank"] for e in starts} == {0, 1, 2, 3}
    # the drill contracts: exact samples, fencing, no torn checkpoint, a restart not a requeue
    ev = collect(run.run_dir, victim_rank=3)
    results = check_contracts(ev, row_for("node-loss-spare"))
    broken = not_held(results, row_for("node-loss-spare"))
    assert not broken, broken
    splits = [s for s in rto_splits(ev.entries, ev.events) if s.cause == "node_failure"]
    assert len(splits) == 1
    print(f"\nnode loss with a hot spare: {victim} crashed, {spare} swapped in, "
          f"RTO {splits[0].total_s:.1f} s: " + ", ".join(
              f"{k} {v:.1f} s" for k, v in splits[0].phases.items())
          + "; start: " + ", ".join(f"{k} {v:.2f} s" for k, v in splits[0].start_parts.items()))
    # Slurm never requeued the job: it shrank it (RESIZING, the lost node removed) and the
    # same run completed
    history = slurm.wait_for_accounting(int(run.job_id), {"COMPLETED"}, timeout=60)
    assert [r.state for r in history] in (["COMPLETED"], ["RESIZING", "COMPLETED"]), history
    _allocation_agrees_with_slurms_clock(run, slurm)
    wait_until(f"{victim} back in service", lambda: slurm.run(
        "sinfo", "-h", "-n", victim, "-o", "%T").stdout.strip() in ("idle", "mixed", "allocated"),
        timeout=60)


def test_losing_the_supervising_node_hands_supervision_to_a_survivor_in_the_same_job(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=2, steps=STEPS, every_steps=EVERY,
                      resources={"spare_nodes": 1}, config={"ledger": True})
    run = runs.submit(spec, inject=paced(0.05, 4))
    run.wait_for("a checkpoint on the shared tier and progress past it", lambda: (
        (rec := run.record()).step >= 3 * EVERY
        and any(c.tier == "shared" for c in rec.checkpoints)), timeout=180)
    first = run.record()
    allocation = next(e.payload["nodes"] for e in run.valid("job") if "nodes" in e.payload)
    gang = first.membership
    spare = next(n for n in allocation if n not in gang)
    victim, survivor = gang[0], gang[1]  # node rank 0: the supervising agent, the batch host
    try:
        crash_noted(testbed, run, victim, "node-loss-supervisor", step=first.step)
        rec = run.wait({"SUCCEEDED"}, timeout=300)
        job_end = _job_end(slurm, int(run.job_id), timeout=90)
        history = [r.state for r in slurm.history(int(run.job_id))]
    finally:
        testbed.boot(victim)
    # the same job, no requeue, and the survivor with the lowest node rank took over
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0, rec
    claims = run.valid("supervise")
    assert [(c.payload["node"], c.payload["replaces"]) for c in claims] == [(survivor, victim)]
    assert rec.quarantined == (victim,)
    assert rec.membership == (spare, survivor), "the spare takes node rank 0's position"
    assert rec.step == STEPS
    assert [f.fault for f in rec.faults if not f.detail.startswith("checkpoint")][:1] == [
        "node_failure"] and victim in rec.faults[0].detail
    states = run.states()
    swapped = first_after(states, "RECOVERING")
    assert swapped.payload["nodes"] == [spare, survivor]
    assert swapped.writer.startswith(f"{survivor}:"), "the new supervisor decided the swap"
    restarted = first_after(states, "STARTING", swapped.slot)
    assert restarted.writer.startswith(f"{survivor}:") and restarted.slot > claims[0].slot
    # rank 0's duties moved with node rank 0: the spare runs ranks 0 and 1 (rank 0 commits)
    starts = [e for e in run.rank_events("restored") if e["generation"] == restarted.generation]
    assert {(e["rank"], e["node"]) for e in starts} == {
        (0, spare), (1, spare), (2, survivor), (3, survivor)}
    commits = [e for e in run.valid("commit") if e.generation == restarted.generation]
    assert commits and all(c.writer.startswith(f"{spare}:") for c in commits
                           if c.payload["tier"] == "node_local")
    # the drill contracts: exact samples, fencing, no torn checkpoint, a restart not a requeue
    ev = collect(run.run_dir, victim_rank=0)
    results = check_contracts(ev, row_for("node-loss-supervisor"))
    broken = not_held(results, row_for("node-loss-supervisor"))
    assert not broken, broken
    splits = [s for s in rto_splits(ev.entries, ev.events) if s.cause == "node_failure"]
    assert len(splits) == 1
    # the batch script died with the victim: the new supervisor gave the allocation back
    # instead of leaving it held until the time limit
    assert job_end == "CANCELLED", (job_end, history)
    print(f"\nsupervising node lost: {victim} crashed, {survivor} took over, {spare} swapped "
          f"in, RTO {splits[0].total_s:.1f} s: " + ", ".join(
              f"{k} {v:.1f} s" for k, v in splits[0].phases.items())
          + f"; Slurm: {job_end} {history}")


def _job_end(slurm: JobClient, job_id: int, *, timeout: float) -> str:
    """The job's state once it left RUNNING (or the last one seen within ``timeout``)."""
    deadline, state = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        state = slurm.state(job_id)
        if state not in (None, "RUNNING", "COMPLETING", "RESIZING"):
            break
        time.sleep(1.0)
    return str(state)


def _allocation_agrees_with_slurms_clock(run: TestbedRun, slurm: JobClient) -> None:
    """Allocated seconds and node-hours by hand from ``sacct``'s Start, End and NNodes of
    every record of the job (a shrink is a record of its own) against ETTR's and the record's:
    the restart's gap is inside the allocation, so charged, and the spare is counted."""
    from hpcrun.control.budget import usage_of
    from hpcrun.observe.ettr import Bucket

    rows = sacct_allocations(slurm, run.job_id)
    hand_s = rows[-1][1] - rows[0][0]
    hand_nh = sum((end - start) * n for start, end, n in rows) / 3600.0
    rec = run.record()
    fig = run_figures_of(run)
    print(f"\nsacct {rows}: {hand_s} s, {hand_nh:.4f} node-h; record {rec.allocations}; "
          f"ETTR {fig.ettr:.3f} of {fig.allocated_s:.1f} s, {fig.node_hours:.4f} node-h "
          f"({fig.spare_node_hours:.4f} on spares), recovery {fig.seconds[Bucket.RECOVERY]:.1f} s")
    (alloc,) = rec.allocations
    assert abs(alloc.start - rows[0][0]) <= 1.0, "the allocation starts at Slurm's Start"
    # the record's end is the terminal state; Slurm's End follows the agents' exit (3.5 s
    # measured on a loaded machine: teardown the record does not charge yet; under a second
    # on a quiet one, where sacct's whole seconds can put its End before the record's)
    assert -1.0 <= hand_s - fig.allocated_s <= TEARDOWN_S
    assert alloc.nodes == 3 and alloc.spares == 1
    assert fig.spare_node_hours == pytest.approx(fig.allocated_s / 3600.0)
    # one node-hours figure: what the budgets count is what status and the report show
    usage = usage_of(rec, nodes=3, now=0.0)
    assert fig.node_hours == pytest.approx(usage.node_hours)
    # until Slurm shrank the job (the lost node removed), node-seconds agree with its own
    assert rows[0][2] == alloc.nodes and rows[0][0] == pytest.approx(alloc.start, abs=1.0)
    assert fig.seconds[Bucket.RECOVERY] > 0, "the restart's gap is charged to recovery"

