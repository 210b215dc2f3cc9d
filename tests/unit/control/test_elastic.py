"""Elastic membership: which runs survive a node loss, the gang sizes, and the global batch kept
at every size (refused at submit, naming the sizes, when it cannot be)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrun.control.elastic import (
    gang_node_counts,
    initial_gang,
    keepable_global_batch,
    requeue_resize,
    sbatch_nodes,
    shrink_gang,
    survives_node_loss,
    swap_in,
    unkept_world_sizes,
    usable_spares,
)
from hpcrun.control.spec import RunSpec
from hpcrun.data.batches import replica_rows
from hpcrun.errors import DataError, MembershipError, SpecError
from hpcrun.runtime.node import membership
from hpcrun.vocab import Backend

BASE = {"name": "tiny", "entrypoint": "examples.tiny_lm.train:main"}


def spec(nodes: int = 3, tasks: int = 2, min_nodes: int | None = 2, spares: int = 0,
         global_batch: int | None = None) -> RunSpec:
    raw: dict[str, Any] = {**BASE, "resources": {"nodes": nodes, "tasks_per_node": tasks,
                                                 "spare_nodes": spares}}
    if min_nodes is not None:
        raw["membership"] = {"mode": "elastic", "min_nodes": min_nodes}
    if global_batch is not None:
        raw["data"] = {"global_batch": global_batch}
    return RunSpec.from_dict(raw)


def test_one_predicate_says_whether_a_run_survives_a_node_loss() -> None:
    assert survives_node_loss(spec(min_nodes=None, spares=1))
    assert survives_node_loss(spec(min_nodes=2))
    assert not survives_node_loss(spec(min_nodes=None))
    assert membership.survives_node_loss is survives_node_loss, "the runtime's name for it"


def test_every_multi_node_gang_on_slurm_watches_liveness_for_the_salvage() -> None:
    """Without a spare a lost node still ends the gang, but the survivors must learn of it
    before Slurm ends the job, to drain its partner copy first."""
    plain = spec(nodes=2, min_nodes=None)
    assert membership.watches_liveness(plain, Backend.SLURM)
    assert not membership.watches_liveness(plain, Backend.LOCAL)  # nothing ends the others
    assert not membership.watches_liveness(spec(nodes=1, min_nodes=None), Backend.SLURM)
    assert membership.watches_liveness(spec(nodes=2, min_nodes=None, spares=1), Backend.LOCAL)


def test_a_shrunk_gang_keeps_the_survivors_in_order_with_dense_node_ranks() -> None:
    assert shrink_gang(("n0", "n1", "n2", "n3"), ("n1",)) == ("n0", "n2", "n3")
    assert shrink_gang(("n0", "n1", "n2"), ("n2", "n0")) == ("n1",)


def test_a_requeued_elastic_job_asks_for_a_range_and_a_first_job_for_its_nodes() -> None:
    assert sbatch_nodes(spec(min_nodes=2), requeue=True) == "2-3"
    assert sbatch_nodes(spec(min_nodes=2)) == "3"
    assert sbatch_nodes(spec(min_nodes=2, spares=1), requeue=True) == "2-4"
    assert sbatch_nodes(spec(min_nodes=3), requeue=True) == "3"
    assert sbatch_nodes(spec(min_nodes=None, spares=1), requeue=True) == "4"


def test_a_requeued_elastic_job_is_resized_to_its_range_with_a_task_per_node() -> None:
    assert requeue_resize(spec(min_nodes=2)) == {"NumNodes": "2-3", "NumTasks": "2"}
    assert requeue_resize(spec(min_nodes=3)) == {}
    assert requeue_resize(spec(min_nodes=None, spares=1)) == {}


def test_global_batch_arithmetic_per_rank_rows_at_each_size() -> None:
    assert list(gang_node_counts(2, 4)) == [2, 3, 4]
    # 24 rows over 3x2, 2x2 ranks: each rank takes 4, then 6, rows of the same global batch
    assert (len(replica_rows(24, 0, 6)), len(replica_rows(24, 0, 4))) == (4, 6)
    assert unkept_world_sizes(24, 2, gang_node_counts(2, 3)) == ()
    assert unkept_world_sizes(8, 2, gang_node_counts(2, 3)) == ((3, 6),)
    assert unkept_world_sizes(None, 2, gang_node_counts(1, 3)) == ()
    assert keepable_global_batch(2, gang_node_counts(2, 3)) == 12
    with pytest.raises(DataError, match="must be divisible by the number of replicas 6"):
        replica_rows(8, 0, 6)


@given(tasks=st.integers(1, 8), low=st.integers(1, 6), extra=st.integers(0, 4),
       factor=st.integers(1, 3))
def test_the_suggested_global_batch_is_kept_at_every_size(tasks: int, low: int, extra: int,
                                                          factor: int) -> None:
    counts = gang_node_counts(low, low + extra)
    batch = factor * keepable_global_batch(tasks, counts)
    assert unkept_world_sizes(batch, tasks, counts) == ()
    assert all(replica_rows(batch, n * tasks - 1, n * tasks).stop == batch for n in counts)


def test_a_global_batch_that_cannot_be_kept_is_one_error_naming_the_sizes() -> None:
    with pytest.raises(SpecError) as info:
        spec(nodes=3, tasks=2, min_nodes=2, global_batch=8)
    msg = str(info.value)
    assert msg.startswith("run.yaml: data.global_batch: expected a multiple of every world "
                          "size the elastic gang may take (4, 6: nodes 2..3 x 2 ranks)")
    assert "it does not split over 6 ranks on 3 nodes" in msg and "found 8" in msg
    assert "set data.global_batch to a multiple of 12, or raise membership.min_nodes" in msg


def test_a_keepable_global_batch_or_a_fixed_gang_is_accepted() -> None:
    assert spec(global_batch=12).data.global_batch == 12
    assert spec(min_nodes=None, global_batch=6).data.global_batch == 6  # 3 x 2 ranks
    assert spec(min_nodes=3, global_batch=6).membership.min_nodes == 3


def test_min_nodes_above_nodes_is_refused_at_submit() -> None:
    with pytest.raises(SpecError, match=r"membership.min_nodes: expected <= resources.nodes "
                                        r"\(3\), found 4; lower min_nodes"):
        spec(nodes=3, min_nodes=4)


ALLOCATION = ("node1", "node2", "node3", "node4")


def test_the_first_gang_is_the_first_usable_nodes_and_the_rest_are_spares() -> None:
    assert initial_gang(ALLOCATION, 2) == ("node1", "node2")
    assert initial_gang(ALLOCATION, 2, unusable={"node2"}) == ("node1", "node3")
    assert usable_spares(ALLOCATION, ("node1", "node3"), {"node2"}) == ("node4",)


def test_too_few_usable_nodes_for_the_gang_says_how_many_and_why() -> None:
    with pytest.raises(MembershipError, match=r"has 2 usable nodes \(node2, node4 quarantined\), "
                                              r"expected at least resources.nodes=3"):
        initial_gang(ALLOCATION, 3, unusable={"node2", "node4", "node9"})


def test_a_spare_takes_the_lost_nodes_place_so_every_rank_keeps_its_id() -> None:
    gang = ("node1", "node2", "node3")
    assert swap_in(gang, ("node2",), ("node4",)) == ("node1", "node4", "node3")
    with pytest.raises(MembershipError, match="2 lost node"):
        swap_in(gang, ("node2", "node3"), ("node4",))


def test_a_stale_or_quarantined_spare_is_not_usable() -> None:
    spares = usable_spares(ALLOCATION, ("node1", "node2"), unusable={"node3"}, stale={"node4"})
    assert spares == ()
