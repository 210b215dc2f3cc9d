"""Signals as flags: a handler that only records the signal, installed for a block.

A signal can arrive at any instruction: inside a collective, a checkpoint write or the data
loader. So the handler does nothing but record it in a :class:`StopFlag`, which the program reads
where it is safe to act (for training, at a step boundary: :mod:`hpcrun.runtime.preemption`
holds the whole preemption path). :func:`stop_on` installs the handlers for a block and restores
whatever was installed before (for example submitit's handlers, or the default action) when the
block exits. :func:`signal_number` parses a site's signal name.

Before a flag exists: a process's first instructions call :func:`hold_signals`, so a signal that
comes while it imports and sets up is remembered (:func:`take_held`) instead of taking its default
action (SIGUSR1's and SIGTERM's is to terminate the process).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ConfigError


def signal_number(name: str | int) -> int:
    """Parse a signal name or number: ``"USR1"``, ``"SIGUSR1"``, ``"sigusr1"``, ``"10"``, ``10``.

    Raises:
        ConfigError: the name is not a signal on this platform.
    """
    text = str(name).strip()
    if text.isdigit():
        try:
            return int(signal.Signals(int(text)))
        except ValueError:
            raise ConfigError(f"signal number {text} is not a signal on this platform; use a "
                              "name such as USR1") from None
    upper = text.upper()
    if not upper.startswith("SIG"):
        upper = "SIG" + upper
    member = signal.Signals.__members__.get(upper)
    if member is None:
        raise ConfigError(f"unknown signal {name!r}: expected a name such as USR1, SIGUSR2, TERM "
                          "or a number")
    return int(member)


class StopFlag:
    """Set by a signal handler (or by hand), read at step boundaries. Thread- and signal-safe.

    Only the first signal is remembered: a later SIGTERM does not hide that a SIGUSR1 preemption
    notice came first.
    """

    __slots__ = ("_at", "_clock", "_event", "_reason", "_signum")

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._event = threading.Event()
        self._signum: int | None = None
        self._reason: str | None = None
        self._clock = clock
        self._at: float | None = None

    def set(self, signum: int | None = None, reason: str | None = None) -> None:
        """Record a stop request (``signum`` when it came from a signal)."""
        if not self._event.is_set():
            self._signum = signum
            self._reason = reason or (_signal_name(signum) if signum is not None else "requested")
            self._at = self._clock.monotonic()
        self._event.set()

    @property
    def set_at(self) -> float | None:
        """When the first stop request came (the clock's monotonic seconds), or None: a
        preemption's grace runs from here."""
        return self._at

    @property
    def is_set(self) -> bool:
        """Whether a stop was requested in this process."""
        return self._event.is_set()

    @property
    def signum(self) -> int | None:
        """Number of the first signal that set the flag, or None."""
        return self._signum

    @property
    def reason(self) -> str | None:
        """Why the flag was set (``SIGUSR1``, or the reason given to :meth:`set`)."""
        return self._reason

    def __repr__(self) -> str:
        return f"StopFlag(is_set={self.is_set}, reason={self._reason!r})"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextmanager
def stop_on(signals: Iterable[int | str], flag: StopFlag) -> Iterator[StopFlag]:
    """Within the block, each of ``signals`` only sets ``flag``; previous handlers come back after.

    Must run in the main thread (Python delivers signals only there).

    Raises:
        ConfigError: a signal name is unknown, or this is not the main thread.
    """
    numbers = list(dict.fromkeys(signal_number(s) for s in signals))
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("stop_on must be entered in the main thread (Python runs signal "
                          "handlers only there); enter it where the training loop starts")

    def handler(signum: int, frame: Any) -> None:
        flag.set(signum)

    previous: dict[int, Any] = {}
    try:
        for num in numbers:
            previous[num] = signal.signal(num, handler)
        yield flag
    finally:
        for num, old in previous.items():
            signal.signal(num, old if old is not None else signal.SIG_DFL)


_held: list[int] = []


def _hold(signum: int, frame: Any) -> None:
    _held.append(signum)


def hold_signals(signals: Iterable[int | str]) -> None:
    """From now on each of ``signals`` is only remembered, until a :func:`stop_on` block takes
    it over and :func:`take_held` hands what came in the meantime to its flag. For the first
    instructions of a process that a preemption notice can reach before its flag exists."""
    for num in dict.fromkeys(signal_number(s) for s in signals):
        signal.signal(num, _hold)


def ignored_from_exec(signals: Iterable[int | str]) -> Callable[[], None]:
    """A ``preexec_fn`` that ignores ``signals`` in a child before it execs: an ignored signal
    stays ignored across exec, so the child's interpreter starts immune to it, and the child
    holds it once it runs (:func:`hold_signals`)."""
    numbers = [signal_number(s) for s in signals]

    def ignore() -> None:
        for num in numbers:
            signal.signal(num, signal.SIG_IGN)

    return ignore


def holding(signum: int) -> bool:
    """Whether ``signum`` is held (:func:`hold_signals`) right now."""
    return signal.getsignal(signum) is _hold


def take_held() -> int | None:
    """The first signal held since the last call (None if none came), forgetting them all."""
    first = _held[0] if _held else None
    _held.clear()
    return first
