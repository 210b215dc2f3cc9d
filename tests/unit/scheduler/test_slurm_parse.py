"""Slurm output parsers against outputs captured on the testbed, and the client's argv."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.errors import SchedulerError
from hpcrun.runner import CommandResult
from hpcrun.scheduler.slurm import (
    SlurmClient,
    SlurmJobState,
    node_is_down,
    parse_exit_code,
    parse_nodelist,
    parse_sacct,
    parse_sacct_runs,
    parse_sbatch_output,
    parse_scontrol_show_job,
    parse_settle_s,
    parse_sinfo_nodes,
    parse_squeue,
    parse_state,
)
from hpcrun.testing import FakeClock, FakeRunner

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def test_squeue_captured_mixed_states() -> None:
    by_id = {o.job_id: o for o in parse_squeue(golden("squeue_mixed.txt"))}
    assert by_id["1"].state == SlurmJobState.RUNNING and by_id["1"].nodes == ("node1", "node2")
    assert by_id["1"].comment == "hpcrun:submit-0123abcd" and by_id["1"].in_controller
    assert by_id["2"].held and not by_id["2"].admin_held and by_id["2"].reason == "JobHeldUser"
    assert by_id["3"].state == SlurmJobState.FAILED and by_id["3"].reason == "NonZeroExitCode"
    assert by_id["4"].state == SlurmJobState.COMPLETED and by_id["4"].comment == ""
    assert by_id["5"].reason == "JobLaunchFailure"


def test_squeue_after_requeuehold_and_release() -> None:
    [held] = parse_squeue(golden("squeue_requeuehold.txt"))
    assert held.state == SlurmJobState.PENDING and held.held and held.nodes == ()
    [waiting] = parse_squeue(golden("squeue_begintime.txt"))
    assert waiting.reason == "BeginTime" and not waiting.held


def test_squeue_documented_holds_and_hostlists() -> None:
    by_id = {o.job_id: o for o in parse_squeue(golden("squeue_documented.txt"))}
    assert by_id["401"].admin_held and by_id["402"].admin_held
    assert by_id["403"].held and not by_id["404"].held
    assert by_id["405"].nodes == ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")


def test_sacct_captured_exit_codes_and_signals() -> None:
    by_id = {o.job_id: o for o in parse_sacct(golden("sacct_mixed.txt"))}
    assert by_id["3"].state == SlurmJobState.FAILED and by_id["3"].exit_code == 3
    assert (by_id["5"].exit_code, by_id["5"].signal) == (0, 9)
    assert by_id["2"].state == SlurmJobState.CANCELLED and by_id["2"].nodes == ()
    assert by_id["1"].reason == "BeginTime" and by_id["4"].reason == ""
    assert all(o.source == "sacct" for o in by_id.values())


def test_sacct_skips_steps() -> None:
    assert [o.job_id for o in parse_sacct(golden("sacct_with_steps.txt"))] == ["3", "5"]


def test_sacct_documented_states_and_unknown_mapping() -> None:
    by_id = {o.job_id: o for o in parse_sacct(golden("sacct_documented.txt"))}
    assert by_id["301"].state == SlurmJobState.PREEMPTED and by_id["301"].signal == 15
    assert by_id["302"].state == SlurmJobState.TIMEOUT
    assert by_id["303"].nodes == ("node03", "node04")
    assert by_id["304"].state == SlurmJobState.OUT_OF_MEMORY
    assert by_id["305_7"].nodes == ("gpu01", "gpu02")
    assert by_id["306"].comment == "hpcrun:cancel-0a1b2c3d"
    assert by_id["307"].state == SlurmJobState.UNKNOWN  # never a bare string


def test_scontrol_show_job_one_line_and_multi_line() -> None:
    running = parse_scontrol_show_job(golden("scontrol_show_job_running.txt"))
    assert running["JobState"] == "RUNNING" and running["NodeList"] == "node[1-2]"
    assert running["Comment"] == "hpcrun:submit-0123abcd" and running["Restarts"] == "0"
    assert running["TRES"] == "cpu=2,node=2,billing=2"
    updated = parse_scontrol_show_job(golden("scontrol_show_job_begintime.txt"))
    assert updated["ExcNodeList"] == "node1" and updated["Reason"] == "BeginTime"
    assert updated["Restarts"] == "1"
    held = parse_scontrol_show_job(golden("scontrol_show_job_held.txt"))
    assert held["Reason"] == "JobHeldUser" and held["Priority"] == "0"
    assert parse_scontrol_show_job("JobId=7 Reason=launch failed requeued held Dependency=(null)"
                                   )["Reason"] == "launch failed requeued held"


def test_sbatch_outputs() -> None:
    assert parse_sbatch_output(golden("sbatch_plain.txt")) == "1"
    assert parse_sbatch_output(golden("sbatch_parsable.txt")) == "2"
    assert parse_sbatch_output("sbatch: warning: x\n4242;cluster1\n") == "4242"
    with pytest.raises(SchedulerError, match="no job id"):
        parse_sbatch_output("sbatch: error: Batch job submission failed")


@pytest.mark.parametrize(("text", "hosts"), [
    ("node[1-3],gpu07", ["node1", "node2", "node3", "gpu07"]),
    ("n[01-03,05]", ["n01", "n02", "n03", "n05"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("single", ["single"]),
    ("(null)", []),
    ("None assigned", []),
    ("", []),
])
def test_parse_nodelist(text: str, hosts: list[str]) -> None:
    assert parse_nodelist(text) == hosts


def test_parse_nodelist_rejects_garbage() -> None:
    with pytest.raises(SchedulerError, match="hostlist"):
        parse_nodelist("node[1-3")
    with pytest.raises(SchedulerError, match="hostlist"):
        parse_nodelist("node[a-c]")


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 500), st.integers(0, 40), st.integers(1, 4))
def test_nodelist_range_expands_to_every_padded_name(lo: int, span: int, width: int) -> None:
    hi = lo + span
    text = f"gpu[{lo:0{width}d}-{hi:0{width}d}]"
    pad = width if width > 1 else 0
    assert parse_nodelist(text) == [f"gpu{i:0{pad}d}" for i in range(lo, hi + 1)]


@pytest.mark.parametrize(("text", "state"), [
    ("CANCELLED by 1000", SlurmJobState.CANCELLED), ("R", SlurmJobState.RUNNING),
    ("PD", SlurmJobState.PENDING), ("RUNNING+", SlurmJobState.RUNNING),
    ("OOM", SlurmJobState.OUT_OF_MEMORY), ("???", SlurmJobState.UNKNOWN),
])
def test_parse_state(text: str, state: SlurmJobState) -> None:
    assert parse_state(text) == state


def test_parse_exit_code() -> None:
    assert parse_exit_code("2:0") == (2, None) and parse_exit_code("0:9") == (0, 9)
    assert parse_exit_code("") == (None, None)


def test_observe_falls_back_to_sacct_then_vanished() -> None:
    invalid = CommandResult(argv=("squeue",), returncode=1, stdout="",
                            stderr=golden("squeue_invalid.stderr").splitlines()[0])
    runner = FakeRunner({"squeue": invalid, "sacct": golden("sacct_mixed.txt")})
    client = SlurmClient(runner)
    assert client.observe("3").state == SlurmJobState.FAILED
    assert client.observe("3").source == "sacct"
    assert client.observe("999").state == SlurmJobState.VANISHED
    disabled = CommandResult(argv=("sacct",), returncode=1, stdout="",
                             stderr="Slurm accounting storage is disabled")
    assert SlurmClient(FakeRunner({"squeue": invalid, "sacct": disabled})).observe("3").vanished


def test_a_failed_job_in_the_controller_gets_its_exit_from_sacct() -> None:
    """squeue still lists job 5 (``kill -9 $$``) as FAILED, without an exit status."""
    runner = FakeRunner({"squeue": golden("squeue_mixed.txt"),
                         "sacct": golden("sacct_mixed.txt")})
    obs = SlurmClient(runner).observe("5")
    assert (obs.state, obs.exit_code, obs.signal) == (SlurmJobState.FAILED, 0, 9)
    assert obs.in_controller and obs.reason == "JobLaunchFailure"
    assert SlurmClient(runner).observe("1").exit_code is None  # running: nothing to ask
    assert not any(c[0] == "sacct" for c in runner.calls[2:])
    disabled = CommandResult(argv=("sacct",), returncode=1, stdout="",
                             stderr="Slurm accounting storage is disabled")
    runner = FakeRunner({"squeue": golden("squeue_mixed.txt"), "sacct": disabled,
                         "scontrol show job": golden("scontrol_show_job_failed.txt")})
    obs = SlurmClient(runner).observe("5")
    assert (obs.exit_code, obs.signal) == (137, None)  # scontrol's ExitCode of that capture


def test_client_argv_and_refusal() -> None:
    runner = FakeRunner({"sbatch": "77\n", "scontrol update": CommandResult(
        argv=(), returncode=1, stdout="",
        stderr="slurm_update error: Access/permission denied")})
    client = SlurmClient(runner, env={"SLURM_CONF": "/x"})
    assert client.sbatch("#!/bin/bash\n", ["--begin=now+10"]) == "77"
    assert runner.calls[0] == ("sbatch", "--parsable", "--begin=now+10")
    with pytest.raises(SchedulerError, match="restricts that operation"):
        client.update_job("77", StartTime="now+60", ExcNodeList="n1")
    assert runner.calls[1] == ("scontrol", "update", "JobId=77", "ExcNodeList=n1",
                               "StartTime=now+60")


def test_node_states_captured_and_documented() -> None:
    captured = parse_sinfo_nodes(golden("sinfo_down.txt"))
    assert captured == {"node1": "idle", "node2": "down*", "node3": "idle"}
    documented = parse_sinfo_nodes(golden("sinfo_documented.txt"))
    assert [n for n, st in documented.items() if node_is_down(st)] == ["node2", "node3"]
    assert not node_is_down("idle~") and not node_is_down("drained") and node_is_down("DOWN")


def test_settle_time_from_captured_config() -> None:
    assert parse_settle_s(golden("scontrol_show_config.txt")) == pytest.approx(10 + 10 / 3 + 10 + 5)
    assert parse_settle_s("") == pytest.approx(300 + 100 + 10 + 5)  # Slurm's defaults
    job = parse_scontrol_show_job(golden("scontrol_show_job_failed.txt"))
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "137:0"
    assert job["EndTime"].startswith("2026-")


def test_runs_of_a_requeued_job_captured() -> None:
    first, second = parse_sacct_runs(golden("sacct_runs_node_fail.txt"))
    assert first.state == SlurmJobState.NODE_FAIL and first.nodes == ("node1", "node2")
    assert second.state == SlurmJobState.COMPLETED and first.ended_at is not None
    assert second.ended_at is not None and second.ended_at - first.ended_at == 31


def test_requeuer_reports_the_run_before_this_one() -> None:
    from hpcrun.runtime.node.requeue import SlurmRequeuer

    runner = FakeRunner({"sacct": golden("sacct_runs_node_fail.txt")})
    past = SlurmRequeuer(SlurmClient(runner), "4").previous_run()
    assert past is not None and past.state == SlurmJobState.NODE_FAIL
    assert "--duplicates" in runner.calls[0]
    assert SlurmRequeuer(SlurmClient(FakeRunner()), "4").previous_run() is None  # no sacct
    # accounting not caught up yet (only the current run listed): asked again, then given up
    clock = FakeClock(0.0)
    one = FakeRunner({"sacct": golden("sacct_runs_node_fail.txt").splitlines()[-1] + "\n"})
    assert SlurmRequeuer(SlurmClient(one), "4", clock=clock).previous_run(tries=3) is None
    assert len(one.calls) == 3 and clock.monotonic() == 2.0
