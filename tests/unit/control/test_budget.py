"""Long runs: allocations folded into wall time, segments, and the budget verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from hpcrun.control.budget import (
    Usage,
    allocation_cap,
    budget_spent,
    projected_finish,
    remaining_s,
    segments_spent,
    usage_of,
)
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import EntryKind, LogEntry
from hpcrun.control.record import fold_record
from hpcrun.control.retry import fault_requeues, segment_progress
from hpcrun.control.spec import Budgets, RunSpec
from hpcrun.errors import SpecError


def E(slot: int, kind: str, at: float, gen: int = 1, **payload: Any) -> LogEntry:
    return LogEntry(slot=slot, kind=kind, generation=gen, holder=f"h{gen}", ts=at,
                    writer="test", payload=payload)


def segment_log() -> list[LogEntry]:
    """Two allocations of 600 s and 300 s; the first ended as a segment at step 100."""
    return [
        E(0, EntryKind.FENCE, 1000.0),
        E(1, EntryKind.STATE, 1000.0, state="STARTING", reason=""),
        E(2, EntryKind.STATE, 1010.0, state="RUNNING", reason=""),
        E(3, EntryKind.PROGRESS, 1500.0, step=100),
        E(4, EntryKind.COMMIT, 1590.0, ckpt_id="c100", tier="shared", step=100,
          manifest="ckpt/c100/manifest.json"),
        E(5, EntryKind.STATE, 1600.0, state="PREEMPTED", reason="stop"),
        E(6, EntryKind.NOTE, 1600.0, event="segment", step_from=0, step_to=100, reason="x"),
        E(7, EntryKind.STATE, 1601.0, state="REQUEUED", reason="segment"),
        E(8, EntryKind.FENCE, 5000.0, gen=2),
        E(9, EntryKind.STATE, 5000.0, gen=2, state="STARTING", reason=""),
        E(10, EntryKind.STATE, 5010.0, gen=2, state="RUNNING", reason=""),
        E(11, EntryKind.PROGRESS, 5200.0, gen=2, step=150),
    ]


def test_the_record_folds_allocated_time_and_segments() -> None:
    rec = fold_record(segment_log(), run_id="r", spec_id="s")
    assert rec.segments == 1 and rec.requeues == 1 and fault_requeues(rec) == 0
    assert rec.wall_s == 600.0 and rec.alloc_since == 5000.0
    assert rec.segment_from_step == 100 and rec.first_started == 1000.0
    usage = usage_of(rec, nodes=4, now=5300.0)
    assert usage.wall_s == 900.0 and usage.node_hours == pytest.approx(1.0)


def test_a_stop_before_any_new_commit_is_no_progress() -> None:
    rec = fold_record(segment_log(), run_id="r", spec_id="s")
    assert segment_progress(rec) is None  # step 150 was never committed in allocation 2
    more = [*segment_log(), E(12, EntryKind.COMMIT, 5250.0, gen=2, ckpt_id="c150",
                              tier="shared", step=150, manifest="m")]
    assert segment_progress(fold_record(more, run_id="r", spec_id="s")) == 150


def test_an_unrecorded_requeue_ends_the_allocation_at_its_last_heartbeat() -> None:
    log = [E(0, EntryKind.FENCE, 100.0), E(1, EntryKind.STATE, 100.0, state="STARTING"),
           E(2, EntryKind.STATE, 110.0, state="RUNNING"),
           E(3, EntryKind.HEARTBEAT, 400.0, node="n1", step=5, ts=400.0),
           E(4, EntryKind.FENCE, 900.0, gen=2),
           E(5, EntryKind.STATE, 900.0, gen=2, state="STARTING")]
    rec = fold_record(log, run_id="r", spec_id="s")
    assert rec.wall_s == 300.0 and rec.alloc_since == 900.0 and rec.requeues == 1


def test_budgets_say_which_is_spent_and_how_to_fix_it() -> None:
    usage = Usage(segments=3, wall_s=7200.0, nodes=4)
    assert budget_spent(usage, Budgets()) is None
    wall = budget_spent(usage, Budgets(max_wall_hours=2.0))
    assert wall is not None and "wall-hour budget spent (2.000 of 2 h" in wall \
        and "budgets.max_wall_hours" in wall
    nodeh = budget_spent(usage, Budgets(max_node_hours=8.0))
    assert nodeh is not None and "node-hour budget spent (8.000 of 8 node-hours on 4 nodes)" \
        in nodeh
    assert budget_spent(usage, Budgets(max_wall_hours=3.0, max_node_hours=9.0)) is None
    assert segments_spent(usage, Budgets(max_segments=3)) is not None
    assert segments_spent(usage, Budgets(max_segments=4)) is None
    assert remaining_s(usage, Budgets(max_wall_hours=3.0, max_node_hours=10.0)) == 1800.0
    assert remaining_s(usage, Budgets()) is None


def test_segments_are_unlimited_by_default_and_the_spec_digest_is_unchanged() -> None:
    raw = {"name": "tiny", "entrypoint": "examples.tiny:main"}
    spec = RunSpec.from_dict(raw)
    assert spec.budgets.max_segments is None
    assert "max_segments" not in spec.to_dict()["budgets"]
    used = RunSpec.from_dict({**raw, "budgets": {"max_segments": 40, "max_node_hours": 2.5}})
    assert used.to_dict()["budgets"]["max_segments"] == 40 and used.spec_id != spec.spec_id
    assert RunSpec.from_dict(used.to_dict()).spec_id == used.spec_id
    assert allocation_cap(spec.budgets) > 10_000 and allocation_cap(used.budgets) == 51
    with pytest.raises(SpecError, match=r"budgets\.max_segments: expected an integer >= 1"):
        RunSpec.from_dict({**raw, "budgets": {"max_segments": 0}})


def test_projected_finish_extrapolates_the_runs_own_rate() -> None:
    rec = fold_record(segment_log(), run_id="r", spec_id="s")
    # 150 steps in 4300 s since the first start: 150 more steps take another 4300 s
    assert projected_finish(rec, total_steps=300, now=5300.0) == pytest.approx(9600.0)
    assert projected_finish(rec, total_steps=None, now=5300.0) is None
    assert projected_finish(fold_record([], run_id="r", spec_id="s"), total_steps=10,
                            now=1.0) is None


def test_a_created_note_alone_has_no_allocation() -> None:
    rec = fold_record([E(0, EntryKind.NOTE, 1.0, gen=UNFENCED, event="created", owner="a")],
                      run_id="r", spec_id="s")
    assert rec.alloc_since is None and rec.wall_s == 0.0


def spare_requeue_log() -> list[LogEntry]:
    """Submitted at 900; job 7 granted 3 nodes (one a hot spare) at 990 by Slurm's clock, the
    agent's STARTING at 1000; a restart inside it; requeued at 1600; job 7 again granted at
    1900 with the spare swapped in (no spare left), done at 2200."""
    return [
        E(0, EntryKind.JOB, 900.0, gen=UNFENCED, job_id="7", backend="slurm", op_id="o1"),
        E(1, EntryKind.FENCE, 1000.0),
        E(2, EntryKind.JOB, 1000.0, job_id="7", backend="slurm", nodes=["a", "b", "c"]),
        E(3, EntryKind.STATE, 1000.0, state="STARTING", reason="", alloc_start=990.0, held=3,
          nodes=["a", "b"]),
        E(4, EntryKind.STATE, 1010.0, state="RUNNING", reason=""),
        E(5, EntryKind.STATE, 1200.0, state="RECOVERING", reason="crash"),
        E(6, EntryKind.FENCE, 1300.0, gen=2),
        E(7, EntryKind.STATE, 1300.0, gen=2, state="STARTING", reason="", attempt=1,
          held=3, nodes=["a", "c"]),
        E(8, EntryKind.STATE, 1600.0, gen=2, state="REQUEUED", reason="node lost"),
        E(9, EntryKind.FENCE, 1905.0, gen=3),
        E(10, EntryKind.JOB, 1905.0, gen=3, job_id="7", backend="slurm", restart_count=1,
          nodes=["a", "c"]),
        E(11, EntryKind.STATE, 1905.0, gen=3, state="STARTING", reason="", alloc_start=1900.0,
          held=2),
        E(12, EntryKind.STATE, 2200.0, gen=3, state="SUCCEEDED", reason="done"),
    ]


def test_allocations_run_from_slurms_start_and_count_spares() -> None:
    rec = fold_record(spare_requeue_log(), run_id="r", spec_id="s")
    first, second = rec.allocations
    assert (first.job_id, first.start, first.end, first.nodes, first.spares) == \
        ("7", 990.0, 1600.0, 3, 1)
    assert first.queued_s == 90.0                      # submitted 900, granted 990
    assert (second.start, second.end, second.nodes, second.spares) == (1900.0, 2200.0, 2, 0)
    assert second.queued_s == 300.0                    # requeued 1600, granted 1900
    assert first.requeued and not second.requeued     # the run went on after the first only
    assert rec.wall_s == 610.0 + 300.0 and rec.first_started == 990.0
    usage = usage_of(rec, nodes=3, now=9999.0)
    assert usage.node_hours == pytest.approx((610.0 * 3 + 300.0 * 2) / 3600.0)
    assert usage.spare_node_hours == pytest.approx(610.0 / 3600.0)


def test_an_open_allocation_counts_to_now_with_its_own_nodes() -> None:
    rec = fold_record(spare_requeue_log()[:5], run_id="r", spec_id="s")
    assert rec.alloc_since == 990.0 and rec.allocations[-1].end is None
    usage = usage_of(rec, nodes=5, now=1090.0)
    assert usage.wall_s == 100.0 and usage.nodes == 3
    assert usage.node_hours == pytest.approx(300.0 / 3600.0)


def test_status_report_and_budgets_show_one_node_hours_figure() -> None:
    from hpcrun.observe.campaign import campaign_figures, campaign_lines
    from hpcrun.observe.collect import facts_from_record
    from hpcrun.observe.figures import allocations_at, figure_rows, run_figures
    from hpcrun.observe.summary import summarize_events
    from tests.unit.observe.builders import step

    rec = fold_record(spare_requeue_log(), run_id="r", spec_id="s")
    facts = facts_from_record(rec)
    evs = [step(1, 1010.0, 1100.0, gen=1), step(2, 1950.0, 2100.0, gen=3)]
    fig = run_figures(summarize_events(evs), allocations=allocations_at(facts.allocations, 9e9))
    usage = usage_of(rec, nodes=3, now=9e9)
    assert fig is not None and fig.node_hours == pytest.approx(usage.node_hours)
    assert fig.spare_node_hours == pytest.approx(usage.spare_node_hours)
    assert fig.allocated_s == rec.wall_s and fig.queue_s == 390.0
    row = dict(figure_rows(fig))["node-hours"]
    assert row == f"{usage.node_hours:.3f} ({usage.spare_node_hours:.3f} on spares)"
    spec = RunSpec.from_dict({"name": "x", "entrypoint": "m:f",
                              "budgets": {"max_node_hours": 2}})
    lines = campaign_lines(campaign_figures(rec, spec, now=9e9), state="SUCCEEDED")
    assert f"node-hours {usage.node_hours:.3f} of 2" in "\n".join(lines)
