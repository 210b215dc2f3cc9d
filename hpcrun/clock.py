"""Time as an injected dependency.

Backoff, heartbeats, hang detection and cadence all read time through a :class:`Clock`, so their
rules are unit-testable without sleeping (see :class:`hpcrun.testing.FakeClock`).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Wall and monotonic time, and sleeping."""

    def now(self) -> float:
        """Seconds since the epoch (wall clock, for records shown to people)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and timeouts)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
