"""Campaigns on the embedded local backend: segments past the requeue budget, a bounded sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.drill.ledger import check_ledger, read_ledger
from hpcrun.testing.runs import wait_for_state
from tests.integration.local_helpers import local_spec, submit

pytestmark = pytest.mark.slow


def test_stops_that_commit_progress_are_segments_not_requeue_faults(tmp_path: Path) -> None:
    """Four preemption stops, each after progress, on a run allowed one fault requeue."""
    steps = 50
    inject = ";".join(f"preempt@step={10 * (k + 1)},restart={k}" for k in range(4))
    run = submit(tmp_path, local_spec(steps=steps, every_steps=100, budgets={"max_requeues": 1},
                                      config={"ledger": True}), inject=inject, wait=False)
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=300)
    assert (str(record.state), record.step) == ("SUCCEEDED", steps), record.state_info
    assert record.segments == 4 and record.requeues == 4 and record.faults == ()
    lines = read_ledger(run)
    assert lines is not None
    report = check_ledger(lines[0], total_steps=steps, malformed=lines[1])
    assert report.ok and len(lines[0]) == steps, report  # each segment resumed exactly
