"""Status names what the ranks noted that a user must know: no state registered, SDC replica
check off (a sharded model without replicas), from the run log's typed notes."""

from __future__ import annotations

from pathlib import Path

from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.control.notes import NoRestoreNote, ReplicaCheckOffNote
from hpcrun.observe.collect import REPLICA_CHECK_OFF_WARNING, run_warnings


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "log").mkdir(parents=True)
    return run


def test_a_run_without_notes_has_no_warnings(tmp_path: Path) -> None:
    assert run_warnings(_run(tmp_path)) == ()


def test_the_replica_check_off_note_is_one_line_however_often_it_was_written(
        tmp_path: Path) -> None:
    run = _run(tmp_path)
    for _ in range(3):  # once per incarnation
        RunLog(run).append_entry(ReplicaCheckOffNote(detail="no replicas"), generation=UNFENCED,
                                 holder="")
    RunLog(run).append_entry(NoRestoreNote(step=4), generation=UNFENCED, holder="")
    warnings = run_warnings(run)
    assert len(warnings) == 2 and warnings[1] == REPLICA_CHECK_OFF_WARNING
    assert warnings[0].startswith("no checkpoint will be committed") and "step 4" in warnings[0]


def test_a_bitwise_runs_rebuilding_ddp_is_named_with_the_fix(tmp_path: Path) -> None:
    from hpcrun.control.notes import DdpRebuildsNote

    run = _run(tmp_path)
    RunLog(run).append_entry(DdpRebuildsNote(modules=("model",)), generation=UNFENCED, holder="")
    [warning] = run_warnings(run)
    assert "DistributedDataParallel in model rebuilds its gradient buckets" in warning
    assert "hpcrun.integrations.ddp.ddp(ctx, model)" in warning
