"""hpcrun.submit / hpcrun.sweep handles: state, wait, result (the post-run manifest)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hpcrun
from hpcrun.api import RunHandle, RunNotFinishedError, SweepHandle, WaitTimeoutError
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.errors import SpecError
from hpcrun.observe.postrun import MANIFEST_SCHEMA_VERSION, publish_manifest
from hpcrun.testing import FakeClock
from hpcrun.vocab import RunState


def _run(root: Path, run_id: str) -> tuple[Path, RunLog, int, str]:
    run_dir = create_run(root, RunSpec.from_dict({"name": "x", "entrypoint": "m:f"}),
                         run_id=run_id)
    log = RunLog(run_dir)
    fence = log.claim("agent")
    return run_dir, log, fence.generation, fence.holder


def _end(log: RunLog, gen: int, holder: str, state: RunState) -> None:
    log.publish(EntryKind.STATE, generation=gen, holder=holder,
                payload={"state": state.value, "reason": "test"})


def test_a_handle_reads_state_waits_and_returns_the_manifest(tmp_path: Path) -> None:
    run_dir, log, gen, holder = _run(tmp_path, "x-1")
    run = RunHandle(run_dir)
    assert run.run_id == "x-1" and run.state() == RunState.PENDING
    with pytest.raises(RunNotFinishedError, match="is PENDING: its result exists once it ends"):
        run.result()
    clock = FakeClock()
    with pytest.raises(WaitTimeoutError, match="still PENDING after 10 s"):
        run.wait(10, poll_s=1, clock=clock)
    _end(log, gen, holder, RunState.SUCCEEDED)
    assert run.wait(10, clock=clock) == RunState.SUCCEEDED
    assert run.result() is None  # ended without publishing a manifest
    manifest = {"schema_version": MANIFEST_SCHEMA_VERSION, "run_id": "x-1",
                "terminal_state": "SUCCEEDED", "steps": 40}
    publish_manifest(run_dir, manifest, log=log, generation=gen, holder=holder)
    assert run.result() == manifest


def test_a_sweep_handle_has_one_run_handle_per_point(tmp_path: Path) -> None:
    ended = []
    for k, state in enumerate((RunState.SUCCEEDED, RunState.FAILED)):
        run_dir, log, gen, holder = _run(tmp_path, f"x-sweep-{k}")
        _end(log, gen, holder, state)
        ended.append(RunHandle(run_dir))
    sw = SweepHandle(tmp_path / "x-sweep", tuple(ended))
    assert sw.state() == {"x-sweep-0": RunState.SUCCEEDED, "x-sweep-1": RunState.FAILED}
    assert sw.wait(clock=FakeClock()) == sw.state() and sw.result() == [None, None]


def test_sweep_refuses_bad_input_before_creating_anything(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCRUN_RUNS", str(tmp_path / "runs"))
    spec = {"name": "x", "entrypoint": "m:f", "config": {"lr": 0.1}}
    with pytest.raises(SpecError, match=r"sweep grid axis 'config\.lr' has no values"):
        hpcrun.sweep(spec, {"config.lr": []}, runs_root=str(tmp_path / "runs"))
    with pytest.raises(SpecError, match=r"sweep key 'config\.momentum' is not in"):
        hpcrun.sweep(spec, {"config.momentum": [0.9]}, runs_root=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
