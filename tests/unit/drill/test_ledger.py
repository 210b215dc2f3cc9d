"""The sample ledger's data contracts (pure)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.drill.ledger import LedgerLine, check_ledger, effective, parse_ledger


def _line(step: int, gen: int = 1, *, batch: int | None = None, shift: int = 0) -> LedgerLine:
    b = step if batch is None else batch
    return LedgerLine(step=step, batch=b, generation=gen,
                      samples=tuple((r, 10 * b + r + shift, 0, 0, 0, 4) for r in range(2)))


def test_uninterrupted_ledger_holds_every_contract() -> None:
    rep = check_ledger([_line(s) for s in range(6)], total_steps=6)
    assert rep.ok and rep.steps == 6 and rep.replayed_steps == ()


def test_replay_after_restore_must_consume_the_same_samples() -> None:
    lines = [_line(s) for s in range(5)] + [_line(3, 2), _line(4, 2), _line(5, 2)]
    assert check_ledger(lines, total_steps=6).ok
    bad = [_line(s) for s in range(5)] + [_line(3, 2, shift=1), _line(4, 2), _line(5, 2)]
    rep = check_ledger(bad, total_steps=6)
    assert rep.replay_mismatches == (3,) and not rep.ok


def test_skipped_step_and_cursor_jump_are_reported() -> None:
    rep = check_ledger([_line(0), _line(1), _line(3)], total_steps=4)
    assert rep.missing_steps == (2,)
    jump = check_ledger([_line(0), _line(1, batch=5)], total_steps=2)
    assert jump.cursor_breaks == (1,)


def test_duplicated_samples_in_the_effective_trajectory() -> None:
    dup = LedgerLine(step=1, batch=1, generation=1, samples=_line(0).samples)
    rep = check_ledger([_line(0), dup], total_steps=2)
    assert rep.duplicated_samples == 2


def test_reference_comparison_names_the_differing_steps() -> None:
    ref = effective([_line(s) for s in range(3)])
    rep = check_ledger([_line(0), _line(1, shift=7), _line(2)], total_steps=3, reference=ref)
    assert rep.reference_mismatches == (1,)


def test_torn_and_malformed_lines_are_counted_not_trusted() -> None:
    good = json.dumps({"step": 0, "batch": 0, "generation": 1,
                       "samples": [[0, 1, 0, 0, 0, 4]]})
    text = "\n".join([good, '{"step": 1, "batch"', json.dumps({"step": -1, "batch": 0,
                      "generation": 1, "samples": []}), '{"step": 2}'])
    lines, bad = parse_ledger(text)
    assert [ln.step for ln in lines] == [0] and bad == 3


@settings(max_examples=50, deadline=None)
@given(total=st.integers(1, 30), cuts=st.lists(st.integers(0, 29), max_size=4))
def test_any_restore_pattern_from_committed_steps_keeps_the_contracts(
        total: int, cuts: list[int]) -> None:
    """Replaying from any earlier step with the same samples never breaks a contract."""
    lines, gen, step = [], 1, 0
    for cut in sorted(c for c in cuts if c < total):
        while step <= cut:
            lines.append(_line(step, gen))
            step += 1
        gen += 1
        step = max(0, cut - 2)  # restore from an older commit: a few steps replayed
    while step < total:
        lines.append(_line(step, gen))
        step += 1
    assert check_ledger(lines, total_steps=total).ok


def test_a_step_whose_update_skip_batch_dropped_is_reported_not_a_fault() -> None:
    first = [_line(s) for s in range(4)]
    again = json.dumps({"step": 2, "batch": 2, "generation": 1, "skipped": True,
                        "samples": [list(seg) for seg in first[2].samples]})
    lines, bad = parse_ledger("\n".join([*(json.dumps({
        "step": ln.step, "batch": ln.batch, "generation": ln.generation,
        "samples": [list(seg) for seg in ln.samples]}) for ln in first), again]))
    report = check_ledger(lines, total_steps=4, malformed=bad)
    assert report.ok and report.skipped_steps == (2,) and "1 skipped" in report.summary()
