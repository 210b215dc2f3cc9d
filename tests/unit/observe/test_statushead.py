"""The default status of a large gang from the run summary's head: the full view's figures and
named ranks, without parsing every rank's row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.errors import ArgumentError
from hpcrun.observe.collect import collect_status, rank_tails
from hpcrun.observe.events import event_path, list_event_files, node_stream_path, sorted_events
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat, read_heartbeats
from hpcrun.observe.runsummary import (
    RunSummary,
    StreamFold,
    SummaryHead,
    heartbeat_record,
    run_summary_path,
)
from hpcrun.observe.status import StatusView, render_text, status_json
from hpcrun.observe.statushead import (
    StatusHead,
    current_heartbeats,
    head_findings,
    rank_findings,
    status_head,
)
from hpcrun.protocols import Event

NOW = 1100.0
NODES, K = 8, 4
SLOW, HUNG, FAILED = 9, 21, 3
"""A straggler at 2 s a step, a rank stuck after step 10, a rank with a recorded crash that
printed nothing."""
OPTIONS: dict[str, Any] = {"hang_threshold_s": 60.0}
"""The hung rank's beat is 80 s old at NOW, every other one 40 s."""


def _node(rank: int) -> str:
    return f"n{rank // K}"


def _gang_run(root: Path) -> Path:
    """A RUNNING run of 8 nodes x 4 ranks in the per-rank layout: record, events, node
    heartbeats, rank output; rank FAILED's crash is recorded."""
    from hpcrun.control.log import EntryKind, RunLog
    from hpcrun.control.record import create_run
    from hpcrun.control.spec import CheckpointPolicy, RunSpec
    from hpcrun.testing.fakes import FakeClock

    clock = FakeClock(start=1000.0)
    run_dir = create_run(root, RunSpec(name="gang", entrypoint="examples.demo:main",
                                       checkpoint=CheckpointPolicy(rpo_s=600.0)),
                         run_id="gang-1", clock=clock)
    log = RunLog(run_dir, clock=clock)
    fence = log.claim("h1")
    pub = {"generation": fence.generation, "holder": "h1"}
    log.publish(EntryKind.STATE, payload={"state": "STARTING"}, **pub)
    log.publish(EntryKind.STATE, payload={"state": "RUNNING"}, **pub)
    log.publish(EntryKind.PROGRESS, payload={"step": 30, "tokens": 64 * NODES * K * 30}, **pub)
    log.append(EntryKind.FAULT, payload={"fault": "process_crash", "node": _node(FAILED),
                                         "rank": FAILED, "step": 7, "signature": "crash:oom",
                                         "detail": "exited 137"}, **pub)
    for rank in range(NODES * K):
        _write_rank(run_dir, rank, generation=fence.generation)
    for n in range(NODES):
        beats = {r: RankBeat(rank=r, step=10 if r == HUNG else 30,
                             ts=1020.0 if r == HUNG else 1060.0, step_time_s=1.0, pid=100 + r)
                 for r in range(n * K, (n + 1) * K)}
        hb = NodeHeartbeat(node=f"n{n}", ts=1060.0, generation=fence.generation, ranks=beats)
        (run_dir / "heartbeat").mkdir(exist_ok=True)
        (run_dir / "heartbeat" / f"n{n}.json").write_text(hb.to_json())
    return run_dir


def _write_rank(run_dir: Path, rank: int, *, generation: int) -> None:
    lines, t = [], 1000.0
    for s in range(1, (10 if rank == HUNG else 30) + 1):
        dur = 2.0 if rank == SLOW else 1.0
        lines.append(Event(kind="step", ts=t + dur, run_id="gang-1", generation=generation,
                           step=s, rank=rank, node=_node(rank),
                           data={"start_ts": t, "dur_s": dur, "tokens": 64,
                                 "input_wait_s": 0.1}).to_json() + "\n")
        t += 2.0
    path = event_path(run_dir, node=_node(rank), rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    out = run_dir / "logs" / _node(rank) / f"rank-{rank:05d}.out"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("" if rank == FAILED else f"rank {rank} step 30 loss 1.30\n")


def _publish_from_streams(run_dir: Path) -> None:
    """Rewrite the run as node streams with heartbeat records, as the agents write it, and
    publish the summary as the node-0 agent does; the summary is then all status reads."""
    beats, tails = read_heartbeats(run_dir), rank_tails(run_dir)
    by_node: dict[str, list[Event]] = {}
    for e in sorted_events(run_dir):
        by_node.setdefault(e.node, []).append(e)
    for ef in list_event_files(run_dir):
        ef.path.unlink()
    for node, evs in by_node.items():
        shutil.rmtree(run_dir / "events" / node)
        lines = [e.to_json() + "\n" for e in evs]
        lines.append(heartbeat_record(beats[node], {t.rank: t.line for t in tails
                                                    if t.node == node}))
        node_stream_path(run_dir, node).write_text("".join(lines))
    fold = StreamFold(run_dir)
    fold.refresh(fold.files())
    summary = fold.snapshot(run_id="gang-1", generation=1, now=NOW - 5.0, final=False)
    run_summary_path(run_dir).write_bytes(summary.to_bytes())
    fold.close()
    shutil.rmtree(run_dir / "heartbeat")
    shutil.rmtree(run_dir / "logs")


@pytest.fixture(scope="module")
def gang(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StatusView]:
    """The published run, and its view folded from every event file, heartbeat and output."""
    run = _gang_run(tmp_path_factory.mktemp("gang"))
    from_events = collect_status(run, now=NOW, use_run_summary=False, **OPTIONS).view
    _publish_from_streams(run)
    return run, from_events


def _without_tails(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("tails", "tails_complete")}


def test_the_default_view_names_the_ranks_and_shows_the_figures_of_the_full_view(
        gang: tuple[Path, StatusView]) -> None:
    run, from_events = gang
    full = collect_status(run, now=NOW, **OPTIONS).view
    lazy = collect_status(run, now=NOW, every_rank=False, **OPTIONS).view
    assert full.tails_complete and not lazy.tails_complete  # the head was read
    assert status_json(full) == status_json(from_events)
    assert lazy.named_ranks == full.named_ranks == (FAILED, SLOW, HUNG)
    assert [i.split(":")[0] for i in lazy.incidents] == ["hang", "straggler", "fault"]
    assert lazy.incidents == full.incidents and lazy.nodes == full.nodes
    assert _without_tails(status_json(lazy)) == _without_tails(status_json(full))
    assert lazy.tails == tuple(t for t in full.tails if t.rank in full.named_ranks)
    assert lazy.rank_lines == len(full.tails) == NODES * K
    text = render_text(lazy)
    assert text == render_text(full) == render_text(from_events)
    assert "gang        8 nodes, 32 ranks; slowest node at step 10, fastest at 30" in text
    assert f"rank     {FAILED} n0           | (no output) last step 30" in text
    with pytest.raises(ArgumentError, match="every_rank=True"):
        render_text(lazy, all_ranks=True)
    assert render_text(full, all_ranks=True).count("\nrank ") == NODES * K


def test_thresholds_past_the_head_read_every_rank(gang: tuple[Path, StatusView]) -> None:
    run, _ = gang
    # every beat is older than 10 s: the head lists them all, and they decide
    hung = collect_status(run, now=NOW, every_rank=False, hang_threshold_s=10.0).view
    assert not hung.tails_complete
    assert sum(i.startswith("hang:") for i in hung.incidents) == NODES  # every node silent
    summary = RunSummary.from_bytes(run_summary_path(run).read_bytes())
    assert summary is not None
    narrow = _narrow_head(summary, edge=2)
    path = run_summary_path(run)
    original = path.read_bytes()
    try:
        path.write_bytes(narrow)
        view = collect_status(run, now=NOW, every_rank=False, hang_threshold_s=10.0,
                              straggler_threshold=1.01).view
        assert view.tails_complete  # past both horizons: every rank was read
        assert render_text(view) == render_text(collect_status(
            run, now=NOW, hang_threshold_s=10.0, straggler_threshold=1.01).view)
    finally:
        path.write_bytes(original)


def _narrow_head(summary: RunSummary, *, edge: int) -> bytes:
    """The summary's bytes with a head that lists only ``edge`` beats and scores."""
    g = summary.generation
    head = status_head(current_heartbeats(summary.heartbeats, g), summary.events.last_steps(g),
                       summary.events.rank_step_times(g), generation=g,
                       rank_lines=len(summary.tails), edge=edge)
    first, rest = summary.to_bytes().split(b"\n", 1)
    raw = json.loads(first)
    raw["status"] = head.to_json()
    return json.dumps(raw, separators=(",", ":")).encode() + b"\n" + rest


def test_a_summary_of_schema_1_still_reads(gang: tuple[Path, StatusView]) -> None:
    run, _ = gang
    path = run_summary_path(run)
    original = path.read_bytes()
    summary = RunSummary.from_bytes(original)
    assert summary is not None
    try:
        path.write_bytes(_schema_1(summary))
        assert RunSummary.from_bytes(path.read_bytes()) == summary
        assert SummaryHead.from_bytes(path.read_bytes()) is None  # no head: every rank read
        old = collect_status(run, now=NOW, every_rank=False, **OPTIONS).view
        assert old.tails_complete
        path.write_bytes(original)
        assert render_text(old) == render_text(
            collect_status(run, now=NOW, every_rank=False, **OPTIONS).view)
    finally:
        path.write_bytes(original)


def _schema_1(s: RunSummary) -> bytes:
    """The summary as writers of schema 1 wrote it: one document."""
    body = {"schema_version": 1, "run_id": s.run_id, "generation": s.generation, "ts": s.ts,
            "final": s.final, "window": s.window, "events": s.events.to_json(),
            "heartbeats": [json.loads(heartbeat_record(hb, {}))
                           for _, hb in sorted(s.heartbeats.items())],
            "tails": [[r, n, line] for r, (n, line) in sorted(s.tails.items())],
            "streams": {k: list(v) for k, v in sorted(s.streams.items())}}
    return json.dumps(body, separators=(",", ":")).encode()


def _corruptions(data: bytes) -> list[bytes]:
    head, nodes, ranks = data.split(b"\n", 2)
    raw = json.loads(head)
    bad_types = dict(raw, status=dict(raw["status"], rank_lines=-1))
    bad_beat = dict(raw, status=dict(raw["status"], beats=[["n5", 21, 10, "x", 121]]))
    bad_score = dict(raw, status=dict(raw["status"], scores=[[9, "n2", -2.0]]))
    lines = ranks.split(b"\n")
    lines[len(lines) // 2] = b'[17,{"a":1},[1],"x"]'
    return [data[:n] for n in (0, 10, len(head) + 5, len(head) + len(nodes) + 30,
                               len(data) - 7)] + [
        json.dumps(x).encode() + b"\n" + nodes + b"\n" + ranks
        for x in (bad_types, bad_beat, bad_score, [1, 2], {"schema_version": 2})] + [
        b"\n".join([head, nodes, *lines]), data.replace(b"[", b"{"), b"\xff" * 40]


def test_a_malformed_summary_is_read_around_never_a_crash(
        gang: tuple[Path, StatusView]) -> None:
    run, _ = gang
    path = run_summary_path(run)
    original = path.read_bytes()
    try:
        for bad in _corruptions(original):
            path.write_bytes(bad)
            for every_rank in (False, True):
                view = collect_status(run, now=NOW, every_rank=every_rank, **OPTIONS).view
                assert view.facts.run_id == "gang-1"
                render_text(view)
    finally:
        path.write_bytes(original)


def test_rank_rows_find_every_rank_by_bisection(gang: tuple[Path, StatusView]) -> None:
    run, _ = gang
    head = SummaryHead.from_bytes(run_summary_path(run).read_bytes())
    assert head is not None
    rows = head.rank_rows([*range(NODES * K), 99, -1])
    assert [r.rank for r in rows] == list(range(NODES * K))
    assert rows[FAILED].tail == (_node(FAILED), "") and rows[HUNG].last == (10, _node(HUNG))
    assert rows[SLOW].tail == (_node(SLOW), f"rank {SLOW} step 30 loss 1.30")


# -- the head decides as every rank does, or says it cannot (pure) ----------------------------

_gangs = st.integers(min_value=1, max_value=5).flatmap(lambda nodes: st.tuples(
    st.just(nodes), st.lists(st.tuples(st.integers(0, 100), st.integers(0, 40),
                                       st.one_of(st.none(), st.integers(1, 40)),
                                       st.booleans()),
                             min_size=nodes * 3, max_size=nodes * 3),
    st.lists(st.integers(60, 120), min_size=nodes, max_size=nodes)))


@settings(max_examples=300, deadline=None)
@given(gang=_gangs, now=st.integers(100, 200), hang=st.integers(1, 150),
       threshold=st.sampled_from([1.05, 1.2, 1.5, 2.0, 3.0]), edge=st.integers(0, 16),
       active=st.booleans(), generation=st.sampled_from([1, 2]))
def test_the_head_finds_what_every_rank_shows_or_defers(
        gang: tuple[int, list[tuple[int, int, int | None, bool]], list[int]], now: int,
        hang: int, threshold: float, edge: int, active: bool, generation: int) -> None:
    nodes, ranks, node_ts = gang
    beats: dict[str, dict[int, RankBeat]] = {}
    last: dict[int, tuple[int, str]] = {}
    times: dict[int, list[float]] = {}
    rank_nodes: dict[int, str] = {}
    for r, (ts, step, median, stepped) in enumerate(ranks):
        node = f"n{r % nodes}"
        beats.setdefault(node, {})[r] = RankBeat(rank=r, step=step, ts=float(ts),
                                                 step_time_s=None, pid=r)
        if stepped:
            last[r] = (step + 3, node)
        if median is not None:
            times[r], rank_nodes[r] = [median / 10.0], node
    heartbeats = {n: NodeHeartbeat(node=n, ts=float(node_ts[i]), generation=1, ranks=beats[n])
                  for i, n in enumerate(sorted(beats))}
    shown = current_heartbeats(heartbeats, generation)
    head = status_head(shown, last, (times, rank_nodes), generation=generation,
                       rank_lines=len(ranks), edge=edge)
    read = StatusHead.from_json(json.loads(json.dumps(head.to_json())))
    options: dict[str, Any] = dict(active=active, now=float(now), hang_threshold_s=float(hang),
                                   straggler_threshold=threshold)
    want = rank_findings(shown, last, (times, rank_nodes), generation=generation, window=1,
                         **options)
    got = head_findings(read, **options)
    assert got is None or got == want
    if edge >= len(ranks):
        assert got == want  # nothing left out: the head always decides


def test_the_summary_is_a_head_a_nodes_line_and_one_line_per_rank() -> None:
    from hpcrun.observe.summary import EventSummary

    hb = NodeHeartbeat(node="n0", ts=50.0, generation=2, ranks={
        r: RankBeat(rank=r, step=7, ts=49.0, step_time_s=1.0, pid=10 + r) for r in (0, 1)})
    events = EventSummary(step_times={(2, 1): [1.5]}, rank_nodes={(2, 1): "n0"},
                          rank_last={(2, 0): [7, "n0"], (2, 1): [6, "n0"]})
    summary = RunSummary(run_id="r", generation=2, ts=51.0, final=False, events=events,
                         heartbeats={"n0": hb}, tails={1: ("n0", 'loss "1.0"\n')})
    head, nodes, *ranks = summary.to_bytes().split(b"\n")
    assert ranks == [b'[0,null,[7,"n0"],null]',
                     b'[1,["n0","loss \\"1.0\\"\\n"],[6,"n0"],["n0",1.5]]', b""]
    assert json.loads(head)["schema_version"] == 2 and json.loads(head)["status"] == {
        "head_schema_version": 1, "generation": 2, "nodes": [["n0", 50.0, 7, 2, 7]],
        "live": True, "beats": [["n0", 0, 7, 49.0, 10], ["n0", 1, 7, 49.0, 11]],
        "beat_horizon": None, "scores": [[1, "n0", 1.0]], "score_horizon": None,
        "slowest": [1], "reported_step": 6, "rank_lines": 1}
    assert set(json.loads(nodes)) == {"heartbeats", "streams"}
    assert RunSummary.from_bytes(summary.to_bytes()) == summary
