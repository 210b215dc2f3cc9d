"""The run summary: status reads one small file and shows what every event shows."""

from __future__ import annotations

import shutil
from pathlib import Path

from hypothesis import given, settings

from hpcrun.observe.collect import collect_status
from hpcrun.observe.ettr import ettr_from_parts
from hpcrun.observe.events import (
    list_event_files,
    node_stream_path,
    read_event_file,
    read_events,
    sorted_events,
)
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat, read_heartbeats
from hpcrun.observe.runsummary import (
    RunSummary,
    StreamFold,
    compact_spans,
    heartbeat_record,
    parse_heartbeat_record,
    read_run_summary,
    run_summary_path,
)
from hpcrun.observe.status import status_json
from hpcrun.observe.summary import summarize_events
from hpcrun.protocols import Event
from tests.unit.observe.builders import make_run
from tests.unit.observe.test_summary import events

NOW = 1100.0


def _to_streams(run_dir: Path, beats: dict[str, NodeHeartbeat] | None = None) -> None:
    """Rewrite a run's per-rank event files as one stream per node, with heartbeat records."""
    beats = beats if beats is not None else read_heartbeats(run_dir)
    by_node: dict[str, list[Event]] = {}
    for e in sorted_events(run_dir):
        by_node.setdefault(e.node, []).append(e)
    for ef in list_event_files(run_dir):
        ef.path.unlink()
    for node, evs in by_node.items():
        shutil.rmtree(run_dir / "events" / node)
        tails = {r: f"rank {r} step 30 loss 1.30" for r in sorted({e.rank for e in evs})}
        half = len(evs) // 2  # heartbeat records interleave with the events
        lines = [e.to_json() + "\n" for e in evs[:half]]
        lines.append(heartbeat_record(beats[node], tails))
        lines += [e.to_json() + "\n" for e in evs[half:]]
        node_stream_path(run_dir, node).write_text("".join(lines))


def _publish(run_dir: Path, *, generation: int = 1, final: bool = True) -> RunSummary:
    fold = StreamFold(run_dir)
    fold.refresh(fold.files())
    summary = fold.snapshot(run_id="demo-1", generation=generation, now=NOW, final=final)
    run_summary_path(run_dir).write_bytes(summary.to_bytes())
    fold.close()
    return summary


def _status(run_dir: Path, **kw: object) -> dict[str, object]:
    return status_json(collect_status(run_dir, now=NOW, **kw).view)  # type: ignore[arg-type]


def test_status_from_the_summary_equals_status_from_every_rank_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, terminal=True)
    before = _status(run)  # today's layout: a file per rank
    _to_streams(run)
    _publish(run)
    shutil.rmtree(run / "heartbeat")  # the summary carries the heartbeats and the tails
    after = _status(run)
    assert after["figures"] == before["figures"] and after["ettr"] == before["ettr"]
    assert after["nodes"] == before["nodes"] and after["incidents"] == before["incidents"]
    assert after["input_wait_ratio"] == before["input_wait_ratio"]
    assert {t["rank"] for t in after["tails"]} == {0, 1, 2, 3}  # type: ignore[union-attr]


def test_a_straggler_rank_is_still_named_from_the_node_streams(tmp_path: Path) -> None:
    run = make_run(tmp_path, slow_rank=3)  # rank 3 on n1 takes 2 s a step, the others 1 s
    _to_streams(run)
    summary = _publish(run)
    assert summary.events.rank_step_times(1)[0][3] == [2.0]  # its median over the window
    incidents = _status(run)["incidents"]
    assert "straggler: node n1 rank 3 score 2.00" in incidents  # type: ignore[operator]
    assert incidents == _status(run, use_run_summary=False)["incidents"]


def test_a_hung_rank_is_still_named_from_the_node_streams(tmp_path: Path) -> None:
    run = make_run(tmp_path, slow_rank=None)  # RUNNING; n1's agent alive, rank 3 stuck
    beat = {r: RankBeat(rank=r, step=30, ts=NOW - 5, step_time_s=1.0, pid=100 + r)
            for r in range(4)}
    beat[3] = RankBeat(rank=3, step=12, ts=NOW - 1000, step_time_s=1.0, pid=103)
    beats = {n: NodeHeartbeat(node=n, ts=NOW - 2, generation=1,
                              ranks={r: beat[r] for r in ranks})
             for n, ranks in (("n0", (0, 1)), ("n1", (2, 3)))}
    _to_streams(run, beats)
    _publish(run, final=False)
    shutil.rmtree(run / "heartbeat")
    incidents = _status(run)["incidents"]
    assert [i for i in incidents if i.startswith("hang:")] == [  # type: ignore[union-attr]
        "hang: node n1 rank 3 no progress for 1000 s at step 12"]


def test_event_readers_skip_heartbeat_records_and_keep_rank_ids(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    evs = sorted_events(run)
    _to_streams(run)
    assert [p.name for p in (run / "events").iterdir() if p.is_file()] != []
    assert sorted_events(run) == evs
    assert {e.rank for e in read_events(run, ranks=[3])} == {3}
    stream = node_stream_path(run, "n1")
    assert {e.rank for e in read_event_file(stream)} == {2, 3}


def test_a_finished_run_without_a_final_summary_is_folded_from_the_streams(
        tmp_path: Path) -> None:
    run = make_run(tmp_path, terminal=True)
    _to_streams(run)
    want = _status(run, use_run_summary=False)
    _publish(run, final=False)
    # a summary of a newer time but not final (node 0 died before its last write) is not
    # trusted for a finished run: status folds the streams
    (run / "events" / "n0.jsonl").open("a").write(
        Event(kind="step", ts=1061.0, run_id="demo-1", generation=1, step=31, rank=0,
              node="n0", data={"dur_s": 1.0, "start_ts": 1060.0, "tokens": 64}).to_json()
        + "\n")
    got = _status(run)
    assert got["figures"] != want["figures"]  # the appended step is counted
    assert got == _status(run, use_run_summary=False)
    run_summary_path(run).write_text("{not json")
    assert read_run_summary(run) is None
    assert _status(run) == got


def test_the_fold_reads_only_whole_lines_and_continues_from_a_seed(tmp_path: Path) -> None:
    run = make_run(tmp_path, terminal=True)
    _to_streams(run)
    stream = node_stream_path(run, "n0")
    whole = stream.read_bytes()
    cut = whole.rfind(b"\n", 0, len(whole) // 2) + 10
    stream.write_bytes(whole[:cut])  # a torn last line, still being written
    fold = StreamFold(run)
    fold.refresh(fold.files())
    assert fold.streams["events/n0.jsonl"][1] < cut
    first = fold.snapshot(run_id="demo-1", generation=1, now=NOW, final=False)
    fold.close()
    stream.write_bytes(whole)
    seeded = StreamFold(run)
    seeded.seed(RunSummary.from_bytes(first.to_bytes()))  # type: ignore[arg-type]
    seeded.refresh(seeded.files())
    full = StreamFold(run)
    full.refresh(full.files())
    a = seeded.snapshot(run_id="demo-1", generation=2, now=NOW, final=True)
    b = full.snapshot(run_id="demo-1", generation=2, now=NOW, final=True)
    assert a.events.gang_steps() == b.events.gang_steps()
    assert a.events.allocations() == b.events.allocations()
    assert a.events.input_wait_fraction() == b.events.input_wait_fraction()
    assert a.heartbeats == b.heartbeats and a.streams == b.streams


def test_heartbeat_records_round_trip_and_malformed_ones_are_refused() -> None:
    hb = NodeHeartbeat(node="n1", ts=5.0, generation=2, ranks={
        3: RankBeat(rank=3, step=7, ts=4.0, step_time_s=None, pid=9)})
    line = heartbeat_record(hb, {3: "x" * 500})
    parsed = parse_heartbeat_record(line)
    assert parsed is not None and parsed[0] == hb and parsed[1] == {3: "x" * 200}
    assert parse_heartbeat_record(line.replace('"hb_schema_version":1', '"hb_schema_version":9')
                                  ) is None
    assert parse_heartbeat_record("{torn") is None


@settings(max_examples=80, deadline=None)
@given(events())
def test_merged_spans_charge_exactly_what_every_span_charges(evs: list[Event]) -> None:
    s = summarize_events(evs)
    compact = summarize_events(evs)
    compact.spans = compact_spans(compact.spans) if compact.spans else []
    want = ettr_from_parts(s.allocations(), s.gang_steps(), s.span_intervals())
    got = ettr_from_parts(compact.allocations(), compact.gang_steps(), compact.span_intervals())
    assert got.to_dict() == want.to_dict()
