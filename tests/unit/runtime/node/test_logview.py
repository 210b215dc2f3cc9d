"""The agent's follower of the run log: it backs off while the log is quiet."""

from __future__ import annotations

from pathlib import Path

from hpcrun.control.log import EntryKind, RunLog
from hpcrun.runtime.node.logview import FOLLOW_BASE_S, FOLLOW_CAP_S, LogView, next_follow_s
from hpcrun.storage import CountingStorage, LocalStorage
from hpcrun.testing.fakes import FakeClock


def test_the_wait_doubles_while_quiet_up_to_the_cap_and_drops_back_on_a_change() -> None:
    waits, w = [], 0.0
    for _ in range(8):
        w = next_follow_s(w, changed=False)
        waits.append(w)
    assert waits == [0.4, 0.8, 1.6, 3.2, 6.4, 6.4, 6.4, 6.4]
    assert next_follow_s(6.4, changed=True) == FOLLOW_BASE_S


def test_a_quiet_log_is_listed_once_per_cap_and_a_new_entry_is_seen_within_it(
        tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    writer = RunLog(tmp_path)
    fence = writer.claim("h")
    st, clock = CountingStorage(LocalStorage()), FakeClock()
    view = LogView(RunLog(tmp_path, storage=st), clock=clock)
    view.refresh()
    st.reset()
    for _ in range(int(120 / 0.2)):  # two minutes of agent ticks
        view.follow()
        clock.sleep(0.2)
    listings = st.counts["listdir"]
    assert 120 / FOLLOW_CAP_S - 1 <= listings <= 120 / FOLLOW_CAP_S + 5  # not 600
    assert st.total_meta_ops() == listings  # a quiet listing costs no stat, no open
    writer.append(EntryKind.NOTE, generation=fence.generation, holder="h", payload={})
    waited = 0.0
    while not view.follow():
        clock.sleep(0.2)
        waited += 0.2
    assert waited <= FOLLOW_CAP_S + 0.2
    assert [e.kind for e in view.entries] == [EntryKind.FENCE, EntryKind.NOTE]
