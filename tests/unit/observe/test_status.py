"""``hpcrun status``: the pure view and reading a real run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrun.observe.collect import collect_status, run_bounded, tail_lines
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat
from hpcrun.observe.status import (
    CheckpointFact,
    FaultFact,
    RankTail,
    RecordFacts,
    build_status,
    render_text,
    status_json,
)
from tests.unit.observe.builders import make_run, step


def _facts(**kw: object) -> RecordFacts:
    base: dict[str, object] = dict(
        run_id="r1", state="RUNNING", generation=1, job_ids=("77",), step=4, tokens=400,
        checkpoints=(CheckpointFact(ckpt_id="c2", step=2, tier="node_local", ts=95.0),
                     CheckpointFact(ckpt_id="c2", step=2, tier="shared", ts=80.0)),
        faults=(FaultFact(fault="process_crash", node="n0", rank=1, step=1,
                          signature="crash:x", detail="exited 1"),),
        rpo_s=100.0)
    base.update(kw)
    return RecordFacts(**base)  # type: ignore[arg-type]


def test_view_from_constructed_values() -> None:
    events = [step(s, 10.0 * s, 10.0 * s + 10, tokens=50) for s in range(1, 5)]
    hb = {"n0": NodeHeartbeat(node="n0", ts=99.0, generation=1, ranks={
        0: RankBeat(rank=0, step=4, ts=50.0, step_time_s=10.0, pid=1)})}
    view = build_status(_facts(), events=events, heartbeats=hb, now=100.0, hang_threshold_s=30,
                        tails=[RankTail(rank=0, node="n0", line="loss 2.1")])
    assert view.step_rate == pytest.approx(0.1)
    assert view.token_rate == pytest.approx(5.0)
    assert view.checkpoint_age_s == {"node_local": 5.0, "shared": 20.0}
    assert view.rpo_exposure_s == 20.0  # the durable tier decides
    assert view.ettr == pytest.approx(1.0)
    assert view.incidents[0] == "hang: node n0 rank 0 no progress for 50 s at step 4"
    assert view.incidents[-1].startswith("fault: process_crash node n0 rank 1")
    text = render_text(view)
    for needle in ("RUNNING", "generation 1", "job 77", "step 4", "c2 step 2 on node_local+shared",
                   "RPO", "ETTR        100.0%", "rank     0 n0", "loss 2.1"):
        assert needle in text
    body = json.loads(json.dumps(status_json(view)))
    assert body["schema_version"] == 1 and body["facts"]["state"] == "RUNNING"
    assert body["state"] == "RUNNING"  # scripts read the state at the top level


def test_terminal_runs_report_no_hang_and_no_progress_alert() -> None:
    events = [step(1, 0.0, 1.0)]
    view = build_status(_facts(state="SUCCEEDED", faults=()), events=events,
                        heartbeats={"n0": NodeHeartbeat(node="n0", ts=0.0)}, tails=[],
                        now=1e6, hang_threshold_s=1.0)
    assert not any(i.startswith("hang") for i in view.incidents)
    assert not any("no_progress" in a for a in view.alerts)


def test_collect_reads_a_real_run_directory(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    got = collect_status(run_dir, now=1070.0, rpo_s=600.0)
    v = got.view
    assert (v.facts.state, v.facts.generation, v.facts.job_ids, v.facts.step) == (
        "RUNNING", 1, ("4242",), 30)
    assert v.checkpoint_age_s == {"node_local": 10.0, "shared": 10.0}  # committed at t=1060
    assert v.step_rate == pytest.approx(0.5)
    assert [t.line for t in v.tails] == ["rank 0 step 30 loss 1.30", "rank 1 step 30 loss 1.30",
                                         "rank 2 step 30 loss 1.30", "rank 3 step 30 loss 1.30"]
    assert "straggler: node n1 rank 3 score 2.00" in v.incidents
    assert set(v.nodes) == {"n0", "n1"}
    assert "position 2560" in render_text(v)


def test_tail_reads_only_the_end_of_a_long_file(tmp_path: Path) -> None:
    p = tmp_path / "out"
    p.write_text("".join(f"line {i}\n" for i in range(100000)))
    assert tail_lines(p, 3) == ["line 99997", "line 99998", "line 99999"]
    p.write_text("only\n\n")
    assert tail_lines(p, 5) == ["only"]


def test_reconcile_is_bounded_and_reported_separately() -> None:
    import threading

    gate = threading.Event()
    slow = run_bounded(lambda: gate.wait(5), timeout_s=0.05)
    gate.set()
    assert not slow.ok and "timed out" in slow.detail
    failed = run_bounded(lambda: 1 / 0, timeout_s=1.0)
    assert not failed.ok and "ZeroDivisionError" in failed.detail
    assert run_bounded(lambda: [], timeout_s=1.0).ok


def _envelope(batch: int) -> dict[str, object]:
    """A data cursor as the record keeps it (DataPipeline's envelope, committed at step 60)."""
    return {"step": 60, "cursor": {
        "kind": "hpcrun.data.cursor", "schema_version": 1, "algorithm_version": 1,
        "dataset_id": "ds-7df4ca3dfdf27f75434e88925f0c366b",
        "state": {"epochs": [0, 1], "layout": {"seed": 1}, "position": {
            "batch": batch, "pack": {"draw": 164, "offset": 27},
            "mixture": {"active": [True, True], "counts": [109, 55], "draw": 164}}}}}


def test_a_finished_run_shows_final_figures_and_no_placeholders() -> None:
    """A preempted-then-finished run: the fault has no node, rank or step; the heartbeats
    stopped at step 31 (rate-limited) while the events reach 60; the ranks printed nothing."""
    events = [step(s, float(s), s + 0.9, gen=1, rank=r, node=f"local{r}")
              for s in range(1, 31) for r in (0, 1)]
    events += [step(s, 100.0 + s, 100.9 + s, gen=2, rank=r, node=f"local{r}")
               for s in range(31, 61) for r in (0, 1)]
    hb = {f"local{r}": NodeHeartbeat(node=f"local{r}", ts=140.0, generation=2, ranks={
        r: RankBeat(rank=r, step=31, ts=140.0, step_time_s=0.9, pid=1)}) for r in (0, 1)}
    facts = _facts(state="SUCCEEDED", generation=2, step=60, tokens=12000,
                   cursor=_envelope(60), checkpoints=(
                       CheckpointFact(ckpt_id="c60", step=60, tier="shared", ts=161.0),),
                   faults=(FaultFact(fault="preemption", generation=1,
                                     detail="preemption or time-limit signal"),))
    view = build_status(facts, events=events, heartbeats=hb, now=170.0,
                        tails=[RankTail(rank=0, node="local0", line=""),
                               RankTail(rank=1, node="local1", line="  ")])
    text = render_text(view)
    assert "fault: preemption in generation 1: preemption or time-limit signal" in text
    for placeholder in ("node ?", "rank -1", "step -1", "{", "}", "'"):
        assert placeholder not in text, placeholder
    assert {n: d["step"] for n, d in view.nodes.items()} == {"local0": 60, "local1": 60}
    assert "heartbeat" not in text  # heartbeat ages say nothing about a finished run
    assert [t.line for t in view.tails] == ["(no output) last step 60"] * 2
    assert ("data        at step 60: next global batch 60; 164 documents drawn (109, 55 per "
            "source); epochs 0, 1; dataset ds-7df4ca3dfdf2") in text
    assert "rate" not in text.split("progress", 1)[1].splitlines()[0]  # no recent rate
    assert "exposure    none: the final step is committed" in text


def _big_gang_view(*, nodes: int = 8, k: int = 8) -> tuple[object, int, int]:
    """A gang of ``nodes`` x ``k`` ranks with a hung rank (heartbeat) and a slow one (events)."""
    hung, slow = 3 * k + 5, 2 * k + 1
    events = [step(s, 10.0 * s, 10.0 * s + (20.0 if r == slow else 10.0), rank=r,
                   node=f"n{r // k}")
              for s in range(1, 25) for r in range(nodes * k) if not (r == hung and s > 20)]
    hb = {f"n{n}": NodeHeartbeat(node=f"n{n}", ts=399.0, generation=1, ranks={
        r: RankBeat(rank=r, step=20 if r == hung else 24, ts=200.0 if r == hung else 390.0,
                    step_time_s=10.0, pid=r) for r in range(n * k, (n + 1) * k)})
        for n in range(nodes)}
    tails = [RankTail(rank=r, node=f"n{r // k}", line=f"[rank {r}] loss 2.1")
             for r in range(nodes * k)]
    view = build_status(_facts(faults=()), events=events, heartbeats=hb, tails=tails, now=400.0,
                        hang_threshold_s=100.0)
    return view, hung, slow


def test_a_large_gang_prints_its_summary_and_only_the_ranks_worth_naming() -> None:
    view, hung, slow = _big_gang_view()
    text = render_text(view)  # type: ignore[arg-type]
    rank_lines = [ln for ln in text.splitlines() if ln.startswith("rank ")]
    named = {int(ln.split()[1]) for ln in rank_lines}
    assert hung in named and slow in named  # the hang and the straggler, with their lines
    assert named == {hung, slow}  # every other rank is at the newest step: none is behind
    assert "gang        8 nodes, 64 ranks; slowest node at step 20, fastest at 24" in text
    assert f"ranks       {len(named)} of 64 shown" in text and "--ranks all" in text
    node_lines = [ln for ln in text.splitlines() if ln.startswith("node ")]
    assert {ln.split()[1] for ln in node_lines} == {f"n{r // 8}" for r in named}
    every = render_text(view, all_ranks=True)  # type: ignore[arg-type]
    assert sum(ln.startswith("rank ") for ln in every.splitlines()) == 64
    assert sum(ln.startswith("node ") for ln in every.splitlines()) == 8
    body = status_json(view)  # type: ignore[arg-type]
    assert len(body["tails"]) == 64 and len(body["nodes"]) == 8  # --json stays complete
    assert hung in body["named_ranks"] and slow in body["named_ranks"]
