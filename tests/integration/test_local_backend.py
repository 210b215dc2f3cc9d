"""Runtime contracts on the embedded local backend (no Slurm): preemption, a killed rank, an
exhausted retry budget, cancel and hang detection, each through the real CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.record import read_record
from hpcrun.drill.ledger import check_ledger, read_ledger
from hpcrun.drill.states import committed
from hpcrun.launch.local import launcher_alive, read_launcher
from hpcrun.testing.runs import wait_for_state
from tests.integration.local_helpers import (
    cli,
    local_spec,
    run_processes,
    states,
    submit,
    valid_entries,
    wait_until,
)

STEPS = 30


def _ledger_ok(run_dir: Path, steps: int) -> None:
    lines = read_ledger(run_dir)
    assert lines is not None
    report = check_ledger(lines[0], total_steps=steps, malformed=lines[1])
    assert report.ok, report


def _manifest_shown(root: Path, run: Path, state: str) -> dict[str, Any]:
    """``hpcrun show --manifest`` prints the run's published post-run manifest."""
    out = cli(root, "show", run.name, "--manifest")
    assert out.returncode == 0, out.stderr
    manifest: dict[str, Any] = json.loads(out.stdout)
    assert (manifest["terminal_state"], manifest["run_id"]) == (state, run.name)
    assert manifest["generation"] == read_record(run).generation
    return manifest


def test_preemption_signal_resumes_from_the_committed_step(tmp_path: Path) -> None:
    """`hpcrun signal RUN` mid-run: stop at a boundary, commit, requeue, resume, finish."""
    # Steps take milliseconds: rank 0 is slowed (0.5 s per step, 15 s in all, in the first
    # incarnation only) so the signal, a CLI start on a loaded machine away, lands mid-run.
    run = submit(tmp_path, local_spec(steps=STEPS, every_steps=100, config={"ledger": True}),
                 inject="slow@step=1,rank=0,seconds=0.5", wait=False)
    wait_until(run, lambda r: str(r.state) == "RUNNING", timeout=180, what="first start")
    out = cli(tmp_path, "signal", run.name)
    assert out.returncode == 0, out.stderr
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=300)
    assert (str(record.state), record.step) == ("SUCCEEDED", STEPS)
    assert record.tokens == STEPS * 8 * 16  # the gang's tokens (global batch x seq_len)
    seen = states(run)
    assert seen.count("PREEMPTED") == 1 and seen.count("REQUEUED") == 1
    # No periodic checkpoint was due: the resume point is the stop commit, so no step is redone.
    stop_commit = committed(run)[0]
    running = [e.payload for e in valid_entries(run, "state") if e.payload["state"] == "RUNNING"]
    assert running[1]["restored_step"] == stop_commit.step > 0
    lines = read_ledger(run)
    assert lines is not None and len(lines[0]) == STEPS  # nothing consumed twice
    _ledger_ok(run, STEPS)
    manifest = _manifest_shown(tmp_path, run, "SUCCEEDED")
    assert (manifest["steps"], manifest["tokens"]) == (STEPS, STEPS * 8 * 16)
    assert manifest["requeues"] == 1


def test_killed_rank_is_restarted_inside_the_allocation(tmp_path: Path) -> None:
    run = submit(tmp_path, local_spec(steps=STEPS, every_steps=10, config={"ledger": True}),
                 # paced after the step-10 save, so its asynchronous commit lands before
                 # the crash at step 15 whatever the load
                 inject="crash@step=15,rank=1;slow@step=11,rank=0,seconds=0.4")
    record = read_record(run)
    assert (str(record.state), record.step) == ("SUCCEEDED", STEPS), record.state_info
    assert record.requeues == 0 and "REQUEUED" not in states(run)
    assert "RECOVERING" in states(run) and record.generation == 2
    faults = [e.payload for e in valid_entries(run, "fault")]
    assert any(f["fault"] == "process_crash" and f["rank"] == 1 for f in faults)
    running = [e.payload for e in valid_entries(run, "state") if e.payload["state"] == "RUNNING"]
    assert running[-1]["restored_step"] == 10  # the newest committed before the crash
    _ledger_ok(run, STEPS)


def test_cancel_fences_the_run_and_stops_every_process(tmp_path: Path) -> None:
    run = submit(tmp_path, local_spec(steps=2000, every_steps=5), wait=False)
    wait_until(run, lambda r: r.step >= 5, timeout=180, what="first commit")
    out = cli(tmp_path, "cancel", run.name)
    assert out.returncode == 0 and "CANCELLED" in out.stdout, out.stderr
    record = read_record(run)
    assert str(record.state) == "CANCELLED"
    info = read_launcher(run)
    assert info is not None
    deadline = time.monotonic() + 60
    while (launcher_alive(info) or run_processes(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not launcher_alive(info) and run_processes(run) == []
    # Committed evidence is kept, and nothing the old gang wrote after the fence counts.
    assert committed(run)
    assert str(read_record(run).state) == "CANCELLED"
    _manifest_shown(tmp_path, run, "CANCELLED")


@pytest.mark.slow
def test_exhausted_retry_budget_ends_failed_with_the_reason(tmp_path: Path) -> None:
    spec = local_spec(steps=STEPS, every_steps=10,
                      retry={"max_attempts": {"process_crash": 1}, "backoff_base_s": 1,
                             "backoff_cap_s": 1})
    run = submit(tmp_path, spec, inject="crash@step=12,rank=1,every=1")
    record = read_record(run)
    assert str(record.state) == "FAILED"
    reason = str((record.result or {}).get("reason", ""))
    assert "process_crash retry budget spent" in reason and "max_attempts" in reason
    crashes = [e for e in valid_entries(run, "fault") if e.payload["fault"] == "process_crash"]
    assert len(crashes) == 2  # the first crash was retried once, the second ended the run
    manifest = _manifest_shown(tmp_path, run, "FAILED")
    assert [i["fault"] for i in manifest["incidents"]].count("process_crash") == 2


@pytest.mark.slow
def test_hang_is_detected_the_gang_killed_and_the_run_recovers(tmp_path: Path) -> None:
    run = submit(tmp_path, local_spec(steps=STEPS, every_steps=10),
                 inject="hang@step=15,rank=1", env={"HPCRUN_HANG_S": "5"})
    record = read_record(run)
    assert (str(record.state), record.step) == ("SUCCEEDED", STEPS), record.state_info
    hangs = [e.payload for e in valid_entries(run, "fault") if e.payload["fault"] == "hang"]
    assert hangs, [e.payload for e in valid_entries(run, "fault")]
    # the rank that did not arrive is named, with its node, from the collective sequence
    # numbers; the rank blocked in the all-reduce is not
    named = [h for h in hangs if h.get("culprit_ranks")]
    assert named and all(h["culprit_ranks"] == [1] and h["rank"] == 1 for h in named), hangs
    assert all(h["culprit_nodes"] == [h["node"]] and h["node"] for h in named), hangs
    assert record.generation >= 2
    # The gang was killed: the hung rank's process is gone, not left behind.
    assert run_processes(run) == []


def test_a_rank_wedged_before_its_first_step_is_a_hang(tmp_path: Path) -> None:
    """No heartbeat to judge yet: the start-up allowance (HPCRUN_START_S) catches it."""
    spec = local_spec(steps=10, every_steps=5, entrypoint="tests.integration.stuck_start:main")
    run = submit(tmp_path, spec, env={"HPCRUN_START_S": "25"})  # 3x a loaded start-up
    record = read_record(run)
    assert (str(record.state), record.step) == ("SUCCEEDED", 10), record.state_info
    hangs = [e.payload for e in valid_entries(run, "fault") if e.payload["fault"] == "hang"]
    assert hangs and all("never_stepped" in h["detail"] for h in hangs), hangs
    # the healthy rank waits for the wedged one in a collective: whichever node's agent sees
    # it first names its own rank (the stacks in diagnostics/ tell which one is stuck where)
    assert all(h["step"] == -1 for h in hangs)
    assert run_processes(run) == []
