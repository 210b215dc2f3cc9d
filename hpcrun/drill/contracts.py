"""The recovery contracts, checked over what a run left behind (pure).

Inputs are values: the run log's entries, the ranks' events, the sample ledger and a few facts
the effectful shell measured (does the newest committed checkpoint verify). Output is one
:class:`ContractResult` per contract, each with a one-line detail for the drill's table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcrun.control.notes import NoteEvent
from hpcrun.drill.ledger import LedgerLine, check_ledger
from hpcrun.drill.matrix import DrillFault, MatrixRow, Recovery
from hpcrun.drill.rto import RtoSplit, rto_splits
from hpcrun.vocab import FaultClass

CONTRACTS = ("exit", "cause", "recovery", "state", "rpo", "rto", "samples", "cursor", "fencing",
             "checkpoints", "straggler", "stall", "stale")
"""Contract names, in table order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ContractResult:
    """One contract's verdict."""

    name: str
    """Contract name (one of :data:`CONTRACTS`)."""
    ok: bool | None
    """True held, False broken or without evidence, None not applicable to the row (the
    detail says why: :func:`applicable` names the contracts each row is held to)."""
    detail: str
    """One line: what was measured."""

    @property
    def mark(self) -> str:
        return {True: "ok", False: "FAIL", None: "n/a"}[self.ok]


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """What a drilled run left behind, as values."""

    run_id: str
    """Run id."""
    state: str
    """Terminal (or last) run state."""
    reason: str = ""
    """Reason of the last state change."""
    entries: Sequence[Any] = ()
    """Run log entries in slot order."""
    events: Sequence[Any] = ()
    """Rank events."""
    ledger: Sequence[LedgerLine] | None = None
    """Sample ledger lines (None when the run kept none)."""
    ledger_malformed: int = 0
    """Unparseable ledger lines."""
    total_steps: int | None = None
    """Steps the run was configured to complete."""
    newest_verifies: bool | None = None
    """Whether the newest committed checkpoint verifies (None: none committed)."""
    newest_detail: str = ""
    """Why it does not."""
    victim_rank: int | None = None
    """Rank the fault was injected into."""
    anomalies: Sequence[str] = field(default_factory=tuple)
    """Record fold anomalies."""


def applicable(row: MatrixRow) -> frozenset[str]:
    """The contracts ``row`` is held to (pure); every other one is ``n/a`` for it.

    A contract that applies and finds no evidence (no recovery to measure, no ledger, no
    committed checkpoint) is broken, never ``n/a``: a drill that could not look did not pass.
    """
    skip = set()
    if row.expect_cause is None:
        skip.add("cause")
    if row.recovery is Recovery.NONE:
        skip |= {"state", "rpo", "rto"}
    if not row.ledger:
        skip |= {"samples", "cursor"}
    if row.fault != DrillFault.STRAGGLER:
        skip.add("straggler")
    if row.fault != DrillFault.SHARED_FS_STALL:
        skip.add("stall")
    if row.fault != DrillFault.STALE_WORKER:
        skip.add("stale")
    return frozenset(CONTRACTS) - skip


def not_held(results: Sequence[ContractResult], row: MatrixRow) -> list[str]:
    """``name: detail`` of every contract ``row`` is held to that did not hold (pure): broken,
    without evidence, or missing from ``results``."""
    got = {r.name: r for r in results}
    return [f"{n}: {got[n].detail if n in got else 'not checked'}" for n in CONTRACTS
            if n in applicable(row) and (n not in got or got[n].ok is not True)]


def _no_recovery(name: str, row: MatrixRow) -> ContractResult:
    if row.recovery is Recovery.NONE:
        return ContractResult(name=name, ok=None, detail=f"n/a: {row.fault} must not recover")
    return ContractResult(name=name, ok=False, detail="no evidence: no generation resumed "
                          "validated progress (no recovery to measure)")


def _kind(e: Any) -> str:
    return str(getattr(e, "kind", ""))


def _payload(e: Any) -> Mapping[str, Any]:
    p = getattr(e, "payload", {})
    return p if isinstance(p, Mapping) else {}


def check_contracts(ev: Evidence, row: MatrixRow, *, rto_budget_s: float | None = None,
                    ) -> list[ContractResult]:
    """Every contract for ``row`` over ``ev`` (pure)."""
    from hpcrun.control.fencing import fold_fences

    _, valid = fold_fences(ev.entries)
    splits = rto_splits(valid, ev.events)
    return [
        _exit(ev, row), _cause(ev, row), _recovery(valid, row, splits),
        _state(valid, splits, row), _rpo(splits, row), _rto(splits, row, rto_budget_s),
        *_data(ev, row, splits), _fencing(ev, valid), _checkpoints(ev, row),
        _straggler(ev, row), _stall(valid, row), _stale(ev, valid, row),
    ]


def _exit(ev: Evidence, row: MatrixRow) -> ContractResult:
    ok = ev.state == row.expect_state
    why = f": {ev.reason}" if ev.reason and ev.state == "FAILED" else ""
    return ContractResult(name="exit", ok=ok, detail=f"{ev.state} (expected "
                          f"{row.expect_state}){why}"[:160])


def _cause(ev: Evidence, row: MatrixRow) -> ContractResult:
    seen = [str(_payload(e).get("fault")) for e in ev.entries if _kind(e) == "fault"]
    # a preemption or time-limit stop that committed progress is logged as a segment, not a
    # fault: it is still the preemption the row caused
    seen += [FaultClass.PREEMPTION.value for e in ev.entries
             if _kind(e) == "note" and _payload(e).get("event") == NoteEvent.SEGMENT]
    if row.expect_cause is None:
        return ContractResult(name="cause", ok=None, detail=f"n/a: {row.fault} expects no fault "
                              f"class (seen: {', '.join(sorted(set(seen))) or 'none'})")
    ok = row.expect_cause in seen
    result = ContractResult(name="cause", ok=ok, detail=f"{row.expect_cause} "
                            f"{'recorded' if ok else 'not recorded'} (faults: "
                            f"{', '.join(sorted(set(seen))) or 'none'})")
    return _culprit(ev, result) if ok and row.names_culprit else result


def _culprit(ev: Evidence, cause: ContractResult) -> ContractResult:
    """The cause holds only when a fault names the injected rank as the one that did not
    arrive (and no other rank)."""
    named = sorted({tuple(_payload(e).get("culprit_ranks") or ()) for e in ev.entries
                    if _kind(e) == "fault" and _payload(e).get("culprit_ranks")})
    ok = ev.victim_rank is not None and (ev.victim_rank,) in named
    shown = ", ".join("/".join(map(str, t)) for t in named) or "none"
    return ContractResult(name="cause", ok=ok, detail=f"{cause.detail}; culprit "
                          f"{'named' if ok else 'not named'}: rank {ev.victim_rank} injected, "
                          f"named {shown}")


def recoveries(valid: Sequence[Any]) -> tuple[int, int]:
    """(in-allocation restarts, requeues) from the valid log entries."""
    states = [_payload(e).get("state") for e in valid if _kind(e) == "state"]
    requeues, starts = states.count("REQUEUED"), states.count("STARTING")
    return max(0, starts - 1 - requeues), requeues


def _recovery(valid: Sequence[Any], row: MatrixRow, splits: Sequence[RtoSplit]
              ) -> ContractResult:
    restarts, requeues = recoveries(valid)
    detail = f"{restarts} restart(s), {requeues} requeue(s)"
    wanted = {Recovery.RESTART: restarts >= 1 and requeues == 0,
              Recovery.REQUEUE: requeues >= 1,
              Recovery.EITHER: restarts + requeues >= 1,
              Recovery.NONE: True}
    ok = wanted[row.recovery]
    if row.recovery is not Recovery.NONE and not splits:
        ok, detail = False, detail + "; no generation resumed validated progress"
    return ContractResult(name="recovery", ok=ok, detail=f"{detail} (expected {row.recovery})")


def _state(valid: Sequence[Any], splits: Sequence[RtoSplit], row: MatrixRow) -> ContractResult:
    """Each recovery restored the newest checkpoint committed before its fence (after an
    ``sdc`` fault: the newest known-good one)."""
    from hpcrun.checkpoint.retention import restorable

    if not splits or row.recovery is Recovery.NONE:
        return _no_recovery("state", row)
    bad = []
    for s in splits:
        fence = next(e for e in valid if _kind(e) == "fence" and e.generation == s.to_generation)
        # A checkpoint the restore proved unreadable (its node's tier 0 died with the node) is
        # skipped, with an incident naming it: the newest of the rest is the restore point.
        skipped = {c for e in valid if e.generation == s.to_generation and _kind(e) == "note"
                   for c in _payload(e).get("skipped") or ()}
        skipped |= {str(_payload(e).get("ckpt_id")) for e in valid
                    if e.generation == s.to_generation and _kind(e) == "fault"
                    and _payload(e).get("signature") == "ckpt:verify"}
        committed = [c for c in restorable([e for e in valid if e.slot < fence.slot])
                     if c.ckpt_id not in skipped]
        newest = committed[-1].step if committed else 0
        if newest != s.restored_step:
            bad.append(f"g{s.to_generation} restored step {s.restored_step}, newest committed "
                       f"{newest}")
    steps = ", ".join(str(s.restored_step) for s in splits)
    return ContractResult(name="state", ok=not bad, detail="; ".join(bad) if bad else
                          f"newest committed restored each time (steps {steps}; after an sdc "
                          "fault: the newest known-good)")


def _rpo(splits: Sequence[RtoSplit], row: MatrixRow) -> ContractResult:
    if not splits or row.recovery is Recovery.NONE:
        return _no_recovery("rpo", row)
    lost = [s.steps_lost for s in splits]
    ok = not row.graceful or max(lost) == 0
    return ContractResult(name="rpo", ok=ok, detail=f"{max(lost)} step(s) lost"
                          + (" (announced stop: must be 0)" if row.graceful else ""))


def _rto(splits: Sequence[RtoSplit], row: MatrixRow, budget: float | None) -> ContractResult:
    if not splits or row.recovery is Recovery.NONE:
        return _no_recovery("rto", row)
    worst = max(splits, key=lambda s: s.total_s)
    ok = budget is None or worst.total_s <= budget
    limit = f" (budget {budget:.0f} s)" if budget is not None else ""
    return ContractResult(name="rto", ok=ok, detail=f"{worst.total_s:.1f} s{limit}: {worst.row()}")


def _data(ev: Evidence, row: MatrixRow, splits: Sequence[RtoSplit]) -> list[ContractResult]:
    if not row.ledger:
        why = f"n/a: {row.fault} does not hold the run to its sample ledger"
        return [ContractResult(name="samples", ok=None, detail=why),
                ContractResult(name="cursor", ok=None, detail=why)]
    if ev.ledger is None:
        why = "no evidence: the run kept no sample ledger (set config.ledger: true)"
        return [ContractResult(name="samples", ok=False, detail=why),
                ContractResult(name="cursor", ok=False, detail=why)]
    rep = check_ledger(ev.ledger, total_steps=ev.total_steps or 0, malformed=ev.ledger_malformed)
    samples_ok = not (rep.missing_steps or rep.duplicated_samples or rep.replay_mismatches)
    first: dict[int, int] = {}
    for line in ev.ledger:
        first.setdefault(line.generation, line.step)
    resumed = [f"g{s.to_generation}" for s in splits
               if first.get(s.to_generation, s.restored_step) != s.restored_step]
    cursor_ok = not rep.cursor_breaks and not resumed
    cursor = (f"resumed at the restored step each time, {len(rep.cursor_breaks)} breaks"
              if cursor_ok else f"breaks at {list(rep.cursor_breaks)[:5]}, "
              f"resumed elsewhere in {resumed}")
    return [ContractResult(name="samples", ok=samples_ok, detail=rep.summary()),
            ContractResult(name="cursor", ok=cursor_ok, detail=cursor)]


def _fencing(ev: Evidence, valid: Sequence[Any]) -> ContractResult:
    void = len(ev.entries) - len(valid)
    gens = [e.generation for e in valid if _kind(e) == "fence"]
    ordered = gens == sorted(set(gens))
    ok = ordered and not ev.anomalies
    detail = f"{len(gens)} generation(s), {void} void entr{'y' if void == 1 else 'ies'}"
    if ev.anomalies:
        detail += f"; anomalies: {ev.anomalies[0]}"
    return ContractResult(name="fencing", ok=ok, detail=detail)


def _checkpoints(ev: Evidence, row: MatrixRow) -> ContractResult:
    """The newest tier-1 commit verifies. A run whose row ends it before any recovery (a data
    change, a cancel mid-checkpoint) may end with none: the log then shows that no commit, torn
    or whole, was published, which is what the contract guards; a run that recovers must have
    one."""
    if ev.newest_verifies is None:
        if row.recovery is Recovery.NONE:
            return ContractResult(name="checkpoints", ok=True,
                                  detail=f"no commit on tier 1: {row.fault} ended the run before "
                                  "one, and none was published torn")
        return ContractResult(name="checkpoints", ok=False,
                              detail="no evidence: no checkpoint committed on tier 1")
    return ContractResult(name="checkpoints", ok=ev.newest_verifies,
                          detail="newest tier-1 commit verifies" if ev.newest_verifies
                          else f"newest committed is torn: {ev.newest_detail}"[:160])


def _straggler(ev: Evidence, row: MatrixRow) -> ContractResult:
    if row.fault != DrillFault.STRAGGLER:
        return ContractResult(name="straggler", ok=None, detail=f"n/a: {row.fault} slows no rank")
    from hpcrun.observe.stragglers import find_stragglers, step_times_from_events

    times, nodes = step_times_from_events(ev.events)
    found = find_stragglers(times, 1.5, 5, nodes=nodes)
    ranks = [s.rank for s in found]
    ok = ev.victim_rank in ranks
    return ContractResult(name="straggler", ok=ok, detail=f"reported ranks {ranks} "
                          f"(slowed rank {ev.victim_rank})")


def _stall(valid: Sequence[Any], row: MatrixRow) -> ContractResult:
    """A whole-tier stall: no node lost or quarantined, no restart, a commit after the stall
    (training went on), and the stall reported (a background ``storage:stall`` fault)."""
    if row.fault != DrillFault.SHARED_FS_STALL:
        return ContractResult(name="stall", ok=None, detail=f"n/a: {row.fault} stalls no tier")
    at = [int(_payload(e).get("step", -1)) for e in valid if _kind(e) == "note"
          and _payload(e).get("event") == NoteEvent.FAULT_INJECTED
          and _payload(e).get("fault") == row.fault]
    if not at:
        return ContractResult(name="stall", ok=False, detail="no evidence: no fault_injected "
                              "note: the stall never started")
    lost = sorted({str(_payload(e).get("node")) for e in valid if _kind(e) == "quarantine"}
                  | {str(_payload(e).get("node")) for e in valid if _kind(e) == "fault"
                     and _payload(e).get("fault") == FaultClass.NODE_FAILURE})
    restarts, requeues = recoveries(valid)
    after = [int(_payload(e).get("step", -1)) for e in valid if _kind(e) == "commit"]
    after = [s for s in after if s > at[0]]
    reported = any(_kind(e) == "fault" and _payload(e).get("signature") == "storage:stall"
                   for e in valid)
    ok = not lost and restarts == requeues == 0 and bool(after) and reported
    return ContractResult(name="stall", ok=ok, detail=(
        f"stalled at step {at[0]}: nodes lost {lost or 'none'}, {restarts} restart(s), "
        f"{requeues} requeue(s), {len(after)} commit(s) after it, stall "
        f"{'reported' if reported else 'NOT reported'}"))


def after_newer_fence(entries: Sequence[Any]) -> list[Any]:
    """The entries written by a fenced-out generation after a newer fence (pure): a stale
    worker's writes. ``entries`` in slot order; fence entries and unfenced observations are
    none of them."""
    from hpcrun.control.fencing import NO_FENCE, UNFENCED, apply_entry

    current, stale = NO_FENCE, []
    for e in entries:
        current, _ = apply_entry(current, e)
        if _kind(e) != "fence" and e.generation != UNFENCED and e.generation < current.generation:
            stale.append(e)
    return stale


def _stale(ev: Evidence, valid: Sequence[Any], row: MatrixRow) -> ContractResult:
    """A stale worker's write after a newer fence is void in the log and never counted: no
    such entry among the valid ones, and no drain it claims in the checkpoint fold unless a
    valid entry made the same claim. No such write at all is no evidence, not a pass."""
    if row.fault != DrillFault.STALE_WORKER:
        return ContractResult(name="stale", ok=None, detail=f"n/a: {row.fault} fences out no "
                              "live worker")
    from hpcrun.checkpoint.tiers import fold_checkpoints

    stale = after_newer_fence(ev.entries)
    if not stale:
        return ContractResult(name="stale", ok=False, detail="no evidence: no entry of a "
                              "fenced-out generation after a newer fence")
    slots = {e.slot for e in valid}
    counted = [e.slot for e in stale if e.slot in slots]
    claimed = {(str(_payload(e).get("ckpt_id")), str(_payload(e).get("node"))) for e in valid
               if _kind(e) == "drained"}
    drained = {(c.ckpt_id, n) for c in fold_checkpoints(ev.entries) for n in c.drained}
    counted += [e.slot for e in stale if _kind(e) == "drained" and (
        str(_payload(e).get("ckpt_id")), str(_payload(e).get("node"))) in drained - claimed]
    kinds = ", ".join(sorted({_kind(e) for e in stale}))
    detail = (f"{len(stale)} entr{'y' if len(stale) == 1 else 'ies'} of a fenced-out generation "
              f"after a newer fence ({kinds}): ")
    return ContractResult(name="stale", ok=not counted, detail=detail + (
        "every one void, none counted" if not counted else f"counted at slots {counted[:5]}"))
