"""Contract verdicts over synthetic evidence (pure)."""

from __future__ import annotations

from dataclasses import replace

from hpcrun.control.log import LogEntry
from hpcrun.drill.contracts import CONTRACTS, Evidence, applicable, check_contracts, not_held
from hpcrun.drill.ledger import LedgerLine
from hpcrun.drill.matrix import MATRIX, Recovery, row_for
from hpcrun.protocols import Event


def _e(slot: int, kind: str, gen: int, ts: float, **payload: object) -> LogEntry:
    return LogEntry(slot=slot, kind=kind, generation=gen, holder=f"h{gen}", ts=ts, writer="t",
                    payload=payload)


def _commit(slot: int, gen: int, ts: float, step: int) -> LogEntry:
    return _e(slot, "commit", gen, ts, ckpt_id=f"g{gen:06d}-s{step:010d}-h{gen}", tier="shared",
              step=step, manifest=f"ckpt/g{gen:06d}-s{step:010d}-h{gen}/manifest.json",
              nodes=["n0"], digest="", bytes=1)


def _line(step: int, gen: int) -> LedgerLine:
    return LedgerLine(step=step, batch=step, generation=gen,
                      samples=((0, step, 0, 0, 0, 4),))


def _preempted(*, restored: int = 20, last: int = 20) -> Evidence:
    entries = [
        _e(0, "fence", 1, 100.0), _e(1, "state", 1, 100.1, state="STARTING"),
        _e(2, "state", 1, 105.0, state="RUNNING", restored_step=0),
        _commit(3, 1, 108.0, 10), _commit(4, 1, 111.0, 20),
        _e(5, "state", 1, 112.0, state="PREEMPTED"), _e(6, "fault", 1, 112.1, fault="preemption"),
        _e(7, "state", 1, 112.2, state="REQUEUED"),
        _e(8, "fence", 2, 115.0), _e(9, "state", 2, 115.1, state="STARTING"),
        _e(10, "state", 2, 121.0, state="RUNNING", restored_step=restored),
        _e(11, "state", 2, 130.0, state="SUCCEEDED"),
    ]
    events = [Event(kind="step", ts=109.0, run_id="r", generation=1, step=last, rank=0),
              Event(kind="restore", ts=120.0, run_id="r", generation=2, step=restored, rank=0,
                    data={"start_ts": 119.0})]
    ledger = [_line(s, 1) for s in range(last)] + [_line(s, 2) for s in range(restored, 30)]
    return Evidence(run_id="r", state="SUCCEEDED", entries=entries, events=events,
                    ledger=ledger, total_steps=30, newest_verifies=True)


def _verdicts(ev: Evidence, fault: str, **kw: object) -> dict[str, bool | None]:
    return {c.name: c.ok for c in check_contracts(ev, row_for(fault), **kw)}  # type: ignore[arg-type]


def test_a_clean_preemption_holds_every_contract() -> None:
    got = _verdicts(_preempted(), "preempt-signal")
    assert list(got) == list(CONTRACTS)
    assert {k for k, v in got.items() if v is True} == applicable(row_for("preempt-signal"))
    assert got["straggler"] is None
    results = check_contracts(_preempted(), row_for("preempt-signal"))
    assert not_held(results, row_for("preempt-signal")) == []


def test_a_contract_without_evidence_fails_closed() -> None:
    row = row_for("preempt-signal")
    bare = Evidence(run_id="r", state="SUCCEEDED", total_steps=30)  # no log, no ledger, no commit
    results = check_contracts(bare, row)
    got = {c.name: c for c in results}
    for name in ("state", "rpo", "rto", "samples", "cursor", "checkpoints", "recovery"):
        assert got[name].ok is False and "no" in got[name].detail, (name, got[name])
    assert "no evidence" in got["samples"].detail and "config.ledger" in got["samples"].detail
    broken = {line.split(":")[0] for line in not_held(results, row)}
    assert broken >= {"state", "rpo", "rto", "samples", "cursor", "checkpoints"}
    assert {ln.split(":")[0] for ln in not_held((), row)} == applicable(row)  # nothing checked


def test_n_a_only_where_the_row_says_why() -> None:
    for row in MATRIX:
        for c in check_contracts(_preempted(), row):
            if c.ok is None:
                assert c.name not in applicable(row) and c.detail.startswith("n/a: "), (row, c)
    cancel = next(r for r in MATRIX if r.recovery is Recovery.NONE)
    assert not {"state", "rpo", "rto"} & applicable(cancel)


def test_restoring_an_older_checkpoint_than_the_newest_breaks_state_and_rpo() -> None:
    got = _verdicts(_preempted(restored=10), "preempt-signal")
    assert got["state"] is False and got["rpo"] is False
    assert got["samples"] is True  # a replay of the same samples is not a data error


def test_wrong_exit_missing_recovery_and_torn_checkpoint_fail() -> None:
    ev = replace(_preempted(), state="FAILED", reason="boom", newest_verifies=False,
                 newest_detail="torn")
    got = _verdicts(ev, "preempt-signal")
    assert got["exit"] is False and got["checkpoints"] is False
    assert _verdicts(_preempted(), "rank-kill")["recovery"] is False  # requeued, not restarted


def test_skipped_samples_and_rto_budget() -> None:
    ev = _preempted()
    holes = replace(ev, ledger=[ln for ln in ev.ledger or [] if ln.step != 25])
    assert _verdicts(holes, "preempt-signal")["samples"] is False
    assert _verdicts(ev, "preempt-signal", rto_budget_s=5.0)["rto"] is False
    assert _verdicts(ev, "preempt-signal", rto_budget_s=60.0)["rto"] is True


def test_void_entries_are_counted_not_trusted() -> None:
    ev = _preempted()
    stale = _e(99, "progress", 1, 125.0, step=999)  # generation 1 writing after fence 2
    got = check_contracts(replace(ev, entries=[*ev.entries, stale]), row_for("preempt-signal"))
    fencing = next(c for c in got if c.name == "fencing")
    assert fencing.ok is True and "1 void entry" in fencing.detail


def test_a_row_that_ends_the_run_holds_checkpoints_without_a_commit_a_recovering_one_not() -> None:
    ended = Evidence(run_id="r", state="CANCELLED", total_steps=30)  # no tier-1 commit
    got = {c.name: c for c in check_contracts(ended, row_for("cancel-during-checkpoint"))}
    assert got["checkpoints"].ok is True and "none was published torn" in got["checkpoints"].detail
    torn = replace(ended, newest_verifies=False, newest_detail="shard missing")
    got = {c.name: c for c in check_contracts(torn, row_for("cancel-during-checkpoint"))}
    assert got["checkpoints"].ok is False
    got = {c.name: c for c in check_contracts(ended, row_for("rank-kill"))}
    assert got["checkpoints"].ok is False and "no evidence" in got["checkpoints"].detail


def test_the_hang_row_holds_its_cause_only_when_the_injected_rank_is_named() -> None:
    row = row_for("hang")
    base = _preempted()

    def cause(*faults: dict[str, object], victim: int | None = 3) -> tuple[bool | None, str]:
        extra = [_e(20 + i, "fault", 1, 112.1, **f) for i, f in enumerate(faults)]
        ev = replace(base, entries=[*base.entries, *extra], victim_rank=victim)
        got = next(r for r in check_contracts(ev, row) if r.name == "cause")
        return got.ok, got.detail

    named = {"fault": "hang", "node": "n1", "rank": 3, "culprit_ranks": [3],
             "culprit_nodes": ["n1"]}
    assert cause(named)[0] is True
    ok, detail = cause({"fault": "hang", "node": "n0", "rank": 0})
    assert ok is False and "culprit not named" in detail and "named none" in detail
    ok, detail = cause({**named, "rank": 2, "culprit_ranks": [2]})
    assert ok is False and "rank 3 injected, named 2" in detail
    assert cause(named, victim=None)[0] is False


def _stalled(*extra: LogEntry, injected: bool = True) -> Evidence:
    entries = [
        _e(0, "fence", 1, 100.0), _e(1, "state", 1, 100.1, state="STARTING"),
        _e(2, "state", 1, 105.0, state="RUNNING", restored_step=0), _commit(3, 1, 108.0, 10),
        *([_e(4, "note", 1, 109.0, event="fault_injected", fault="shared-fs-stall",
              node="n0", step=15)] if injected else []),
        _commit(5, 1, 121.0, 20),
        _e(6, "fault", 1, 121.5, fault="storage_timeout", node="n0", background=True,
           signature="storage:stall", detail="shared filesystem stalled"),
        *extra, _e(20, "state", 1, 130.0, state="SUCCEEDED"),
    ]
    return Evidence(run_id="r", state="SUCCEEDED", entries=entries,
                    ledger=[_line(s, 1) for s in range(20)], total_steps=20,
                    newest_verifies=True)


def test_a_shared_fs_stall_holds_when_no_node_is_lost_and_commits_go_on() -> None:
    got = _verdicts(_stalled(), "shared-fs-stall")
    assert got["stall"] is True and not not_held(
        check_contracts(_stalled(), row_for("shared-fs-stall")), row_for("shared-fs-stall"))
    assert _verdicts(_preempted(), "preempt-signal")["stall"] is None


def test_a_shared_fs_stall_that_quarantined_a_node_or_was_not_seen_fails() -> None:
    lost = _stalled(_e(7, "fault", 1, 122.0, fault="node_failure", node="n1"),
                    _e(8, "quarantine", 1, 122.1, node="n1"))
    assert _verdicts(lost, "shared-fs-stall")["stall"] is False
    assert _verdicts(_stalled(injected=False), "shared-fs-stall")["stall"] is False
    silent = replace(_stalled(), entries=[e for e in _stalled().entries
                                         if e.payload.get("signature") != "storage:stall"])
    assert _verdicts(silent, "shared-fs-stall")["stall"] is False, "the stall went unreported"
