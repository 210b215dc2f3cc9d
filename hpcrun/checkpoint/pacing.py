"""A background drain that training does not feel: lowest priority, adaptive rate, cold copies.

The node's background drainer copies gigabytes from tier 0 to tier 1 while its node trains.
Unthrottled, the copy competes for CPU, memory bandwidth and the disk and makes steps slower
(most of all the slow tail). Here:

- :func:`lower_priority` puts the drain process at the lowest priority that still progresses:
  nice 19 under ``SCHED_BATCH`` (no wake-up preemption of training threads) and the lowest
  best-effort I/O priority (``ioprio_set(IOPRIO_CLASS_BE, 7)``). The idle classes
  (``SCHED_IDLE``, ``IOPRIO_CLASS_IDLE``, ``idle=True``) run only when nothing else wants the CPU
  or the disk: on a busy node they starve the drain and the tier-1 RPO grows without bound
  (measured: a 0.35 GB drain stood still for minutes at load 14 on 2 vCPUs). Each setting is
  best effort; what was applied is returned.
- :class:`DrainPacer` copies at a bounded rate that adapts to the training's step time, read
  from the ranks' heartbeats: additive increase while steps keep their pace, multiplicative
  back-off as soon as the recent step period exceeds the idle baseline by
  ``PacePolicy.tolerance`` (AIMD, as TCP does with a shared link). :func:`next_rate` is the
  pure rule.
- The paced copy (``drain.copy_verified`` with a pacer) moves ``PacePolicy.chunk`` bytes at a
  time with O_DIRECT where the filesystem allows it and drops what reached the page cache
  (``posix_fadvise(DONTNEED)``) on both sides, so the drain evicts none of training's cache.

:func:`run_in_background` does both for the current process (the node's drainer calls it once
at start); the final drain round at the end of an incarnation runs in the agent itself,
unpaced and at normal priority, because it is on the requeue's critical path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ArgumentError

__all__ = ["DrainPacer", "PacePolicy", "Priority", "active_pacer", "lower_priority",
           "next_rate", "run_in_background"]

MIB = 1 << 20
_IOPRIO_CLASS_BE = 2
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_BE_LOWEST = 7
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_WHO_PROCESS = 1
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}

StepPeriods = Callable[[], Sequence[float]]
"""Seconds per training step measured since the previous call (one value per new report)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PacePolicy:
    """How fast a background drain may copy, and how it reacts to training slowing down."""

    start_bps: float = 128 * MIB
    """Rate before any step time is known."""
    min_bps: float = 32 * MIB
    """Floor: the drain always progresses (the tier-1 RPO stays bounded)."""
    max_bps: float = 1024 * MIB
    """Ceiling, even when training does not notice the drain."""
    increase_bps: float = 64 * MIB
    """Added per check while steps keep their pace."""
    backoff: float = 0.5
    """Rate multiplier when steps slow down."""
    tolerance: float = 1.05
    """A recent step period above ``baseline × tolerance`` counts as a slowdown."""
    chunk: int = 8 * MIB
    """Bytes per paced I/O request (a multiple of 4 KiB, for O_DIRECT)."""
    check_s: float = 0.5
    """Seconds between rate decisions."""
    window: int = 3
    """Recent step periods whose median is compared with the baseline."""
    idle_gap_s: float = 2.0
    """Reports taken this long after the previous copy ended describe training alone."""

    def __post_init__(self) -> None:
        if not 0 < self.min_bps <= self.start_bps <= self.max_bps or self.chunk % 4096 \
                or not 0 < self.backoff < 1 or self.tolerance < 1 or self.window < 1:
            raise ArgumentError(f"pace policy is inconsistent: need 0 < min <= start <= max "
                                f"rate, 0 < backoff < 1, tolerance >= 1, window >= 1 and a "
                                f"4 KiB-multiple chunk; found {self}")


def next_rate(rate: float, baseline_s: float | None, recent_s: float | None,
              policy: PacePolicy) -> float:
    """The drain's next rate from the idle step period and the recent one (pure AIMD)."""
    if baseline_s is None or recent_s is None:
        return rate
    if recent_s > baseline_s * policy.tolerance:
        return max(policy.min_bps, rate * policy.backoff)
    return min(policy.max_bps, rate + policy.increase_bps)


class DrainPacer:
    """A token bucket whose rate follows the training's step time.

    Args:
        periods: Step periods reported since the previous call (see :data:`StepPeriods`).
        policy: Rates and reaction.
        clock: Time source (a fake in tests).
    """

    def __init__(self, periods: StepPeriods, policy: PacePolicy | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy or PacePolicy()
        self.rate = self.policy.start_bps
        self._periods, self._clock = periods, clock
        self._idle: deque[float] = deque(maxlen=32)
        self._recent: deque[float] = deque(maxlen=self.policy.window)
        self._next_at = self._checked = 0.0
        self._ended: float | None = None
        self.copied = 0
        """Bytes paced so far."""
        self.backoffs = 0
        """Times the rate was cut because steps slowed down."""

    @property
    def baseline_s(self) -> float | None:
        """Median step period seen while no copy ran (``None`` before any)."""
        return statistics.median(self._idle) if self._idle else None

    def idle(self) -> None:
        """Between copies: what steps take now is the baseline."""
        self._idle.extend(self._periods())
        self._recent.clear()

    def begin(self) -> None:
        """A copy starts: refresh the baseline (unless a copy just ended) and the bucket."""
        now = self._clock.monotonic()
        if self._ended is None or now - self._ended >= self.policy.idle_gap_s:
            self.idle()
        self._next_at = self._checked = now

    def end(self) -> None:
        """A copy ended (reports in the next ``idle_gap_s`` still show its effect)."""
        self._ended = self._clock.monotonic()

    def pace(self, nbytes: int) -> None:
        """Account ``nbytes`` just moved; sleep until the rate allows the next request."""
        self.copied += nbytes
        self._next_at += nbytes / self.rate
        now = self._clock.monotonic()
        if now - self._checked >= self.policy.check_s:
            self._adapt()
            self._checked = now
        # never bank credit for time spent elsewhere (a slow disk must not earn a burst)
        self._next_at = max(self._next_at, now - self.policy.check_s)
        if self._next_at > now:
            self._clock.sleep(self._next_at - now)

    def _adapt(self) -> None:
        self._recent.extend(self._periods())
        if not self._idle and self._recent:  # drain started before any idle report
            self._idle.append(min(self._recent))
        recent = statistics.median(self._recent) if self._recent else None
        rate = next_rate(self.rate, self.baseline_s, recent, self.policy)
        if rate < self.rate:
            self.backoffs += 1
            self._recent.clear()  # judge the new rate on fresh reports
        self.rate = rate


@dataclass(frozen=True, kw_only=True, slots=True)
class Priority:
    """What :func:`lower_priority` managed to apply."""

    nice: int | None
    """The process's nice value now (``None``: could not be set)."""
    policy: str
    """CPU scheduling policy now: ``batch``, ``idle`` or ``unchanged``."""
    io: str
    """I/O priority now: ``best-effort/7``, ``idle`` or ``unchanged``."""


def lower_priority(*, idle: bool = False) -> Priority:
    """Lowest CPU and I/O priority for this process's calling thread and every thread it
    starts afterwards (Linux applies both per thread; new threads inherit them).

    Args:
        idle: Use the idle classes, which may starve (see the module docstring).
    """
    nice: int | None = None
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    policy = "unchanged"
    with contextlib.suppress(OSError, AttributeError):
        want = os.SCHED_IDLE if idle else os.SCHED_BATCH
        os.sched_setscheduler(0, want, os.sched_param(0))
        if os.sched_getscheduler(0) == want:
            policy = "idle" if idle else "batch"
    io_class = (_IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT) if idle else \
        (_IOPRIO_CLASS_BE << _IOPRIO_CLASS_SHIFT) | _IOPRIO_BE_LOWEST
    io = ("idle" if idle else "best-effort/7") if _set_ioprio(io_class) else "unchanged"
    return Priority(nice=nice, policy=policy, io=io)


def _set_ioprio(value: int) -> bool:
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return int(libc.syscall(number, _IOPRIO_WHO_PROCESS, 0, value)) == 0


_ACTIVE: list[DrainPacer] = []


def run_in_background(periods: StepPeriods, policy: PacePolicy | None = None
                      ) -> tuple[Priority, DrainPacer]:
    """Make this process a background drainer: lowest priority, and every drain copy paced.

    Called once by the node's drainer process; other processes (the agent's final round,
    tests, the CLI) keep unpaced copies at normal priority.
    """
    pacer = DrainPacer(periods, policy)
    _ACTIVE[:] = [pacer]
    return lower_priority(), pacer


def active_pacer() -> DrainPacer | None:
    """The pacer of this process's drain copies, when it is a background drainer."""
    return _ACTIVE[0] if _ACTIVE else None
