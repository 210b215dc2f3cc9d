"""The drainer reads step periods from the rank heartbeats its agent already collects."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.observe.heartbeat import RankBeat, write_rank_heartbeat
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.drainpace import HeartbeatPeriods, drain_heartbeat_dir, step_periods


def _beat(rank: int, step: int, ts: float) -> RankBeat:
    return RankBeat(rank=rank, step=step, ts=ts, step_time_s=None, pid=1)


def test_periods_average_every_step_between_two_reports() -> None:
    periods, marks = step_periods({}, {0: _beat(0, 10, 100.0)})
    assert periods == [] and marks == {0: (10, 100.0)}
    periods, marks = step_periods(marks, {0: _beat(0, 60, 101.0), 1: _beat(1, 5, 100.5)})
    assert periods == [pytest.approx(0.02)] and marks[1] == (5, 100.5)
    periods, marks = step_periods(marks, {0: _beat(0, 60, 101.0)})  # no progress: no period
    assert periods == []
    periods, marks = step_periods(marks, {0: _beat(0, 20, 102.0)})  # restored to an older step
    assert periods == [] and marks[0] == (20, 102.0)


def test_heartbeat_periods_read_the_ranks_files(tmp_path: Path) -> None:
    write_rank_heartbeat(tmp_path, rank=0, step=1, ts=10.0, step_time_s=None, pid=1)
    periods = HeartbeatPeriods(tmp_path)
    write_rank_heartbeat(tmp_path, rank=0, step=11, ts=10.5, step_time_s=None, pid=1)
    assert periods() == [pytest.approx(0.05)]


def test_the_drainer_looks_where_the_ranks_write(tmp_path: Path) -> None:
    inc = Incarnation(run_dir=tmp_path / "run-7", run_id="run-7", generation=1, holder="h",
                      fence_slot=0, job_id="1", restart_count=0, attempt=0, node="n3",
                      node_local_root=tmp_path / "nvme")
    assert drain_heartbeat_dir(tmp_path / "nvme", "run-7", "n3") == inc.heartbeat_dir()
