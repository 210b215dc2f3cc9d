"""Rank beats (node-local) → one heartbeat file per node on the shared tier."""

from __future__ import annotations

from pathlib import Path

from hpcrun.observe.heartbeat import (
    HeartbeatAggregator,
    RankHeartbeat,
    read_heartbeats,
    read_rank_beats,
    write_rank_heartbeat,
)
from hpcrun.storage import LOCAL_STORAGE, CountingStorage
from hpcrun.testing.fakes import FakeClock


def test_agent_publishes_one_file_per_node_with_every_ranks_beat(tmp_path: Path) -> None:
    run_dir, local = tmp_path / "run", tmp_path / "local" / "hb"
    for rank in (4, 5, 6, 7):
        write_rank_heartbeat(local, rank=rank, step=10 + rank, ts=100.0 + rank,
                             step_time_s=0.5, pid=1000 + rank)
    clock = FakeClock(start=200.0)
    agg = HeartbeatAggregator(run_dir, node="n1", hb_dir=local, generation=3, clock=clock)
    hb = agg.poll()
    assert hb is not None
    assert sorted((run_dir / "heartbeat").iterdir()) == [run_dir / "heartbeat" / "n1.json"]
    back = read_heartbeats(run_dir)["n1"]
    assert back == hb
    assert (back.ts, back.generation, back.min_step) == (200.0, 3, 14)
    assert back.ranks[7].pid == 1007 and back.ranks[7].step_time_s == 0.5


def test_aggregator_writes_at_a_bounded_rate(tmp_path: Path) -> None:
    local = tmp_path / "hb"
    write_rank_heartbeat(local, rank=0, step=1, ts=1.0, step_time_s=None, pid=1)
    clock = FakeClock()
    agg = HeartbeatAggregator(tmp_path / "run", node="n0", hb_dir=local, clock=clock,
                              min_interval_s=5.0)
    written = []
    for _ in range(20):  # 20 polls over 10 s
        written.append(agg.poll() is not None)
        clock.advance(0.5)
    assert sum(written) == 2


def test_the_file_is_replaced_every_5_s_while_a_rank_stalls_and_every_30_s_while_all_progress(
        tmp_path: Path) -> None:
    local, clock, st = tmp_path / "hb", FakeClock(), CountingStorage(LOCAL_STORAGE)
    agg = HeartbeatAggregator(tmp_path / "run", node="n0", hb_dir=local, clock=clock,
                              storage=st)

    def run(seconds: int, *, progress: bool) -> int:
        """Polls every 0.2 s for ``seconds``, rank 1 stepping every second when ``progress``
        (rank 0 always); how many times the node file was replaced."""
        before = st.counts["replace_bytes"]
        for tick in range(seconds * 5):
            if tick % 5 == 0:
                step = int(clock.monotonic())
                write_rank_heartbeat(local, rank=0, step=step, ts=clock.now(), step_time_s=1.0,
                                     pid=1)
                if progress or tick == 0:
                    write_rank_heartbeat(local, rank=1, step=step, ts=clock.now(),
                                         step_time_s=1.0, pid=2)
            agg.poll()
            clock.advance(0.2)
        return st.counts["replace_bytes"] - before

    assert run(60, progress=True) == 2  # the first, then every 30 s
    assert run(60, progress=False) == 12  # rank 1 stalled: every collection, 5 s apart


def test_rank_heartbeat_is_rate_limited(tmp_path: Path) -> None:
    clock = FakeClock()
    hb = RankHeartbeat(tmp_path, rank=2, pid=42, clock=clock, min_interval_s=1.0)
    wrote = [hb.beat(step) for step in range(10)]
    clock.advance(1.0)
    wrote.append(hb.beat(10, 0.1))
    assert wrote == [True] + [False] * 9 + [True]
    assert read_rank_beats(tmp_path)[2].step == 10


def test_malformed_heartbeat_files_are_skipped(tmp_path: Path) -> None:
    hb_dir = tmp_path / "heartbeat"
    hb_dir.mkdir()
    (hb_dir / "bad.json").write_text("{")
    (hb_dir / "old.json").write_text('{"schema_version": 99, "node": "x", "ts": 1, "ranks": []}')
    (hb_dir / "ok.json").write_text(
        '{"schema_version": 1, "node": "ok", "ts": 1.0, "generation": 1, "ranks": '
        '[{"rank": 0, "step": 3, "ts": 1.0, "pid": 9}, {"rank": "x"}]}')
    beats = read_heartbeats(tmp_path)
    assert list(beats) == ["ok"]
    assert list(beats["ok"].ranks) == [0]


def test_the_ticker_rewrites_a_blocked_ranks_sequence_number_only_when_it_moved(
        tmp_path: Path) -> None:
    """A rank blocked in a collective after its last step: its beat keeps the step and the
    time of its last progress, and gains the collective it entered, written once."""
    clock, seq = FakeClock(start=1000.0), [40]
    hb = RankHeartbeat(tmp_path, rank=2, pid=7, clock=clock, min_interval_s=0.5,
                       seq=lambda: seq[0])
    assert not hb.tick(quiet_s=1.0)  # no step yet: nothing to rewrite
    assert hb.beat(15, 0.2)
    assert read_rank_beats(tmp_path)[2].seq == 40
    seq[0] = 41  # entered the next all-reduce
    assert not hb.tick(quiet_s=1.0)  # a step just ended: the main thread is not blocked
    clock.advance(1.5)
    assert hb.tick(quiet_s=1.0)
    beat = read_rank_beats(tmp_path)[2]
    assert (beat.step, beat.ts, beat.seq) == (15, 1000.0, 41)
    clock.advance(5)
    assert not hb.tick(quiet_s=1.0)  # unchanged: no write
    assert hb.ticks_written == 1


def test_a_torn_down_group_reads_as_no_sequence_number(tmp_path: Path) -> None:
    def gone() -> int:
        raise RuntimeError("process group destroyed")

    RankHeartbeat(tmp_path, rank=0, pid=1, seq=gone).beat(3)
    assert read_rank_beats(tmp_path)[0].seq is None
