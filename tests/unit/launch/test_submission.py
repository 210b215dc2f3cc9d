"""The submission pipeline as a library: it reads the environment it is given, sends its
notices to the context's sink (printing nothing), and refuses bad input before creating
anything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpcrun.control.entries import JobPayload
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.errors import AdmissionError, SpecError
from hpcrun.launch.submission import (
    SubmitContext,
    SubmitRequest,
    dry_run_submission,
    submit_run,
)
from hpcrun.runtime.faults import parse_injections
from hpcrun.testing.runs import tiny_spec, write_spec
from tests.unit.launch.admission_cases import REPO_ROOT, small_dataset


def _context(tmp: Path, warnings: list[str]) -> SubmitContext:
    environ = {**os.environ, "HPCRUN_RUNS": str(tmp / "runs"), "HOME": str(tmp / "home"),
               "PYTHONPATH": str(REPO_ROOT)}
    return SubmitContext(environ=environ, cwd=REPO_ROOT, agent_entry=lambda run_dir: 0,
                         check_faults=parse_injections, warn=warnings.append)


def _spec(tmp: Path) -> Path:
    return write_spec(tmp / "run.yaml", tiny_spec(manifest=small_dataset(tmp / "data")))


def test_a_dry_run_reads_the_given_environment_and_prints_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warnings: list[str] = []
    plan = dry_run_submission(SubmitRequest(spec_path=_spec(tmp_path), backend="local"),
                              _context(tmp_path, warnings))
    assert "storage: runs root (shared tier): " + str(tmp_path / "runs") in plan.report
    assert plan.plan.startswith("local backend: 2 node(s) x 2 rank(s)")
    assert str(tmp_path / "home") in plan.plan  # the node-local tier of the given $HOME
    assert plan.wait_flag is None and warnings == []
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "runs").exists()


def test_a_bad_fault_schedule_is_an_admission_problem(tmp_path: Path) -> None:
    req = SubmitRequest(spec_path=_spec(tmp_path), backend="local", inject="melt@step=3")
    with pytest.raises(AdmissionError, match=r"HPCRUN_INJECT part 'melt@step=3' is malformed"):
        dry_run_submission(req, _context(tmp_path, []))
    assert not (tmp_path / "runs").exists()


def test_a_fault_schedule_for_a_plain_script_is_refused_before_anything_is_created(
        tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "run.yaml", {
        "name": "plain", "command": [sys.executable, "-c", "print('trained')"], "site": "local",
        "resources": {"nodes": 1, "tasks_per_node": 1, "time_limit_min": 5}})
    req = SubmitRequest(spec_path=spec, backend="local", inject="crash@step=3,rank=0")
    with pytest.raises(SpecError, match=r"--inject 'crash@step=3,rank=0' cannot fire in a "
                                        r"script run.*hpcrun signal RUN"):
        submit_run(req, _context(tmp_path, []))
    assert not (tmp_path / "runs").exists()


def test_after_on_the_local_backend_is_refused_before_anything_is_created(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    up = create_run(runs, RunSpec.from_dict({"name": "up", "entrypoint": "m:f"}), run_id="up-1")
    RunLog(up).append_entry(JobPayload(job_id="41", backend="slurm", op_id="up-1.submit.0"),
                            generation=UNFENCED, holder="")  # a queued Slurm upstream
    req = SubmitRequest(spec_path=_spec(tmp_path), backend="local", after=("up-1",))
    with pytest.raises(SpecError, match="--after needs the slurm backend"):
        submit_run(req, _context(tmp_path, []))
    assert sorted(p.name for p in runs.iterdir()) == ["up-1"]
