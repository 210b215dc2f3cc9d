"""Preemption signals: a handler that only sets a flag, and a collective agreement to stop.

A signal can arrive at any instruction: inside a collective, a checkpoint write or the data
loader. So the handler does nothing but record it in a :class:`StopFlag`; the training loop asks
:func:`agree_to_stop` at each step boundary, where every rank joins one tiny all-reduce (MAX) of
its flag. If any rank was signalled, all ranks stop at the same step, so the checkpoint that
follows is taken at one consistent boundary. A signal that arrives during a checkpoint is
therefore honoured at the next boundary, after that checkpoint has committed.

:func:`stop_on` installs the handlers for a block and restores whatever was installed before
(for example submitit's handlers, or the default action) when the block exits.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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

    __slots__ = ("_event", "_reason", "_signum")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signum: int | None = None
        self._reason: str | None = None

    def set(self, signum: int | None = None, reason: str | None = None) -> None:
        """Record a stop request (``signum`` when it came from a signal)."""
        if not self._event.is_set():
            self._signum = signum
            self._reason = reason or (_signal_name(signum) if signum is not None else "requested")
        self._event.set()

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


def agree_to_stop(flag: StopFlag, *, group: Any = None) -> bool:
    """Whether any rank of ``group`` was asked to stop; every rank gets the same answer.

    Each rank contributes its flag to one all-reduce (MAX) of a single integer, so this must be
    called by all ranks of the group at the same step. Without an initialised process group
    (a single process) it returns ``flag.is_set``.
    """
    return agree_any([flag.is_set], group=group)[0]


def agree_any(votes: Sequence[bool], *, group: Any = None) -> list[bool]:
    """For each vote, whether any rank of ``group`` voted yes (:func:`agree_sum` of 0/1).

    Collective: every rank calls it at the same point with the same number of votes. Without an
    initialised process group the votes come back unchanged.
    """
    return [n > 0 for n in agree_sum([1 if v else 0 for v in votes], group=group)]


def agree_sum(values: Sequence[int], *, group: Any = None) -> list[int]:
    """Each value summed over the ranks of ``group``: one all-reduce (SUM, int64) for all.

    Collective, like :func:`agree_any`; without an initialised process group the values come
    back unchanged.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [int(v) for v in values]
    import torch

    device = _collective_device(dist.get_backend(group))
    tally = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(tally, op=dist.ReduceOp.SUM, group=group)
    return [int(x) for x in tally.tolist()]


def _collective_device(backend: str) -> Any:
    import torch

    if str(backend).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
