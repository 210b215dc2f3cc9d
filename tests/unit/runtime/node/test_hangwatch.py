"""A detected hang waits for the gang's sequence numbers to settle, then names the culprit."""

from __future__ import annotations

from pathlib import Path

from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.hangwatch import EVIDENCE_WAIT_S, hang_culprit


def _inc(tmp_path: Path) -> Incarnation:
    return Incarnation(run_dir=tmp_path, run_id="r", generation=2, holder="h", fence_slot=1,
                       job_id="j", restart_count=0, attempt=0, node="a",
                       node_local_root=None, gang=("a", "b"))


def _publish(run_dir: Path, node: str, *, ts: float, seq: int) -> None:
    beat = RankBeat(rank=1, step=15, ts=100.0, step_time_s=0.1, pid=9, seq=seq)
    hb = NodeHeartbeat(node=node, ts=ts, ranks={1: beat}, generation=2)
    (run_dir / "heartbeat").mkdir(exist_ok=True)
    (run_dir / "heartbeat" / f"{node}.json").write_text(hb.to_json())


def test_the_hang_waits_for_the_other_node_then_names_its_rank(tmp_path: Path) -> None:
    inc = _inc(tmp_path)
    mine = {0: RankBeat(rank=0, step=15, ts=100.0, step_time_s=0.1, pid=8, seq=31)}
    # b published before its rank's number could settle: wait
    _publish(tmp_path, "b", ts=101.0, seq=30)
    assert hang_culprit(inc, "a", mine, now=106.0, started=50.0, waited_s=0.0) == (None, False)
    # ... but not forever: past the wait, what settled is all there is
    assert hang_culprit(inc, "a", mine, now=106.0, started=50.0,
                        waited_s=EVIDENCE_WAIT_S) == (None, True)
    _publish(tmp_path, "b", ts=106.0, seq=30)
    culprit, ready = hang_culprit(inc, "a", mine, now=106.0, started=50.0, waited_s=1.0)
    assert ready and culprit is not None
    assert (culprit.ranks, culprit.nodes) == ((1,), ("b",))


def test_a_gang_all_at_one_number_names_nobody(tmp_path: Path) -> None:
    inc = _inc(tmp_path)
    mine = {0: RankBeat(rank=0, step=15, ts=100.0, step_time_s=0.1, pid=8, seq=30)}
    _publish(tmp_path, "b", ts=110.0, seq=30)
    assert hang_culprit(inc, "a", mine, now=110.0, started=50.0, waited_s=0.0) == (None, True)
