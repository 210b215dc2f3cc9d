"""``ckpt verify``'s plan (pure): what is read back, and what is reported without failing."""

from __future__ import annotations

from hpcrun.checkpoint.audit import AuditVerdict, ReadBack, TierVerdict, plan_audit
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier


def _ckpt(step: int, *tiers: Tier) -> CommittedCheckpoint:
    return CommittedCheckpoint(ckpt_id=f"g000001-s{step:010d}-x", step=step, generation=1,
                               manifest="", digest="", bytes=10, nodes=("n1", "n2"), slot=step,
                               committed_at=float(step), tiers=frozenset(tiers))


BOTH = (Tier.NODE_LOCAL, Tier.SHARED)
RUN = [_ckpt(10, *BOTH), _ckpt(20, Tier.NODE_LOCAL), _ckpt(30, Tier.NODE_LOCAL),
       _ckpt(40, *BOTH), _ckpt(50, Tier.NODE_LOCAL), _ckpt(60, *BOTH)]
IDS = [c.ckpt_id for c in RUN]


def _by_id(planned: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for p in planned:
        out.setdefault(p.ckpt_id if isinstance(p, TierVerdict) else p.ckpt.ckpt_id, []).append(p)
    return out


def test_from_the_login_node_only_damage_fails() -> None:
    """Retention removed 10-30 from the shared tier; tier 0 is out of reach."""
    plan = _by_id(plan_audit(RUN, shared_present=IDS[3:], local_present=None))
    assert [p.verdict for i in IDS[:3] for p in plan[i]] == [AuditVerdict.RETIRED] * 3
    [unreachable] = plan[IDS[4]]
    assert unreachable.verdict == AuditVerdict.UNREACHABLE
    assert unreachable.detail == "node-local only, not verifiable from the login node"
    assert [type(p) for p in plan[IDS[3]]] == [ReadBack]  # shared copy; tier 0 not reachable
    assert [(p.tier, p.node) for p in plan[IDS[5]]] == [(Tier.SHARED, "")]


def test_a_kept_checkpoint_missing_from_the_shared_tier_fails() -> None:
    plan = _by_id(plan_audit(RUN, shared_present=IDS[:5], local_present=None))
    [missing] = plan[IDS[5]]
    assert missing.verdict == AuditVerdict.FAILED and "retention keeps it" in missing.detail
    plan = _by_id(plan_audit(RUN, shared_present=IDS[:4] + IDS[5:], local_present=None))
    [manifest] = plan[IDS[4]]  # node-local only, and its manifest is gone
    assert manifest.verdict == AuditVerdict.FAILED and "manifest.json is missing" in manifest.detail


def test_reachable_tier_zero_is_read_and_a_gone_copy_is_not_damage() -> None:
    local = {"n1": set(IDS[3:]), "n2": {IDS[5]}}
    plan = _by_id(plan_audit(RUN, shared_present=IDS, local_present=local))
    assert [(p.tier, p.node) for p in plan[IDS[5]]] == [
        (Tier.SHARED, ""), (Tier.NODE_LOCAL, "n1"), (Tier.NODE_LOCAL, "n2")]
    assert all(isinstance(p, ReadBack) for p in plan[IDS[5]])
    n2 = {p.node: p for p in plan[IDS[4]]}["n2"]
    assert n2.verdict == AuditVerdict.GONE and "purged at job end" in n2.detail
    retired = {p.node: p for p in plan[IDS[1]]}["n1"]  # 20: tier 1 holds a newer one
    assert retired.verdict == AuditVerdict.RETIRED
    assert not any(p.verdict == AuditVerdict.FAILED for ps in plan.values() for p in ps
                   if isinstance(p, TierVerdict))
