"""Hot-spare liveness: how the supervisor tells a vanished agent from a live one."""

from __future__ import annotations

import time
from pathlib import Path

from hpcrun.runtime.node.membership import (
    FILE_EVERY_S,
    FILE_STALE_S,
    NODE_STALE_S,
    LivenessBeat,
    LivenessWatch,
    read_liveness,
)
from hpcrun.testing import FakeClock


def test_a_node_whose_file_stops_changing_goes_stale_on_the_watchers_clock() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2", "node3"), clock=clock, file_stale_s=NODE_STALE_S)
    for beat in range(1, 8):
        watch.observe({"node2": 5.0, "node3": float(beat)})  # node2 froze at beat 5
        clock.advance(1.0)
    assert watch.stale() == ("node2",)
    assert NODE_STALE_S < 7


def test_a_node_that_never_beat_is_stale_after_the_file_bound_not_before() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2",), clock=clock)
    clock.advance(FILE_STALE_S - 0.5)
    assert watch.stale() == (), "never heard on the network: its file's slow cadence counts"
    clock.advance(1.0)
    assert watch.stale() == ("node2",)


def test_a_node_heard_on_the_network_is_alive_while_its_file_is_stuck() -> None:
    """A shared-filesystem stall freezes every liveness file; the beats still arrive."""
    clock = FakeClock()
    watch = LivenessWatch(("node2",), clock=clock)
    watch.observe({"node2": 1.0})
    for _ in range(40):  # 20 s of a file that never changes
        clock.advance(0.5)
        watch.observe_net({"node2": clock.monotonic()})
        watch.observe({"node2": 1.0})
        assert watch.stale() == ()


def test_a_node_whose_beats_stop_is_stale_within_the_old_bound_whatever_its_file() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2", "node3"), clock=clock)
    watch.observe({"node2": 1.0, "node3": 1.0})  # both files written just now
    watch.observe_net({"node2": clock.monotonic(), "node3": clock.monotonic()})
    clock.advance(NODE_STALE_S - 0.1)
    watch.observe_net({"node3": clock.monotonic()})
    assert watch.stale() == ()
    clock.advance(0.2)
    assert watch.stale() == ("node2",), "the network bound, not the file's slow one"


def test_the_watch_uses_when_a_beat_was_heard_not_when_it_looked() -> None:
    """The watcher blocked (a slow shared tier) for 10 s: beats heard meanwhile still count,
    and a node silent through the whole block is lost at once."""
    clock = FakeClock()
    watch = LivenessWatch(("node2", "node3"), clock=clock)
    start = clock.monotonic()
    watch.observe_net({"node2": start, "node3": start})
    clock.advance(10.0)
    watch.observe_net({"node2": clock.monotonic() - 0.4, "node3": start})
    assert watch.stale() == ("node3",)


def test_either_source_changing_keeps_a_node_alive() -> None:
    clock = FakeClock()
    watch = LivenessWatch(("node2",), clock=clock)
    watch.observe_net({"node2": clock.monotonic()})
    for beat in range(2, 10):  # datagrams lost; the file goes on every FILE_EVERY_S/2
        clock.advance(FILE_EVERY_S / 2)
        watch.observe({"node2": float(beat)})
        assert watch.stale(FILE_EVERY_S) == ()
    clock.advance(FILE_EVERY_S + 0.1)
    assert watch.stale(FILE_EVERY_S) == ("node2",)


def test_the_first_file_read_after_the_network_went_quiet_is_a_baseline_not_news() -> None:
    """A node heard on the network until it died: its file, unread while it was heard, shows a
    change at the first read, from before the death; that read must not keep it alive."""
    clock = FakeClock()
    watch = LivenessWatch(("node2",), clock=clock)
    for _ in range(10):
        watch.observe_net({"node2": clock.monotonic()})
        clock.advance(0.5)
    clock.advance(NODE_STALE_S)  # died; the watcher now reads its file
    assert watch.unheard(NODE_STALE_S) == ("node2",)
    watch.observe({"node2": 7.0})
    assert watch.stale() == ("node2",)
    clock.advance(FILE_EVERY_S)  # the file changes again: the node lives after all
    watch.observe({"node2": 8.0})
    assert watch.stale() == ()


def test_an_agent_beats_from_a_thread_and_the_supervisor_reads_the_counter(
        tmp_path: Path) -> None:
    with LivenessBeat(tmp_path, "node2", every_s=0.01, file_every_s=0.01):
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
