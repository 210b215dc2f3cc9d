"""Job submission and state waiting over a scripted runner and a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hpcrun.errors import TestbedError
from hpcrun.runner import CommandResult
from hpcrun.testbed.jobs import (
    JobClient,
    JobRecord,
    normalize_state,
    parse_job_id,
    parse_sacct_records,
    parse_squeue_state,
)
from hpcrun.testing.fakes import FakeClock, FakeRunner


def test_parsers() -> None:
    assert parse_job_id("42\n") == 42
    assert parse_job_id("42;hpcrun\n") == 42
    with pytest.raises(TestbedError, match="expected a job id"):
        parse_job_id("sbatch: error: bad\n")
    assert parse_squeue_state("RUNNING\n") == "RUNNING"
    assert parse_squeue_state("\n") is None
    assert normalize_state("CANCELLED by 0") == "CANCELLED"
    assert normalize_state("cancelled+") == "CANCELLED"
    text = "7|NODE_FAIL|node[1-2]|0:0\n7.batch|CANCELLED|node1|0:15\n7|COMPLETED|node[3-4]|0:0\n"
    assert parse_sacct_records(text) == [
        JobRecord(job_id=7, state="NODE_FAIL", nodes="node[1-2]", exit_code="0:0"),
        JobRecord(job_id=7, state="COMPLETED", nodes="node[3-4]", exit_code="0:0")]


def _sequence(*states: str) -> Callable[[Sequence[str]], CommandResult]:
    remaining = list(states)

    def answer(argv: Sequence[str]) -> CommandResult:
        state = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        return CommandResult(argv=tuple(argv), returncode=0, stdout=state + "\n", stderr="")
    return answer


def test_submit_sends_script_and_env() -> None:
    runner = FakeRunner({"sbatch --parsable": "17\n"})
    client = JobClient({"SLURM_CONF": "/s/slurm.conf"}, runner=runner, clock=FakeClock())
    assert client.submit("#!/bin/sh\ntrue\n", "-N2", "--output=/shared/out.txt") == 17
    assert runner.calls == [("sbatch", "--parsable", "-N2", "--output=/shared/out.txt")]


def test_a_job_without_output_never_writes_into_the_working_directory(tmp_path: Path) -> None:
    """Slurm's default is slurm-<id>.out in the submitter's cwd: for a test, the repository."""
    runner = FakeRunner({"sbatch --parsable": "17\n"})
    JobClient({}, runner=runner, clock=FakeClock()).submit("#!/bin/sh\n", "-N1")
    JobClient({}, runner=runner, clock=FakeClock(), output_dir=tmp_path).submit(
        "#!/bin/sh\n", "-N1")
    JobClient({}, runner=runner, clock=FakeClock(), output_dir=tmp_path).submit(
        "#!/bin/sh\n", "-o", "/x/%j.txt")
    assert runner.calls == [("sbatch", "--parsable", "-N1", "--output=/dev/null"),
                            ("sbatch", "--parsable", "-N1", f"--output={tmp_path}/slurm-%j.out"),
                            ("sbatch", "--parsable", "-o", "/x/%j.txt")]


def test_submit_failure_is_one_clear_line() -> None:
    runner = FakeRunner({"sbatch": CommandResult(argv=("sbatch",), returncode=1, stdout="",
                                                 stderr="sbatch: error: Invalid partition\n")})
    client = JobClient({}, runner=runner, clock=FakeClock())
    with pytest.raises(TestbedError, match=r"exited 1: sbatch: error: Invalid partition$"):
        client.submit("#!/bin/sh\n", "-p", "nope")


def test_wait_returns_when_state_is_reached() -> None:
    clock = FakeClock()
    runner = FakeRunner({"squeue": _sequence("PENDING", "RUNNING", "COMPLETING", "COMPLETED")})
    client = JobClient({}, runner=runner, clock=clock)
    assert client.wait_for_state(5, {"completed"}, timeout=10) == "COMPLETED"
    assert clock.monotonic() == pytest.approx(1.5)


def test_wait_fails_fast_on_unwanted_terminal_state() -> None:
    clock = FakeClock()
    client = JobClient({}, runner=FakeRunner({"squeue": _sequence("RUNNING", "FAILED")}),
                       clock=clock)
    with pytest.raises(TestbedError, match=r"job 5 ended FAILED, expected \['COMPLETED'\]"):
        client.wait_for_state(5, {"COMPLETED"}, timeout=100)
    assert clock.monotonic() < 1


def test_wait_times_out_naming_the_last_state() -> None:
    client = JobClient({}, runner=FakeRunner({"squeue": "PENDING\n"}), clock=FakeClock())
    with pytest.raises(TestbedError, match="after 3 s; last state PENDING"):
        client.wait_for_state(5, {"RUNNING"}, timeout=3)


def test_state_falls_back_to_sacct_when_squeue_forgot_the_job() -> None:
    runner = FakeRunner({"squeue": "", "sacct": "5|NODE_FAIL|node1|0:0\n5|COMPLETED|node2|0:0\n"})
    client = JobClient({}, runner=runner, clock=FakeClock())
    assert client.state(5) == "COMPLETED"
    assert [r.state for r in client.history(5)] == ["NODE_FAIL", "COMPLETED"]


def test_wait_for_accounting_needs_every_state() -> None:
    runner = FakeRunner({"sacct": "5|NODE_FAIL|node1|0:0\n"})
    client = JobClient({}, runner=runner, clock=FakeClock())
    with pytest.raises(TestbedError, match=r"lacks \['COMPLETED', 'NODE_FAIL'\].*"
                                           r"found \['NODE_FAIL'\]"):
        client.wait_for_accounting(5, {"NODE_FAIL", "COMPLETED"}, timeout=2)
