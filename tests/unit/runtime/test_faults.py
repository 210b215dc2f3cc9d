"""Scheduled fault injection parsing and timing (pure)."""

from __future__ import annotations

import pytest

from hpcrun.errors import SpecError
from hpcrun.runtime.faults import FaultKind, due, parse_injections


def test_parse_several_faults() -> None:
    inj = parse_injections("crash@step=5,rank=1; preempt@step=9 ;slow@step=2,rank=3,seconds=0.5")
    assert [(i.kind, i.step, i.rank) for i in inj] == [
        (FaultKind.CRASH, 5, 1), (FaultKind.PREEMPT, 9, 0), (FaultKind.SLOW, 2, 3)]
    assert inj[2].seconds == 0.5


@pytest.mark.parametrize("bad", ["explode@step=1", "crash@step=x", "crash@step"])
def test_malformed_injection_names_the_part_and_the_syntax(bad: str) -> None:
    with pytest.raises(SpecError, match="KIND@step=N"):
        parse_injections(bad)


def test_fires_only_at_its_step_rank_and_first_incarnation() -> None:
    inj = parse_injections("crash@step=5,rank=1")
    assert due(inj, rank=1, step=5, first_incarnation=True) == list(inj)
    assert due(inj, rank=0, step=5, first_incarnation=True) == []
    assert due(inj, rank=1, step=6, first_incarnation=True) == []
    assert due(inj, rank=1, step=5, first_incarnation=False) == []


def test_slow_fires_every_step_from_its_start() -> None:
    inj = parse_injections("slow@step=3,rank=0,seconds=0.1,every=1")
    assert [s for s in range(6) if due(inj, rank=0, step=s, first_incarnation=False)] == [3, 4, 5]


@pytest.mark.parametrize(("text", "says"), [("crash@step=2,stage=staging", "on ckptcrash only"),
                                           ("crash@step=-1", ">= 0")])
def test_an_impossible_injection_is_a_spec_error_saying_what_is_expected(text: str,
                                                                        says: str) -> None:
    with pytest.raises(SpecError, match=says):
        parse_injections(text)
