"""The MTBF estimate: the site's prior combined with the run's interruptions across incarnations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.cadence import (
    InterruptionHistory,
    MtbfEstimate,
    interruption_history,
    posterior_mtbf,
)
from hpcrun.control.entries import LogEntry
from hpcrun.errors import ConfigError

DAY = 86400.0


def _entry(kind: str, gen: int, ts: float, **payload: object) -> LogEntry:
    return LogEntry(slot=0, kind=kind, generation=gen, holder="", ts=ts, writer="",
                    payload=payload)


def test_without_observations_the_estimate_is_the_sites_prior() -> None:
    assert posterior_mtbf(DAY, exposure_s=0, interruptions=0) == DAY


def test_one_interruption_in_a_short_run_does_not_make_m_the_run_length() -> None:
    """The old report used M = allocated / interruptions: 9 s for one preemption in 9 s."""
    m = posterior_mtbf(DAY, exposure_s=9.0, interruptions=1)
    assert m == pytest.approx((DAY + 9.0) / 2)  # the prior is worth one interruption
    assert m > 10 * 3600


def test_a_long_history_outweighs_the_prior() -> None:
    # 100 interruptions in 100 days of a site that claims one a day in 10 days of prior...
    m = posterior_mtbf(10 * DAY, exposure_s=100 * 3600.0, interruptions=100)
    assert m == pytest.approx((10 * DAY + 100 * 3600.0) / 101)
    assert abs(m - 3600.0) < abs(10 * DAY - 3600.0) / 50  # ...lands near the observed hour


@settings(max_examples=200, deadline=None)
@given(prior=st.floats(1.0, 1e7), exposure=st.floats(0.0, 1e8), n=st.integers(0, 10_000))
def test_the_estimate_lies_between_prior_and_observed_rate(prior: float, exposure: float,
                                                           n: int) -> None:
    m = posterior_mtbf(prior, exposure_s=exposure, interruptions=n)
    lo, hi = sorted([prior, exposure / n if n else prior])
    if n == 0:
        assert m >= prior  # no interruption only ever lengthens M
    else:
        assert lo * (1 - 1e-9) <= m <= hi * (1 + 1e-9)


def test_more_interruptions_in_the_same_time_shorten_m() -> None:
    ms = [posterior_mtbf(DAY, exposure_s=DAY, interruptions=n) for n in range(5)]
    assert ms == sorted(ms, reverse=True)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ConfigError):
        posterior_mtbf(0.0, exposure_s=1, interruptions=0)
    with pytest.raises(ConfigError):
        InterruptionHistory(interruptions=-1)


def test_history_counts_interruptions_and_allocated_time_of_every_incarnation() -> None:
    entries = [
        _entry("note", -1, 0.0, event="created"),
        _entry("fence", 1, 10.0),
        _entry("state", 1, 12.0, state="STARTING"),
        _entry("progress", 1, 50.0, step=10),
        _entry("fault", 1, 60.0, fault="preemption"),
        _entry("state", 1, 61.0, state="REQUEUED"),
        _entry("fence", 2, 500.0),  # queue wait between 61 and 500 is not exposure
        _entry("state", 2, 501.0, state="STARTING"),
        _entry("fault", 2, 530.0, fault="process_crash"),
        _entry("fault", 2, 540.0, fault="user_error"),  # the program's own error: not counted
        _entry("fault", 2, 541.0, fault="timeout"),  # the time limit is scheduled: not counted
        _entry("state", 2, 600.0, state="SUCCEEDED"),
        _entry("fault", -1, 700.0, fault="node_failure"),  # recorded by the login node
    ]
    h = interruption_history(entries)
    assert h.interruptions == 3
    assert h.exposure_s == pytest.approx((61.0 - 10.0) + (600.0 - 500.0))


def test_estimate_names_its_inputs() -> None:
    est = MtbfEstimate(prior_s=DAY, history=InterruptionHistory(interruptions=1,
                                                                exposure_s=9.0))
    assert est.mtbf_s == posterior_mtbf(DAY, exposure_s=9.0, interruptions=1)
    assert est.describe().startswith("M = 12h 0m: site prior 24h 0m")
    assert "1 interruption(s) in 9s allocated" in est.describe()
