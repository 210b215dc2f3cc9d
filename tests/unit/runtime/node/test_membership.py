"""Hot-spare membership: which nodes run the gang, how a spare takes a lost node's place, and
how the supervisor tells a vanished agent from a live one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcrun.runtime.node.membership import (
    NODE_STALE_S,
    LivenessBeat,
    LivenessWatch,
    MembershipError,
    initial_gang,
    read_liveness,
    swap_in,
    usable_spares,
)
from hpcrun.testing import FakeClock

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


def test_a_node_whose_beat_stops_changing_goes_stale_on_the_supervisors_clock() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2", "node3"), clock=clock)
    for beat in range(1, 8):
        watch.observe({"node2": 5.0, "node3": float(beat)})  # node2 froze at beat 5
        clock.advance(1.0)
    assert watch.stale() == ("node2",)
    assert NODE_STALE_S < 7


def test_a_node_that_never_beat_is_stale_after_the_threshold_not_before() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2",), clock=clock)
    clock.advance(NODE_STALE_S - 0.5)
    assert watch.stale() == ()
    clock.advance(1.0)
    assert watch.stale() == ("node2",)


def test_an_agent_beats_from_a_thread_and_the_supervisor_reads_the_counter(
        tmp_path: Path) -> None:
    with LivenessBeat(tmp_path, "node2", every_s=0.01):
        deadline = time.monotonic() + 5
        first = None
        while time.monotonic() < deadline:
            seen = read_liveness(tmp_path, ("node2", "node9"))
            if first is None and seen:
                first = seen["node2"]
            if first is not None and seen.get("node2", first) > first:
                break
            time.sleep(0.01)
    assert first is not None and read_liveness(tmp_path, ("node2",))["node2"] > first
    assert "node9" not in read_liveness(tmp_path, ("node2", "node9"))
