"""The fault matrix and drill planning (pure)."""

from __future__ import annotations

import pytest

from hpcrun.drill.matrix import MATRIX, DrillFault, injection, row_for
from hpcrun.drill.runner import drillable, plan_drill
from hpcrun.errors import SpecError
from hpcrun.runtime.faults import parse_injections

SPEC = {"resources": {"nodes": 2, "tasks_per_node": 2}, "checkpoint": {"every_steps": 10},
        "config": {"steps": 40}}


def test_every_fault_has_one_row_and_every_schedule_parses() -> None:
    assert sorted(r.fault for r in MATRIX) == sorted(DrillFault)
    for row in MATRIX:
        parse_injections(injection(row, at=7, world_size=4, tasks_per_node=2))


def test_unknown_fault_lists_the_choices() -> None:
    with pytest.raises(SpecError, match="rank-kill"):
        row_for("meteor")


def test_node_loss_spares_the_supervising_node_and_needs_two_nodes() -> None:
    row = row_for("node-loss")
    assert injection(row, at=5, world_size=4, tasks_per_node=2) == "nodecrash@step=5,rank=3"
    with pytest.raises(SpecError, match="at least 2 nodes"):
        injection(row, at=5, world_size=2, tasks_per_node=2)


def test_plan_turns_the_ledger_on_and_times_faults_between_checkpoints() -> None:
    plan = plan_drill(SPEC, row_for("rank-kill"), at=None)
    assert plan.spec["config"] == {"steps": 40, "ledger": True}
    assert plan.inject == "crash@step=15,rank=3" and plan.victim_rank == 3
    ckpt = plan_drill(SPEC, row_for("kill-before-manifest"), at=None)
    assert ckpt.inject == "ckptcrash@step=11,rank=0,stage=before_manifest"
    assert ckpt.victim_rank == 0
    assert plan_drill(SPEC, row_for("hang"), at=4).env == {"HPCRUN_HANG_S": "6.0"}


def test_outside_faults_and_backend_applicability() -> None:
    assert plan_drill(SPEC, row_for("node-loss"), at=5, backend="slurm").inject == ""
    assert plan_drill(SPEC, row_for("node-loss"), at=5, backend="local").inject
    assert drillable(row_for("preempt-timelimit"), "local").startswith("needs slurm")
    assert drillable(row_for("cancel-during-checkpoint"), "local") == ""
    # the cancel comes from outside; the run slows from the fault step on so it finds it going
    assert plan_drill(SPEC, row_for("cancel-during-checkpoint"), at=5).inject == \
        "slow@step=5,rank=0,seconds=0.5,every=1"
    assert drillable(row_for("rank-kill"), "local") == ""


def test_node_loss_with_a_spare_adds_one_spare_crashes_from_outside_and_expects_no_requeue(
        ) -> None:
    row = row_for("node-loss-spare")
    plan = plan_drill(SPEC, row, at=5, backend="slurm")
    assert plan.spec["resources"] == {"nodes": 2, "tasks_per_node": 2, "spare_nodes": 1}
    assert plan.inject == "" and drillable(row, "slurm") == ""
    assert row.recovery == "restart" and row.expect_cause == "node_failure"
    assert drillable(row, "local").startswith("needs slurm"), "local has no node to lose"


def test_losing_the_supervising_node_adds_a_spare_and_crashes_node_rank_0_from_outside(
        ) -> None:
    row = row_for("node-loss-supervisor")
    plan = plan_drill(SPEC, row, at=5, backend="slurm")
    assert plan.spec["resources"] == {"nodes": 2, "tasks_per_node": 2, "spare_nodes": 1}
    assert plan.inject == "" and drillable(row, "slurm") == ""
    assert plan.victim_rank == 0, "node rank 0 holds ranks 0..k-1"
    assert row.recovery == "restart" and row.expect_cause == "node_failure"
    assert drillable(row, "local").startswith("needs slurm")


def test_node_loss_shrink_makes_the_gang_elastic_without_spares_and_expects_no_requeue(
        ) -> None:
    row = row_for("node-loss-shrink")
    plan = plan_drill({**SPEC, "resources": {"nodes": 3, "tasks_per_node": 2,
                                             "spare_nodes": 1}}, row, at=5, backend="slurm")
    assert plan.spec["resources"]["spare_nodes"] == 0
    assert plan.spec["membership"] == {"mode": "elastic", "min_nodes": 2}
    assert plan.inject == "" and drillable(row, "slurm") == ""
    assert row.recovery == "restart" and row.expect_cause == "node_failure"
    assert drillable(row, "local").startswith("needs slurm"), "local has no node to lose"


def test_the_sdc_row_flips_a_bit_in_the_last_rank_and_expects_a_requeue() -> None:
    row = row_for("sdc")
    assert row.fault is DrillFault.SDC and row.expect_cause == "sdc"
    assert injection(row, at=17, world_size=4, tasks_per_node=2) == "sdc@step=17,rank=3"
    plan = plan_drill({"resources": {"nodes": 2, "tasks_per_node": 1},
                       "checkpoint": {"every_steps": 10}}, row, at=None)
    # checks every 5 steps; the flip lands after the check that made step 10 known-good
    assert plan.spec["sdc"] == {"every_steps": 5} and plan.inject == "sdc@step=17,rank=1"


def test_node_loss_partner_adds_a_spare_and_crashes_from_outside_on_slurm_only() -> None:
    row = row_for("node-loss-partner")
    plan = plan_drill(SPEC, row, at=5, backend="slurm")
    assert plan.spec["resources"] == {"nodes": 2, "tasks_per_node": 2, "spare_nodes": 1}
    assert plan.inject == "" and drillable(row, "slurm") == ""
    assert row.recovery == "restart" and row.expect_cause == "node_failure"
    assert drillable(row, "local").startswith("needs slurm")


def test_the_shared_fs_stall_row_stalls_every_rank_with_a_spare_and_expects_no_recovery(
        ) -> None:
    row = row_for("shared-fs-stall")
    plan = plan_drill(SPEC, row, at=15, backend="local")
    assert plan.inject == "fsstall@step=15,seconds=10"
    assert plan.spec["resources"]["spare_nodes"] == 1, "a hot spare: liveness is watched"
    assert row.recovery == "none" and row.expect_cause is None
    assert drillable(row, "local") == "" and drillable(row, "slurm") == ""
    (stall,) = parse_injections(plan.inject)
    from hpcrun.runtime.faults import due

    assert [i.kind for r in range(4) for i in due((stall,), rank=r, step=15)] == \
        ["fsstall"] * 4, "every rank of the gang stalls, whatever rank= says"
    assert due((stall,), rank=0, step=15, restart=1) == [], "not again after a requeue"
