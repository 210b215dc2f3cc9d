"""Checkpoint cadence: Young/Daly intervals, expected waste, RPO, and the runtime timer.

With checkpoint cost C (the exposed pause), mean time between interruptions M, restore time R
and downtime D (requeue wait), a run loses per unit time about

    W(T) = C/T + T/(2M) + (R + D)/M

(checkpoint overhead, half an interval of lost work per interruption, and the fixed cost of each
interruption). Young's first-order optimum is T = sqrt(2CM); Daly's higher-order form is
T = sqrt(2CM)·[1 + (1/3)·sqrt(C/(2M)) + (1/9)·(C/(2M))] − C for C < 2M, else M. The chosen
interval is Daly's, capped by the spec's RPO (recovery point objective).

:class:`CadenceTimer` is the runtime side: it answers ``due(step, now)`` for ``every_steps``,
``every_seconds`` or ``young`` cadence, learning C online from completed saves and M from the
site's MTBF prior updated by the interruptions the run has seen across its incarnations
(:func:`posterior_mtbf`, :func:`interruption_history`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    EntryKind,
    FaultPayload,
    LogEntry,
    PayloadError,
    StatePayload,
    decode_as,
)
from hpcrun.errors import ArgumentError, ConfigError
from hpcrun.vocab import CadenceKind, FaultClass, RunState

DEFAULT_MTBF_PRIOR_H = 24.0
"""A site's prior mean time between interruptions, in hours, when its config names none."""

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_S = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``30s``, ``5m``, ``6h``, ``1d``, ``250ms`` or plain seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise ConfigError(f"duration must be >= 0, got {text}")
        return float(text)
    m = _DURATION_RE.match(str(text))
    if not m:
        raise ConfigError(f"cannot read duration {text!r}: expected a number with an optional "
                          "unit ms|s|m|h|d, e.g. 30s, 5m, 6h or 90")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def format_duration(seconds: float) -> str:
    """A short human duration: ``45s``, ``19m 0s``, ``6h 0m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {(s % 3600) // 60}m"


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a finite number > 0 s, got {v}")


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's interval sqrt(2·C·M)."""
    _check_positive(cost_s=cost_s, mtbf_s=mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order interval (M itself when C >= 2M)."""
    _check_positive(cost_s=cost_s, mtbf_s=mtbf_s)
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def expected_waste(interval_s: float, *, cost_s: float, mtbf_s: float, restore_s: float = 0.0,
                   downtime_s: float = 0.0) -> float:
    """Expected fraction of time lost, W(T) = C/T + T/(2M) + (R+D)/M."""
    _check_positive(interval_s=interval_s, mtbf_s=mtbf_s)
    return cost_s / interval_s + interval_s / (2.0 * mtbf_s) + (restore_s + downtime_s) / mtbf_s


@dataclass(frozen=True, kw_only=True, slots=True)
class CadencePlan:
    """The chosen checkpoint interval and why."""

    cost_s: float
    """Checkpoint cost C used."""
    mtbf_s: float
    """Mean time between interruptions M used."""
    young_s: float
    """Young's interval."""
    daly_s: float
    """Daly's interval."""
    interval_s: float
    """The chosen interval: Daly's, capped by the RPO."""
    limited_by_rpo: bool
    """Whether the RPO, not the optimum, set the interval."""
    waste: float
    """Expected waste fraction at the chosen interval."""


def choose_interval(*, cost_s: float, mtbf_s: float, restore_s: float = 0.0,
                    downtime_s: float = 0.0, rpo_s: float | None = None) -> CadencePlan:
    """Plan the interval: Daly's optimum, but never longer than ``rpo_s`` (pure)."""
    young, daly = young_interval(cost_s, mtbf_s), daly_interval(cost_s, mtbf_s)
    if rpo_s is not None:
        _check_positive(rpo_s=rpo_s)
    chosen = min(daly, rpo_s) if rpo_s is not None else daly
    return CadencePlan(
        cost_s=cost_s, mtbf_s=mtbf_s, young_s=young, daly_s=daly, interval_s=chosen,
        limited_by_rpo=rpo_s is not None and rpo_s < daly,
        waste=expected_waste(chosen, cost_s=cost_s, mtbf_s=mtbf_s, restore_s=restore_s,
                             downtime_s=downtime_s))


def waste_table(intervals: Sequence[float], *, cost_s: float, mtbf_s: float,
                restore_s: float = 0.0, downtime_s: float = 0.0) -> list[tuple[float, float]]:
    """(interval, expected waste) rows for a list of candidate intervals, sorted."""
    return [(t, expected_waste(t, cost_s=cost_s, mtbf_s=mtbf_s, restore_s=restore_s,
                               downtime_s=downtime_s)) for t in sorted(set(intervals))]


PRIOR_INTERRUPTIONS = 1.0
"""What the site's MTBF prior is worth: this many interruptions seen over this many MTBFs."""


def posterior_mtbf(prior_mtbf_s: float, *, exposure_s: float, interruptions: int) -> float:
    """MTBF from the site's prior and the run's observations (a documented Bayesian estimate).

    Interruptions arrive at an unknown rate λ (exponential times between them). The prior on
    λ is Gamma(shape a, rate a·M0), with M0 = ``prior_mtbf_s`` and a =
    :data:`PRIOR_INTERRUPTIONS` = 1: the site's figure is worth one interruption seen after M0
    seconds of exposure. Observing n interruptions in T seconds of allocated time gives the
    posterior Gamma(a + n, a·M0 + T), and the MTBF used is 1 / E[λ]:

        M = (a·M0 + T) / (a + n)

    A young run therefore trusts the site (one interruption in a 9 s run moves M from M0 to
    about M0/2, not to 9 s), and a long run converges to its own T / n.
    """
    _check_positive(prior_mtbf_s=prior_mtbf_s)
    if exposure_s < 0 or interruptions < 0:
        raise ConfigError(f"exposure and interruptions must be >= 0, got {exposure_s}, "
                          f"{interruptions}")
    a = PRIOR_INTERRUPTIONS
    return (a * prior_mtbf_s + exposure_s) / (a + interruptions)


NOT_INTERRUPTIONS = frozenset({"user_error", "data_error", "nonfinite", "timeout"})
"""Fault classes that do not count towards the MTBF: the program's own errors, and the time
limit (scheduled, not random)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptionHistory:
    """What a run has seen so far, across its incarnations (the MTBF's observations)."""

    interruptions: int = 0
    """Recorded faults that interrupted training (preemption, node failure, crash, hang...)."""
    exposure_s: float = 0.0
    """Seconds the run's incarnations held their allocations (STARTING to last entry)."""

    def __post_init__(self) -> None:
        if self.interruptions < 0 or self.exposure_s < 0:
            raise ConfigError(f"interruptions and exposure must be >= 0, got "
                              f"{self.interruptions}, {self.exposure_s}")


def interruption_history(entries: Sequence[LogEntry]) -> InterruptionHistory:
    """Interruptions and exposure from the run log's valid (fenced) entries (pure).

    Each generation is exposed from its ``STARTING`` state entry (its fence when it has none)
    to its last entry; ``fault`` entries whose class is not in :data:`NOT_INTERRUPTIONS` are
    interruptions, whichever generation (or the login node) recorded them.
    """
    spans: dict[int, list[float]] = {}
    interruptions = 0
    for e in entries:
        if e.kind == EntryKind.FAULT and _fault_class(e) not in NOT_INTERRUPTIONS:
            interruptions += 1
        if e.generation < 1:
            continue
        span = spans.get(e.generation)
        starts = e.kind == EntryKind.FENCE or (e.kind == EntryKind.STATE and _starts(e))
        if span is None:
            spans[e.generation] = [e.ts, e.ts] if starts else [math.inf, e.ts]
        else:
            if starts and span[0] == math.inf:
                span[0] = e.ts
            span[1] = max(span[1], e.ts)
    exposure = sum(max(0.0, b - a) for a, b in spans.values() if a != math.inf)
    return InterruptionHistory(interruptions=interruptions, exposure_s=exposure)


@dataclass(frozen=True, kw_only=True, slots=True)
class MtbfEstimate:
    """The MTBF the cadence and the report use, with where it came from."""

    prior_s: float
    """The site's prior (``mtbf_prior_h``)."""
    history: InterruptionHistory
    """The run's observations."""

    @property
    def mtbf_s(self) -> float:
        return posterior_mtbf(self.prior_s, exposure_s=self.history.exposure_s,
                              interruptions=self.history.interruptions)

    def describe(self) -> str:
        """One line: the estimate and its inputs."""
        h = self.history
        return (f"M = {format_duration(self.mtbf_s)}: site prior {format_duration(self.prior_s)}"
                f" (worth {PRIOR_INTERRUPTIONS:g} interruption) with {h.interruptions} "
                f"interruption(s) in {format_duration(h.exposure_s)} allocated")


@dataclass(frozen=True, kw_only=True, slots=True)
class CadencePolicy:
    """A run's checkpoint cadence as declared in its spec."""

    kind: CadenceKind
    """Spacing rule."""
    every_steps: int | None = None
    """Steps between checkpoints (``every_steps``)."""
    every_seconds: float | None = None
    """Seconds between checkpoints (``every_seconds``)."""
    rpo_s: float | None = None
    """Recovery point objective: the interval never exceeds it (all kinds measured in time)."""
    prior_mtbf_s: float = 6 * 3600.0
    """Prior mean time between interruptions; a run uses its site's ``mtbf_prior_h``."""
    initial_cost_s: float = 30.0
    """Assumed checkpoint cost before the first save is measured (``young``)."""
    restore_s: float = 0.0
    """Expected restore time R (for the waste estimate)."""

    def __post_init__(self) -> None:
        if self.kind == CadenceKind.EVERY_STEPS and not (self.every_steps or 0) >= 1:
            raise ConfigError(f"cadence every_steps needs every_steps >= 1, got "
                              f"{self.every_steps}")
        if self.kind == CadenceKind.EVERY_SECONDS and not (self.every_seconds or 0) > 0:
            raise ConfigError(f"cadence every_seconds needs every_seconds > 0, got "
                              f"{self.every_seconds}")
        _check_positive(prior_mtbf_s=self.prior_mtbf_s, initial_cost_s=self.initial_cost_s)
        if self.rpo_s is not None:
            _check_positive(rpo_s=self.rpo_s)


def as_cadence_policy(policy: Any) -> CadencePolicy:
    """A :class:`CadencePolicy` from itself or from any object with the same-named fields.

    Accepts the spec's checkpoint policy (``cadence``, ``every_steps``, ``every_seconds``,
    ``rpo_s``); fields it lacks take the defaults.
    """
    if isinstance(policy, CadencePolicy):
        return policy
    kind: Any = getattr(policy, "kind", None) or getattr(policy, "cadence", None)
    try:
        cadence = CadenceKind(kind)
    except ValueError:
        raise ConfigError(f"unknown checkpoint cadence {kind!r}; expected one of "
                          f"{', '.join(k.value for k in CadenceKind)}") from None
    fields = {n: getattr(policy, n) for n in ("every_steps", "every_seconds", "rpo_s",
                                              "prior_mtbf_s", "initial_cost_s", "restore_s")
              if getattr(policy, n, None) is not None}
    return CadencePolicy(kind=cadence, **fields)


class CadenceTimer:
    """Says when the next checkpoint is due; learns C and M as the run goes.

    Times passed as ``now`` are monotonic readings (default ``clock.monotonic()``).
    """

    def __init__(self, policy: Any, clock: Clock = SYSTEM_CLOCK, *, start_step: int = 0,
                 interruptions: int = 0, exposure_s: float = 0.0) -> None:
        self.policy = as_cadence_policy(policy)
        self._clock = clock
        self._last_step = self._step = start_step
        self._last_ts = clock.monotonic()
        self._costs: list[float] = []
        self._interruptions = interruptions
        self._exposure_s = exposure_s

    @property
    def cost_s(self) -> float:
        """Measured C: mean of the last few save costs (the initial guess before any)."""
        recent = self._costs[-5:]
        return sum(recent) / len(recent) if recent else self.policy.initial_cost_s

    @property
    def mtbf_s(self) -> float:
        return self.mtbf.mtbf_s

    @property
    def mtbf(self) -> MtbfEstimate:
        """The estimate in force: the policy's prior and what this timer has observed."""
        return MtbfEstimate(prior_s=self.policy.prior_mtbf_s, history=InterruptionHistory(
            interruptions=self._interruptions, exposure_s=self._exposure_s))

    def interval_s(self) -> float | None:
        """The time interval in force (None for pure ``every_steps`` without an RPO)."""
        p = self.policy
        if p.kind == CadenceKind.YOUNG:
            return choose_interval(cost_s=max(self.cost_s, 1e-6), mtbf_s=self.mtbf_s,
                                   restore_s=p.restore_s, rpo_s=p.rpo_s).interval_s
        if p.kind == CadenceKind.EVERY_SECONDS:
            assert p.every_seconds is not None
            return min(p.every_seconds, p.rpo_s) if p.rpo_s else p.every_seconds
        return p.rpo_s

    def due(self, step: int, now: float | None = None) -> bool:
        """Whether a checkpoint should be taken at the boundary after ``step``."""
        now = self._clock.monotonic() if now is None else now
        p = self.policy
        if p.kind == CadenceKind.EVERY_STEPS:
            assert p.every_steps is not None
            if step - self._last_step >= p.every_steps:
                return True
        interval = self.interval_s()
        return interval is not None and now - self._last_ts >= interval

    def observe_step(self, step: int, dur_s: float | None = None) -> None:
        """Note the step just completed (the step a following save belongs to)."""
        self._step = step

    def saved(self, step: int, *, cost_s: float, now: float | None = None) -> None:
        """Record a completed save (its exposed cost) at ``step``."""
        if cost_s < 0:
            raise ArgumentError(f"checkpoint cost must be >= 0 s, got {cost_s}; pass the "
                                "measured exposed pause of the save")
        now = self._clock.monotonic() if now is None else now
        self._exposure_s += max(0.0, now - self._last_ts)
        self._costs.append(cost_s)
        self._last_step, self._last_ts = step, now

    def observe_save(self, cost_s: float) -> None:
        """Record a save that just completed at the last observed step."""
        self.saved(self._step, cost_s=cost_s)

    def interrupted(self) -> None:
        """Record one observed interruption (preemption, node loss, crash, hang)."""
        self._interruptions += 1


def _fault_class(entry: LogEntry) -> str:
    """A FAULT entry's class; ``unknown`` for a word outside the classes or a malformed one."""
    try:
        return decode_as(entry, FaultPayload).fault.value
    except PayloadError:
        return FaultClass.UNKNOWN.value


def _starts(entry: LogEntry) -> bool:
    """Whether a STATE entry is an incarnation's ``STARTING`` (a malformed one is not)."""
    try:
        return decode_as(entry, StatePayload).state == RunState.STARTING
    except PayloadError:
        return False
