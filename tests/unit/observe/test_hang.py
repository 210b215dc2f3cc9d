"""Hang detection (pure), learned thresholds, and stack capture on real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcrun.observe.hang import (
    DUMP_SIGNAL,
    HangReason,
    capture_stacks,
    detect_hangs,
    learned_threshold,
    never_stepped,
    respond_to_hang,
)
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat


def _node(node: str, ts: float, beats: dict[int, tuple[int, float]]) -> NodeHeartbeat:
    return NodeHeartbeat(node=node, ts=ts, ranks={
        r: RankBeat(rank=r, step=s, ts=t, step_time_s=1.0, pid=100 + r)
        for r, (s, t) in beats.items()})


def test_rank_without_progress_for_longer_than_threshold_is_a_hang() -> None:
    hbs = {"n0": _node("n0", 1000.0, {0: (50, 995.0), 1: (42, 700.0)}),
           "n1": _node("n1", 998.0, {2: (50, 990.0)})}
    (hang,) = detect_hangs(hbs, 1000.0, threshold_s=120.0)
    assert (hang.node, hang.rank, hang.step, hang.stalled_s, hang.pid) == ("n0", 1, 42, 300.0,
                                                                           101)
    assert hang.reason == HangReason.NO_PROGRESS
    assert detect_hangs(hbs, 1000.0, threshold_s=300.0) == []  # exactly T is not yet a hang


def test_a_silent_node_is_reported_once_not_per_rank() -> None:
    hbs = {"n0": _node("n0", 500.0, {0: (7, 500.0), 1: (8, 500.0)})}
    (hang,) = detect_hangs(hbs, 1000.0, threshold_s=60.0)
    assert (hang.rank, hang.step, hang.reason) == (-1, 7, HangReason.NODE_SILENT)


def test_learned_threshold_is_factor_times_p99_with_a_floor() -> None:
    times = [1.0] * 99 + [50.0]  # p99 of 100 samples is the 99th smallest: 1.0
    assert learned_threshold(times, floor_s=10.0, factor=5.0) == 10.0
    assert learned_threshold([4.0] * 100, floor_s=10.0, factor=5.0) == 20.0
    assert learned_threshold([], floor_s=30.0, factor=5.0) == 30.0
    with pytest.raises(ValueError):
        learned_threshold([1.0], floor_s=0.0, factor=5.0)


_HUNG_RANK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hpcrun.observe.hang import install_stack_dump
    install_stack_dump(Path(sys.argv[1]))
    def stuck_in_collective():
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    stuck_in_collective()
""")


def _spawn(stack_file: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HUNG_RANK, str(stack_file)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_capture_then_kill_then_record_on_real_processes(tmp_path: Path) -> None:
    procs = [_spawn(tmp_path / f"stacks-rank-{r:05d}.txt") for r in range(2)]
    order: list[str] = []
    hangs = detect_hangs({"n0": _node("n0", 1000.0, {0: (5, 100.0), 1: (5, 990.0)})}, 1000.0,
                         threshold_s=60.0)

    def kill() -> None:
        order.append("kill")
        for p in procs:
            p.kill()
            p.wait(5)

    faults: list[dict[str, object]] = []
    signalled = respond_to_hang(hangs, pids=[p.pid for p in procs], kill_gang=kill,
                                record_fault=lambda f: (order.append("fault"), faults.append(f)),
                                threshold_s=60.0, wait_s=0.5)
    assert signalled == [p.pid for p in procs]
    assert order == ["kill", "fault"]
    for r in range(2):
        text = (tmp_path / f"stacks-rank-{r:05d}.txt").read_text()
        assert "stuck_in_collective" in text  # the stack was captured before the kill
    assert faults == [{"fault": "hang", "node": "n0", "rank": 0, "step": 5,
                       "signature": "hang:no_progress:n0:0",
                       "detail": "no progress for 900 s (threshold 60 s, no_progress); no "
                                 "evidence named the rank that did not arrive"}]
    assert all(p.returncode is not None for p in procs)


def test_no_hang_means_no_action() -> None:
    acted: list[str] = []
    assert respond_to_hang([], pids=[1], kill_gang=lambda: acted.append("kill"),
                           record_fault=lambda f: acted.append("fault"), threshold_s=1.0) == []
    assert acted == []


def test_gone_pids_are_skipped_and_the_dump_signal_is_not_a_preemption_signal() -> None:
    import signal

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    time.sleep(0.05)
    assert capture_stacks([p.pid], wait_s=0.0) == []
    assert DUMP_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def test_a_rank_that_never_finishes_a_step_is_caught_after_the_start_grace() -> None:
    assert never_stepped("n1", [0, 1], [0], started=100.0, now=700.0, grace_s=600) == []
    (hang,) = never_stepped("n1", [0, 1], [0], started=100.0, now=701.0, grace_s=600)
    assert (hang.rank, hang.step, hang.reason) == (1, -1, HangReason.NEVER_STEPPED)
    assert hang.stalled_s == 601.0 and "never_stepped" in hang.signature
    assert never_stepped("n1", [0, 1], [0, 1], started=100.0, now=9e9, grace_s=600) == []


def test_a_named_culprit_makes_one_fault_against_its_node_not_one_per_stalled_rank() -> None:
    from hpcrun.observe.culprit import Culprit, Evidence
    from hpcrun.observe.hang import Hang

    hangs = [Hang(node=n, rank=r, step=15, stalled_s=6.0, reason=HangReason.NO_PROGRESS)
             for n, r in (("a", 0), ("b", 1))]
    culprit = Culprit(ranks=(1,), nodes=("b",), seq=30, ahead=31, evidence=Evidence.SEQUENCE)
    faults: list[dict[str, object]] = []
    respond_to_hang(hangs, pids=[], kill_gang=lambda: None, record_fault=faults.append,
                    threshold_s=5, wait_s=0, culprit=culprit)
    assert len(faults) == 1
    f = faults[0]
    assert (f["node"], f["rank"], f["step"], f["culprit_ranks"], f["culprit_nodes"]) == (
        "b", 1, 15, [1], ["b"])
    assert f["signature"] == "hang:culprit:b:1"
    assert "rank 1 on b did not arrive: collective #30 issued, others reached #31" in str(
        f["detail"])
