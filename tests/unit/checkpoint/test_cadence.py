"""Young/Daly intervals, expected waste, RPO cap, and the runtime timer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.cadence import (
    CadenceKind,
    CadencePolicy,
    CadenceTimer,
    choose_interval,
    daly_interval,
    expected_waste,
    format_duration,
    parse_duration,
    posterior_mtbf,
    young_interval,
)
from hpcrun.errors import ConfigError
from hpcrun.testing.fakes import FakeClock


def test_textbook_example_30s_cost_6h_mtbf_is_about_19_minutes() -> None:
    assert young_interval(30, 6 * 3600) == pytest.approx(math.sqrt(2 * 30 * 21600))
    assert round(young_interval(30, 21600)) == 1138
    plan = choose_interval(cost_s=30, mtbf_s=21600, restore_s=180)
    assert plan.daly_s == pytest.approx(1118.5, abs=0.1)
    assert 18 * 60 < plan.interval_s < 20 * 60
    assert not plan.limited_by_rpo
    assert plan.waste == pytest.approx(30 / plan.interval_s + plan.interval_s / 43200
                                       + 180 / 21600)


def test_daly_is_m_when_the_checkpoint_costs_more_than_two_mtbf() -> None:
    assert daly_interval(100.0, 40.0) == 40.0


def test_rpo_caps_the_interval() -> None:
    plan = choose_interval(cost_s=30, mtbf_s=21600, rpo_s=600)
    assert plan.interval_s == 600 and plan.limited_by_rpo
    assert plan.waste == pytest.approx(expected_waste(600, cost_s=30, mtbf_s=21600))


@settings(max_examples=100, deadline=None)
@given(st.floats(1, 600), st.floats(3600, 1e6))
def test_young_minimises_first_order_waste(c: float, m: float) -> None:
    t = young_interval(c, m)
    w = expected_waste(t, cost_s=c, mtbf_s=m)
    assert w <= expected_waste(t * 1.1, cost_s=c, mtbf_s=m) + 1e-12
    assert w <= expected_waste(t / 1.1, cost_s=c, mtbf_s=m) + 1e-12


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("6h", 21600),
                                               ("90", 90), (45, 45), ("1.5h", 5400),
                                               ("250ms", 0.25), ("1d", 86400)])
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_says_what_is_accepted() -> None:
    with pytest.raises(ConfigError, match="30s, 5m, 6h"):
        parse_duration("soon")
    with pytest.raises(ConfigError):
        young_interval(0, 100)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (45, 1138, 21600)] == ["45s", "18m 58s", "6h 0m"]


def test_every_steps_timer() -> None:
    timer = CadenceTimer(CadencePolicy(kind=CadenceKind.EVERY_STEPS, every_steps=10),
                         FakeClock())
    assert [s for s in range(1, 31) if timer.due(s) and (timer.saved(s, cost_s=1.0) or True)] \
        == [10, 20, 30]


def test_every_seconds_timer_and_rpo_cap() -> None:
    clock = FakeClock()
    timer = CadenceTimer(CadencePolicy(kind=CadenceKind.EVERY_SECONDS, every_seconds=600,
                                       rpo_s=300), clock)
    clock.advance(299)
    assert not timer.due(1)
    clock.advance(1)
    assert timer.due(2)


def test_young_timer_learns_cost_online() -> None:
    clock = FakeClock()
    policy = CadencePolicy(kind=CadenceKind.YOUNG, prior_mtbf_s=21600, initial_cost_s=30)
    timer = CadenceTimer(policy, clock)
    assert timer.interval_s() == pytest.approx(daly_interval(30, 21600))
    clock.advance(1200)
    timer.saved(100, cost_s=120.0)
    # C = 120 now; M updated with 1200 s of exposure and no interruption.
    assert timer.mtbf_s == pytest.approx(21600 + 1200)
    assert timer.interval_s() == pytest.approx(daly_interval(120, 22800))
    clock.advance(2000)
    assert not timer.due(150)
    clock.advance(300)
    assert timer.due(160)


def test_interruptions_shorten_the_interval() -> None:
    timer = CadenceTimer(CadencePolicy(kind=CadenceKind.YOUNG), FakeClock(), exposure_s=21600)
    before = timer.interval_s()
    timer.interrupted()
    timer.interrupted()
    assert timer.mtbf_s == pytest.approx(posterior_mtbf(21600, exposure_s=21600,
                                                        interruptions=2))
    assert timer.interval_s() < before


def test_timer_accepts_the_specs_checkpoint_policy_and_runtime_calls() -> None:
    spec_policy = SimpleNamespace(cadence="every_steps", every_steps=3, every_seconds=None,
                                  rpo_s=None)
    clock = FakeClock()
    timer = CadenceTimer(spec_policy, clock)
    due = []
    for s in range(1, 8):
        timer.observe_step(s, 0.1)
        if timer.due(s, clock.monotonic()):
            due.append(s)
            timer.observe_save(0.5)
    assert due == [3, 6]
    assert timer.cost_s == 0.5


def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        CadencePolicy(kind=CadenceKind.EVERY_STEPS, every_steps=0)
    with pytest.raises(ConfigError, match="unknown checkpoint cadence"):
        CadenceTimer(SimpleNamespace(cadence="hourly"))
