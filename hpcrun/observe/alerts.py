"""Alert rules and their evaluation (pure).

A rule names its owner, its threshold (or invariant), its severity and the runbook action an
operator takes. Rules come from the spec or the site config (:func:`rules_from_config`) on top of
:func:`default_rules`; ``hpcrun status`` and the supervisor evaluate them against
:class:`AlertSignals` measured from the record and the event log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from hpcrun.errors import ConfigError


class AlertKind(StrEnum):
    """What a rule watches."""

    NO_PROGRESS = "no_progress"              # seconds since the last completed step
    RANK_TAIL = "rank_tail"                  # worst straggler score (rank median / gang median)
    INPUT_WAIT = "input_wait"                # fraction of step time spent waiting for data
    CHECKPOINT_LAG = "checkpoint_lag"        # last committed checkpoint age / RPO
    MIXTURE_DEVIATION = "mixture_deviation"  # largest |realized - target| share of a source
    REPEATED_FAULT = "repeated_fault"        # occurrences of the most frequent fault signature
    BUDGET_BURN = "budget_burn"              # fraction of the node-hour budget used


class Severity(StrEnum):
    """How urgent."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertRule:
    """One alert rule."""

    kind: AlertKind
    """Signal watched."""
    threshold: float
    """Fires when the signal is strictly above this."""
    severity: Severity
    """Urgency when it fires."""
    owner: str
    """Who acts (``user``, ``site``, ``hpcrun``)."""
    runbook: str
    """What to do when it fires, one line."""

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ConfigError(f"alert {self.kind} threshold must be >= 0, got {self.threshold}")
        if not self.owner or not self.runbook:
            raise ConfigError(f"alert {self.kind} needs an owner and a runbook action")


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertSignals:
    """Measured values the rules compare against (None: not measurable yet, never fires)."""

    no_progress_s: float | None = None
    """Seconds since the last completed step (only meaningful while RUNNING)."""
    worst_straggler_score: float | None = None
    """Highest straggler score in the current window."""
    input_wait_fraction: float | None = None
    """Input wait / step time over recent steps."""
    checkpoint_lag_ratio: float | None = None
    """Age of the newest committed checkpoint / RPO."""
    mixture_deviation: float | None = None
    """Largest absolute deviation of a source's realized share from its target."""
    fault_signatures: Mapping[str, int] = field(default_factory=dict)
    """Occurrences of each fault signature."""
    budget_used_fraction: float | None = None
    """Node-hours used / node-hour budget."""

    def value(self, kind: AlertKind) -> tuple[float | None, str]:
        """The signal for ``kind`` and a subject (which signature) for the message."""
        if kind == AlertKind.REPEATED_FAULT:
            if not self.fault_signatures:
                return None, ""
            sig, n = max(self.fault_signatures.items(), key=lambda kv: (kv[1], kv[0]))
            return float(n), sig
        field_of = {AlertKind.NO_PROGRESS: self.no_progress_s,
                    AlertKind.RANK_TAIL: self.worst_straggler_score,
                    AlertKind.INPUT_WAIT: self.input_wait_fraction,
                    AlertKind.CHECKPOINT_LAG: self.checkpoint_lag_ratio,
                    AlertKind.MIXTURE_DEVIATION: self.mixture_deviation,
                    AlertKind.BUDGET_BURN: self.budget_used_fraction}
        return field_of[kind], ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Alert:
    """A rule that fired."""

    rule: AlertRule
    """The rule."""
    value: float
    """The measured signal."""
    subject: str = ""
    """What it is about (a fault signature), when relevant."""

    @property
    def message(self) -> str:
        about = f" ({self.subject})" if self.subject else ""
        return (f"[{self.rule.severity}] {self.rule.kind}{about}: {self.value:.3g} > "
                f"{self.rule.threshold:.3g}; owner {self.rule.owner}: {self.rule.runbook}")


def default_rules() -> list[AlertRule]:
    """hpcrun's built-in rules (a spec or site config may override thresholds)."""
    r = AlertRule
    return [
        r(kind=AlertKind.NO_PROGRESS, threshold=900.0, severity=Severity.CRITICAL, owner="hpcrun",
          runbook="check `hpcrun logs RUN` and the stacks under diagnostics/; the supervisor "
                  "kills and retries hung gangs"),
        r(kind=AlertKind.RANK_TAIL, threshold=1.5, severity=Severity.WARNING, owner="site",
          runbook="inspect the named node (thermals, ECC, NIC); quarantine it if it repeats"),
        r(kind=AlertKind.INPUT_WAIT, threshold=0.10, severity=Severity.WARNING, owner="user",
          runbook="raise loader workers or prefetch depth, or stage data to node-local storage"),
        r(kind=AlertKind.CHECKPOINT_LAG, threshold=1.0, severity=Severity.CRITICAL, owner="hpcrun",
          runbook="checkpoints are older than the RPO: check drain lag and tier-1 health"),
        r(kind=AlertKind.MIXTURE_DEVIATION, threshold=0.01, severity=Severity.WARNING,
          owner="user", runbook="a source is exhausted or skewed: check its exhaustion policy"),
        r(kind=AlertKind.REPEATED_FAULT, threshold=2.0, severity=Severity.CRITICAL, owner="user",
          runbook="a deterministic fault repeats: fix the cause before more retries"),
        r(kind=AlertKind.BUDGET_BURN, threshold=0.9, severity=Severity.WARNING, owner="user",
          runbook="over 90% of the node-hour budget used: extend the budget or stop the run"),
    ]


_KNOWN_KEYS = {"threshold", "severity", "owner", "runbook"}


def rules_from_config(config: Mapping[str, Any],
                      base: Sequence[AlertRule] | None = None) -> list[AlertRule]:
    """Override ``base`` (default rules) from a mapping ``{kind: {threshold, severity, ...}}``."""
    rules = {r.kind: r for r in (base if base is not None else default_rules())}
    for key, raw in config.items():
        try:
            kind = AlertKind(key)
        except ValueError:
            raise ConfigError(f"unknown alert {key!r}; expected one of "
                              f"{', '.join(k.value for k in AlertKind)}") from None
        if not isinstance(raw, Mapping) or not set(raw) <= _KNOWN_KEYS:
            raise ConfigError(f"alert {key!r} must be a mapping with keys from "
                              f"{sorted(_KNOWN_KEYS)}, got {raw!r}")
        rules[kind] = _apply(rules.get(kind), kind, dict(raw))
    return list(rules.values())


def _apply(rule: AlertRule | None, kind: AlertKind, changes: dict[str, Any]) -> AlertRule:
    try:
        if "threshold" in changes:
            changes["threshold"] = float(changes["threshold"])
        if "severity" in changes:
            changes["severity"] = Severity(changes["severity"])
        return replace(rule, **changes) if rule else AlertRule(kind=kind, **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"alert {kind.value!r} is invalid: {exc}; give threshold (number), "
                          "severity (info|warning|critical), owner and runbook") from None


def evaluate_alerts(rules: Sequence[AlertRule], signals: AlertSignals) -> list[Alert]:
    """The rules whose signal is above threshold, most severe first."""
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    fired = []
    for rule in rules:
        value, subject = signals.value(rule.kind)
        if value is not None and value > rule.threshold:
            fired.append(Alert(rule=rule, value=value, subject=subject))
    return sorted(fired, key=lambda a: (order[a.rule.severity], a.rule.kind))
