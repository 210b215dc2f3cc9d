"""Per-rank JSONL events: fields, spans, non-blocking drops, torn lines."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcrun.observe.events import (
    EventWriter,
    event_path,
    list_event_files,
    read_events,
    sorted_events,
)
from hpcrun.testing.fakes import FakeClock


def _writer(run_dir: Path, rank: int = 3, node: str = "n1", **kw: object) -> EventWriter:
    return EventWriter(event_path(run_dir, node=node, rank=rank), run_id="r1", generation=2,
                       rank=rank, node=node, dataset_id="ds-abc", versions={"hpcrun": "0.1.0"},
                       **kw)  # type: ignore[arg-type]


def test_every_event_carries_run_generation_step_dataset_node_rank_versions(tmp_path: Path
                                                                             ) -> None:
    with _writer(tmp_path) as w:
        w.emit("step", 7, dur_s=0.5, tokens=128, loss=2.0, input_wait_s=0.1)
    path = tmp_path / "events" / "n1" / "rank-00003.jsonl"
    (e,) = list(read_events(tmp_path))
    assert path.is_file()
    assert (e.kind, e.run_id, e.generation, e.step, e.dataset_id, e.node, e.rank) == (
        "step", "r1", 2, 7, "ds-abc", "n1", 3)
    assert e.versions == {"hpcrun": "0.1.0"}
    assert e.data == {"dur_s": 0.5, "tokens": 128, "loss": 2.0, "input_wait_s": 0.1}


def test_span_records_start_and_duration_from_the_clock(tmp_path: Path) -> None:
    clock = FakeClock(start=1000.0)
    with _writer(tmp_path, clock=clock) as w, w.span("ckpt_stage", 5, ckpt_id="c5"):
        clock.advance(2.5)
    (e,) = list(read_events(tmp_path))
    assert e.kind == "ckpt_stage"
    assert e.data == {"start_ts": 1000.0, "dur_s": 2.5, "ckpt_id": "c5"}
    assert e.ts == 1002.5


def test_ten_thousand_events_arrive_in_order_without_drops(tmp_path: Path) -> None:
    with _writer(tmp_path, max_queue=20000) as w:
        for i in range(10000):
            w.emit("step", i, dur_s=0.01)
    assert w.dropped == 0
    assert [e.step for e in read_events(tmp_path)] == list(range(10000))


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the writer cannot create its directory: nothing drains the queue
    w = EventWriter(blocker / "rank-00000.jsonl", run_id="r1", generation=1, rank=0, node="n0",
                    max_queue=5)
    t0 = time.perf_counter()
    for i in range(1000):
        w.emit("step", i)
    took = time.perf_counter() - t0
    w.close(timeout=1.0)
    assert w.dropped >= 995
    assert took < 0.5  # never stalled on the full queue
    assert isinstance(w.error, OSError)


def test_a_payload_that_is_not_json_is_dropped_not_fatal(tmp_path: Path) -> None:
    with _writer(tmp_path) as w:
        w.emit("note", 1, obj=object())
        w.emit("note", 2, ok=True)
    assert [e.step for e in read_events(tmp_path)] == [2]
    assert w.dropped == 1


def test_readers_skip_a_torn_last_line_and_garbage(tmp_path: Path) -> None:
    with _writer(tmp_path) as w:
        w.emit("step", 1)
        w.emit("step", 2)
    path = event_path(tmp_path, node="n1", rank=3)
    good = path.read_text().splitlines()
    torn = good[1][: len(good[1]) // 2]
    path.write_text("\n".join([good[0], "{not json", json.dumps({"schema_version": 1}),
                               good[1], torn]))
    assert [e.step for e in read_events(tmp_path)] == [1, 2]


def test_rank_filter_and_agent_files(tmp_path: Path) -> None:
    for rank, node in ((0, "n0"), (1, "n0"), (2, "n1"), (-1, "n0")):
        with _writer(tmp_path, rank=rank, node=node) as w:
            w.emit("hb", 10 + rank)
    files = list_event_files(tmp_path)
    assert [(f.node, f.rank) for f in files] == [("n0", -1), ("n0", 0), ("n0", 1), ("n1", 2)]
    assert files[0].path.name == "agent.jsonl"
    assert sorted(e.rank for e in read_events(tmp_path, ranks=[2, -1])) == [-1, 2]
    assert len(sorted_events(tmp_path)) == 4


def test_emit_after_close_is_counted_not_raised(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.close()
    w.emit("step", 1)
    assert w.dropped == 1
