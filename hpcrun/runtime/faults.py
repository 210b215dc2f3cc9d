"""Scheduled fault injection for drills and tests (``HPCRUN_INJECT``).

``HPCRUN_INJECT="crash@step=5,rank=1;hang@step=8,rank=0;preempt@step=12"`` makes the named rank
SIGKILL itself, stop making progress, or signal its agent for a preemption when it reaches the
step. Each fault fires only in the first incarnation of the job (restart 0, attempt 0) unless
``every=1`` is given, so a recovered run does not fault again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from hpcrun.errors import SpecError


class FaultKind(StrEnum):
    """Faults a rank can inject into itself."""

    CRASH = "crash"      # SIGKILL this rank
    HANG = "hang"        # stop making progress without exiting
    PREEMPT = "preempt"  # send the preemption signal to this node's agent
    SLOW = "slow"        # sleep ``seconds`` in every step from ``step`` on (a straggler)


@dataclass(frozen=True, kw_only=True, slots=True)
class Injection:
    """One scheduled fault."""

    kind: FaultKind
    """What to do."""
    step: int
    """Global step at which it fires (after that step's ``step_done``)."""
    rank: int = 0
    """Global rank that fires it."""
    every: bool = False
    """Fire in every incarnation, not only the first."""
    seconds: float = 0.0
    """Sleep per step for ``slow``."""


def parse_injections(text: str) -> tuple[Injection, ...]:
    """Parse ``HPCRUN_INJECT``; raise SpecError naming the bad part."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind, _, args = part.partition("@")
        try:
            fields = dict(kv.split("=", 1) for kv in args.split(",") if kv)
            out.append(Injection(
                kind=FaultKind(kind), step=int(fields.get("step", 0)),
                rank=int(fields.get("rank", 0)), every=fields.get("every", "0") == "1",
                seconds=float(fields.get("seconds", 0)),
            ))
        except ValueError as exc:
            raise SpecError(
                f"HPCRUN_INJECT part {part!r} is malformed ({exc}); expected "
                "KIND@step=N[,rank=R][,every=1][,seconds=S] with KIND one of "
                f"{', '.join(k.value for k in FaultKind)}"
            ) from exc
    return tuple(out)


def due(injections: tuple[Injection, ...], *, rank: int, step: int,
        first_incarnation: bool) -> list[Injection]:
    """Injections that fire for ``rank`` after ``step`` (pure)."""
    return [
        i for i in injections
        if i.rank == rank and (i.every or first_incarnation)
        and (i.step == step or (i.kind == FaultKind.SLOW and step >= i.step))
    ]


def fire(injection: Injection, *, preempt_signal: int) -> None:
    """Carry out one injection in this process."""
    if injection.kind == FaultKind.CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    elif injection.kind == FaultKind.HANG:
        while True:
            time.sleep(3600)
    elif injection.kind == FaultKind.PREEMPT:
        os.kill(os.getppid(), preempt_signal)
    elif injection.kind == FaultKind.SLOW:
        time.sleep(injection.seconds)


def from_environ(env: Mapping[str, str]) -> tuple[Injection, ...]:
    return parse_injections(env.get("HPCRUN_INJECT", ""))
