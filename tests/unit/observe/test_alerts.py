"""Alert rules: thresholds, owners, runbooks, config overrides."""

from __future__ import annotations

import pytest

from hpcrun.errors import ConfigError
from hpcrun.observe.alerts import (
    AlertKind,
    AlertSignals,
    Severity,
    default_rules,
    evaluate_alerts,
    rules_from_config,
)


def test_quiet_run_fires_nothing() -> None:
    signals = AlertSignals(no_progress_s=10.0, worst_straggler_score=1.1,
                           input_wait_fraction=0.02, checkpoint_lag_ratio=0.5,
                           fault_signatures={"crash:x": 1}, budget_used_fraction=0.2)
    assert evaluate_alerts(default_rules(), signals) == []


def test_each_signal_fires_its_rule_most_severe_first() -> None:
    signals = AlertSignals(no_progress_s=1000.0, worst_straggler_score=2.0,
                           input_wait_fraction=0.3, checkpoint_lag_ratio=1.5,
                           mixture_deviation=0.05, fault_signatures={"oom:rank3": 3, "x": 1},
                           budget_used_fraction=0.95)
    fired = evaluate_alerts(default_rules(), signals)
    assert {a.rule.kind for a in fired} == set(AlertKind)
    assert [a.rule.severity for a in fired][:3] == [Severity.CRITICAL] * 3
    repeated = next(a for a in fired if a.rule.kind == AlertKind.REPEATED_FAULT)
    assert (repeated.value, repeated.subject) == (3.0, "oom:rank3")
    assert "owner user" in repeated.message and "fix the cause" in repeated.message


def test_unmeasured_signals_never_fire() -> None:
    assert evaluate_alerts(default_rules(), AlertSignals()) == []


def test_config_overrides_threshold_and_severity() -> None:
    rules = rules_from_config({"input_wait": {"threshold": 0.5, "severity": "critical"}})
    rule = next(r for r in rules if r.kind == AlertKind.INPUT_WAIT)
    assert (rule.threshold, rule.severity, rule.owner) == (0.5, Severity.CRITICAL, "user")
    assert evaluate_alerts(rules, AlertSignals(input_wait_fraction=0.3)) == []


def test_bad_config_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown alert 'loss'"):
        rules_from_config({"loss": {"threshold": 1}})
    with pytest.raises(ConfigError, match="severity"):
        rules_from_config({"input_wait": {"severity": "loud"}})
    with pytest.raises(ConfigError, match="keys"):
        rules_from_config({"input_wait": {"thresh": 1}})


def test_the_input_wait_alert_fires_while_running_and_never_on_a_finished_run() -> None:
    from hpcrun.observe.status import RecordFacts, build_status
    from tests.unit.observe.builders import step

    starved = [step(k, k, k + 1.0, input_wait_s=0.9) for k in range(1, 30)]

    def alerts(state: str) -> tuple[str, ...]:
        view = build_status(RecordFacts(run_id="r", state=state), events=starved,
                            heartbeats={}, tails=[], now=31.0)
        return tuple(a for a in view.alerts if "input" in a.lower())

    assert alerts("RUNNING")
    assert alerts("SUCCEEDED") == () and alerts("FAILED") == ()
