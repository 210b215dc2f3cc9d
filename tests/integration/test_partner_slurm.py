"""Node loss with a hot spare on the real Slurm testbed, restored from the partner copy: the
spare's ranks read the lost node's tier-0 shards from the node that held them (the peer tier),
newer than anything on tier 1, also when tier 1 is unreadable (``docs/recovery.md``, node-loss
row). Run with ``-s`` to see the RTO split and the bytes read from peers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.checkpoint.peer.ledger import fold_partner_copies
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.drill.contracts import check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import row_for
from hpcrun.drill.partner import hide_tier1, partner_ready
from hpcrun.drill.rto import rto_splits
from hpcrun.testbed import Testbed
from hpcrun.vocab import Tier
from tests.integration.helpers import (
    RunFactory,
    TestbedRun,
    crash_noted,
    first_after,
    paced,
    slurm_spec,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 200
EVERY = 10


def _crash_after_a_partner_copy(testbed: Testbed, runs: RunFactory, tmp_path: Path, *,
                                hide: bool) -> tuple[TestbedRun, str, str, str]:
    """Submit 2 nodes x 2 ranks + 1 spare; once tier 1 holds a checkpoint, hold tier-1 drains
    back (the shared tier is slower than the partner copy, as at scale) until the last gang
    node's shards are held by its partner newer than tier 1; (hide tier 1,) crash that node;
    let tier 1 go on once the new gang restored; wait for the end."""
    hold = tmp_path / "tier1-held"
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=2, steps=STEPS, every_steps=EVERY,
                      resources={"spare_nodes": 1}, config={"ledger": True})
    run = runs.submit(spec, inject=f"{paced(0.1, 4)};storage@mode=fail,while={hold}")
    run.wait_for("a gang and a checkpoint on tier 1", lambda: (rec := run.record()).membership
                 and any(c.tier == "shared" for c in rec.checkpoints), timeout=180)
    gang = run.record().membership
    victim = gang[-1]
    try:
        hold.touch()
        held = run.wait_for(f"{victim}'s shards held by its partner, newer than tier 1",
                            lambda: partner_ready(run.run_dir, victim), timeout=120)
        if hide:
            assert hide_tier1(run.run_dir), "some checkpoint was on tier 1 to hide"
            # the lost node's shards of every checkpoint up to the partner's copy: nowhere on
            # tier 1 any more (drains are held back, so none comes back before the crash)
            assert not (run.run_dir / "ckpt" / held / victim).exists()
        try:
            generation = run.record().generation
            crash_noted(testbed, run, victim, "node-loss-partner" if hide else "node-loss-spare")
            run.wait_for("the new gang's restore", lambda: len(
                [e for e in run.rank_events("restored") if e["generation"] > generation]) == 4,
                timeout=120)
        finally:
            hold.unlink()
        run.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(victim)
    return run, victim, gang[0], held


def _check_partner_restore(run: TestbedRun, victim: str, partner: str, held: str,
                           fault: str) -> None:
    rec = run.record()
    assert rec.job_ids == (run.job_id,) and rec.requeues == 0, rec
    assert rec.step == STEPS and rec.quarantined == (victim,)
    spare = next(n for n in rec.membership if n not in (partner,))
    swapped = first_after(run.states(), "RECOVERING")
    restarted = first_after(run.states(), "STARTING", swapped.slot)
    before = [e for e in run.valid() if e.slot < restarted.slot]
    # the newest checkpoint the partner held of the lost node's shards, at least as new as
    # the one seen before the crash, newer than anything on tier 1 when the node was lost
    copies = fold_partner_copies(before)
    committed = {c.ckpt_id: c for c in fold_checkpoints(before)}
    newest_held = max((c.ckpt_id for c in copies.values() if c.owner == victim and c.complete
                       and c.held_by == partner), key=lambda ck: committed[ck].step)
    assert committed[held].step <= committed[newest_held].step
    at_crash = fold_checkpoints([e for e in run.valid() if e.slot < swapped.slot])
    tier1 = max((c.step for c in at_crash if Tier.SHARED in c.tiers), default=-1)
    assert committed[newest_held].step > tier1
    # every rank of the new gang restored that checkpoint, the spare's ranks reading the lost
    # node's shards from the partner (nothing of them was on the spare's disk or on tier 1)
    restored = [e for e in run.rank_events("restored")
                if e["generation"] == restarted.generation]
    assert {e["rank"] for e in restored} == {0, 1, 2, 3}, (
        [(e["generation"], e["rank"], e["data"]) for e in run.rank_events("restored")],
        [(st, e.generation, e.payload.get("reason")) for st, e in run.states()],
        [(e.kind, e.generation, {k: e.payload.get(k) for k in ("fault", "event", "detail",
                                                               "skipped", "restored")})
         for e in run.valid() if e.kind == "fault" or e.payload.get("event") in (
             "restore_fell_back",)])
    assert {e["data"]["ckpt_id"] for e in restored} == {newest_held}
    on_spare = [e for e in restored if e["node"] == spare]
    assert len(on_spare) == 2 and all(e["data"]["tier"] == "peer" and e["data"]["peer_bytes"] > 0
                                      for e in on_spare), on_spare
    tiers = {e["data"]["tier"] for e in restored}
    if Tier.SHARED not in committed[newest_held].tiers:
        # nothing of it on tier 1: each node read its own and its held shards from its disk,
        # the other nodes' pieces of replicated tensors from them (the peer tier)
        assert tiers <= {"node_local", "peer"}, tiers
    # the drill contracts: exact samples, fencing, no torn checkpoint, a restart not a requeue
    ev = collect(run.run_dir, victim_rank=3)
    broken = not_held(check_contracts(ev, row_for(fault)), row_for(fault))
    assert not broken, broken
    splits = [s for s in rto_splits(ev.entries, ev.events) if s.cause == "node_failure"]
    assert len(splits) == 1 and splits[0].restored_step == committed[newest_held].step
    peer = sum(e["data"]["peer_bytes"] for e in on_spare)
    print(f"\n{fault}: {victim} crashed, {spare}'s ranks read {peer} B of {newest_held} from "
          f"peers ({partner} held the lost shards), restored from {sorted(tiers)}; RTO "
          f"{splits[0].total_s:.1f} s: " + ", ".join(
              f"{k} {v:.1f} s" for k, v in splits[0].phases.items()))


def test_node_crash_with_a_spare_restores_the_lost_shards_from_the_partner(
        testbed: Testbed, runs: RunFactory, tmp_path: Path) -> None:
    run, victim, partner, held = _crash_after_a_partner_copy(testbed, runs, tmp_path,
                                                             hide=False)
    _check_partner_restore(run, victim, partner, held, "node-loss-spare")


def test_partner_restore_succeeds_with_tier1_unreadable(
        testbed: Testbed, runs: RunFactory, tmp_path: Path) -> None:
    run, victim, partner, held = _crash_after_a_partner_copy(testbed, runs, tmp_path,
                                                             hide=True)
    _check_partner_restore(run, victim, partner, held, "node-loss-partner")
