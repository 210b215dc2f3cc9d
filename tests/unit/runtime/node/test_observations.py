"""Ranks write events node-locally; the agent forwards them into one stream per node, and the
node-0 agent keeps the run summary."""

from __future__ import annotations

import json
from pathlib import Path

from hpcrun.observe.events import EventWriter, read_event_file
from hpcrun.observe.heartbeat import write_rank_heartbeat
from hpcrun.observe.runsummary import is_heartbeat_record, read_run_summary
from hpcrun.protocols import Event
from hpcrun.runtime.incarnation import Incarnation, rank_events_path
from hpcrun.runtime.node.observations import NodeObserver, NodeStream
from hpcrun.testing.fakes import FakeClock


def _inc(tmp_path: Path, *, node: str = "n0", generation: int = 3) -> Incarnation:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True, exist_ok=True)
    return Incarnation(run_dir=run_dir, run_id="r1", generation=generation, holder="h",
                       fence_slot=1, job_id="7", restart_count=0, attempt=0, node=node,
                       node_local_root=tmp_path / "local")


def _write_steps(inc: Incarnation, rank: int, steps: range, clock: FakeClock) -> None:
    with EventWriter(rank_events_path(inc, rank), run_id=inc.run_id, generation=inc.generation,
                     rank=rank, node=inc.node, clock=clock) as w:
        for s in steps:
            w.emit("step", s, start_ts=clock.now() + s, dur_s=1.0, tokens=8, input_wait_s=0.0)


def test_rank_events_stay_node_local_until_the_agent_forwards_them(tmp_path: Path) -> None:
    inc = _inc(tmp_path)
    clock = FakeClock(start=1000.0)
    _write_steps(inc, 0, range(1, 4), clock)
    assert rank_events_path(inc, 0).is_relative_to(tmp_path / "local")
    assert not (inc.run_dir / "events").exists()  # nothing per rank on the shared tier
    stream = NodeStream(rank_events_path(inc, 0).parent, inc.run_dir / "events" / "n0.jsonl",
                        ranks=[0, 1])
    line = Event(kind="step", ts=1.0, run_id="r1", generation=3, step=1, rank=1, node="n0",
                 data={"dur_s": 1.0}).to_json() + "\n"
    torn = rank_events_path(inc, 1)
    torn.write_text(line[:20])  # rank 1 is mid-write
    stream.forward()
    got = list(read_event_file(stream.target))
    assert [(e.rank, e.step) for e in got] == [(0, 1), (0, 2), (0, 3)]
    with torn.open("a") as f:
        f.write(line[20:])  # rank 1 finishes its line: it is forwarded once, whole
    stream.forward()
    stream.forward()
    ranks = [(e.rank, e.step) for e in read_event_file(stream.target)]
    assert ranks == [(0, 1), (0, 2), (0, 3), (1, 1)]
    stream.close()


def test_the_node0_observer_keeps_a_final_run_summary(tmp_path: Path) -> None:
    inc = _inc(tmp_path)
    clock = FakeClock(start=1000.0)
    for rank in (0, 1):
        _write_steps(inc, rank, range(1, 25), clock)
        write_rank_heartbeat(inc.heartbeat_dir(), rank=rank, step=24, ts=1024.0,
                             step_time_s=1.0, pid=50 + rank)
        inc.logs_dir().mkdir(parents=True, exist_ok=True)
        (inc.logs_dir() / f"rank-{rank:05d}.out").write_text(f"hello\nrank {rank} done\n\n")
    obs = NodeObserver(inc.run_dir, inc=inc, ranks=[0, 1], nodes=["n0"], supervisor=True,
                       clock=clock)
    obs.poll(force=True)
    lines = (inc.run_dir / "events" / "n0.jsonl").read_text().splitlines()
    records = [json.loads(ln) for ln in lines if is_heartbeat_record(ln)]
    assert len(lines) == 48 + 1 and records[0]["tails"] == [[0, "rank 0 done"],
                                                            [1, "rank 1 done"]]
    obs.close()
    obs.finish()
    summary = read_run_summary(inc.run_dir)
    assert summary is not None and summary.final and summary.generation == 3
    assert summary.events.events == 48 and len(summary.events.gang_steps()) == 24
    assert summary.tails == {0: ("n0", "rank 0 done"), 1: ("n0", "rank 1 done")}
    assert summary.heartbeats["n0"].min_step == 24
    assert summary.events.last_steps(3) == {0: (24, "n0"), 1: (24, "n0")}


def test_a_later_incarnation_forwards_only_its_own_lines(tmp_path: Path) -> None:
    first, second = _inc(tmp_path, generation=3), _inc(tmp_path, generation=4)
    clock = FakeClock(start=1000.0)
    _write_steps(first, 0, range(1, 4), clock)
    NodeObserver(first.run_dir, inc=first, ranks=[0], nodes=["n0"], supervisor=False,
                 clock=clock).close()
    _write_steps(second, 0, range(4, 6), clock)
    NodeObserver(second.run_dir, inc=second, ranks=[0], nodes=["n0"], supervisor=False,
                 clock=clock).close()
    got = [(e.generation, e.step) for e in read_event_file(first.run_dir / "events" / "n0.jsonl")]
    assert got == [(3, 1), (3, 2), (3, 3), (4, 4), (4, 5)]
