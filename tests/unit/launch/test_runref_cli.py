"""Commands act on a run through its own backend, read from its record (click's runner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.control.entries import JobPayload
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.launch.site import load_site, save_site_snapshot
from hpcrun.vocab import Backend


def _run(root: Path, run_id: str, *, job: str, backend: Backend) -> Path:
    run = create_run(root, RunSpec(name="tiny", entrypoint="m:f"), run_id=run_id)
    save_site_snapshot(run, load_site("local"))
    RunLog(run).append_entry(JobPayload(job_id=job, backend=backend), generation=UNFENCED,
                             holder="")
    return run


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("HPCRUN_RUNS", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # any scancel call would fail loudly
    return CliRunner()


def test_signal_of_a_local_run_without_its_launcher_names_the_backend_and_calls_no_scancel(
        tmp_path: Path, runner: CliRunner) -> None:
    _run(tmp_path, "tiny-20261201-101500-ab12", job="local-999999", backend=Backend.LOCAL)
    out = runner.invoke(cli, ["signal", "tiny-2026"])
    assert out.exit_code != 0 and isinstance(out.exception, Exception)
    assert "runs on the local backend and its launcher is not running" in str(out.exception)
    assert "scancel" not in str(out.exception)


def test_crash_node_of_a_slurm_run_is_refused_before_anything_is_sent(
        tmp_path: Path, runner: CliRunner) -> None:
    _run(tmp_path, "tiny-20261201-101500-cd34", job="4242", backend=Backend.SLURM)
    out = runner.invoke(cli, ["signal", "tiny-20261201-101500-cd", "--crash-node", "node2"])
    assert "--crash-node emulates a node loss on the local backend" in str(out.exception)
    assert "runs on slurm" in str(out.exception)


def test_cancel_of_a_local_run_by_prefix_fences_it_and_sends_no_scancel(
        tmp_path: Path, runner: CliRunner) -> None:
    run = _run(tmp_path, "tiny-20261201-101500-ef56", job="local-999999", backend=Backend.LOCAL)
    out = runner.invoke(cli, ["cancel", "tiny-20261201-101500-e"])
    assert out.exit_code == 0, out.output
    assert out.output.strip().endswith("tiny-20261201-101500-ef56: CANCELLED")
    record = read_record(run)
    assert str(record.state) == "CANCELLED" and record.slurm_job_ids() == ()


def test_signal_of_a_run_that_has_ended_says_so_and_sends_nothing(
        tmp_path: Path, runner: CliRunner) -> None:
    _run(tmp_path, "tiny-20261201-101500-gh78", job="local-999999", backend=Backend.LOCAL)
    assert runner.invoke(cli, ["cancel", "tiny-20261201-101500-gh"]).exit_code == 0
    out = runner.invoke(cli, ["signal", "tiny-20261201-101500-gh"])
    assert out.exit_code != 0
    assert "run tiny-20261201-101500-gh78 has ended (CANCELLED); there is nothing to signal" in \
        str(out.exception)
