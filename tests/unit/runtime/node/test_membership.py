"""Hot-spare liveness: how the supervisor tells a vanished agent from a live one."""

from __future__ import annotations

import time
from pathlib import Path

from hpcrun.runtime.node.membership import (
    NODE_STALE_S,
    LivenessBeat,
    LivenessWatch,
    read_liveness,
)
from hpcrun.testing import FakeClock


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
