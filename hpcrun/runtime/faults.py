"""Scheduled fault injection for drills and tests (``HPCRUN_INJECT``).

``HPCRUN_INJECT="crash@step=5,rank=1;hang@step=8,rank=0;preempt@step=12"`` makes the named rank
SIGKILL itself, stop making progress, or signal its agent for a preemption when it reaches the
step; ``nodecrash`` SIGKILLs the rank's whole node (its agent, the agent's drain process and every
rank of the node), as a power loss would (local backend). Each fault fires only in the first
incarnation of the job (restart 0, attempt 0) unless ``every=1`` is given, so a recovered run does
not fault again; ``restart=N`` makes it fire in the first incarnation of the job's N-th restart
instead, so one run can be interrupted several times
(``preempt@step=12;preempt@step=25,restart=1;nodecrash@step=40,rank=2,restart=2``).
``ckptcrash@step=N,rank=R,stage=S`` SIGKILLs the rank inside the first checkpoint it takes from
step N on, when that save reaches stage S (``staging``, ``shard_write``, ``before_manifest``,
``before_commit``, ``after_commit``; the last three happen on rank 0 only).
``fsstall@step=N,seconds=S`` stalls the shared filesystem for ``S`` seconds from step N on every
node of the gang: each rank, and its agent, blocks every operation through the storage seam on
the run directory (:class:`~hpcrun.storage.StallGate`), as a Lustre metadata server that stops
answering does; the rank field is ignored (every rank of the gang).
``sdc@step=N,rank=R`` flips one bit in the rank's parameters after step N, as a device that
computes a wrong answer without failing would (silent data corruption; the rank's context
applies it, since only it holds the parameters).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpcrun.errors import SpecError


class FaultKind(StrEnum):
    """Faults a rank can inject into itself."""

    CRASH = "crash"      # SIGKILL this rank
    HANG = "hang"        # stop making progress without exiting
    PREEMPT = "preempt"  # send the preemption signal to this node's agent
    SLOW = "slow"        # sleep ``seconds`` in every step from ``step`` on (a straggler)
    NODECRASH = "nodecrash"  # SIGKILL this rank's node: its agent and everything it started
    CKPTCRASH = "ckptcrash"  # SIGKILL this rank when a checkpoint reaches ``stage``
    SDC = "sdc"              # flip one bit in this rank's parameters (silent data corruption)
    FSSTALL = "fsstall"      # every shared-tier operation of the gang blocks for ``seconds``


CKPT_STAGES = ("staging", "shard_write", "before_manifest", "before_commit", "after_commit")
"""Checkpoint stages a ``ckptcrash`` can name (the checkpoint plane's ``FAULT_STAGES``)."""


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
    restart: int = 0
    """Job restart count (requeues) whose first incarnation it fires in."""
    stage: str = ""
    """Checkpoint stage for ``ckptcrash``."""

    def __post_init__(self) -> None:
        if (self.kind == FaultKind.CKPTCRASH) != (self.stage in CKPT_STAGES):
            raise SpecError(f"fault injection {self.kind}: stage={self.stage!r}, but ckptcrash "
                            f"needs a stage among {', '.join(CKPT_STAGES)} and the other "
                            "faults take none; set stage= on ckptcrash only")
        if self.step < 0 or self.rank < 0 or self.restart < 0 or self.seconds < 0:
            raise SpecError(f"fault injection {self.kind}: step, rank, restart and seconds must "
                            f"be >= 0, found step={self.step} rank={self.rank} "
                            f"restart={self.restart} seconds={self.seconds}; give non-negative "
                            "values")


def parse_injections(text: str) -> tuple[Injection, ...]:
    """Parse ``HPCRUN_INJECT``; raise SpecError naming the bad part."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kind, _, args = part.partition("@")
        if kind == "storage":
            continue  # a fault of the shared tier, injected at the storage seam (sharedtier.py)
        try:
            fields = dict(kv.split("=", 1) for kv in args.split(",") if kv)
            out.append(Injection(
                kind=FaultKind(kind), step=int(fields.get("step", 0)),
                rank=int(fields.get("rank", 0)), every=fields.get("every", "0") == "1",
                seconds=float(fields.get("seconds", 0)),
                restart=int(fields.get("restart", 0)), stage=fields.get("stage", ""),
            ))
        except ValueError as exc:
            raise SpecError(
                f"HPCRUN_INJECT part {part!r} is malformed ({exc}); expected "
                "KIND@step=N[,rank=R][,every=1|restart=N][,seconds=S][,stage=S] with KIND one of "
                f"{', '.join(k.value for k in FaultKind)}"
            ) from exc
    return tuple(out)


def due(injections: tuple[Injection, ...], *, rank: int, step: int, restart: int = 0,
        attempt: int = 0, first_incarnation: bool | None = None) -> list[Injection]:
    """Injections that fire for ``rank`` after ``step`` in incarnation (restart, attempt) (pure).

    ``first_incarnation`` is the short form for callers that only know whether this is the
    job's first incarnation: True means restart 0 attempt 0, False a later one.
    """
    if first_incarnation is not None:
        restart, attempt = (0, 0) if first_incarnation else (-1, -1)
    return [
        i for i in injections
        if (i.rank == rank or i.kind == FaultKind.FSSTALL)
        and (i.every or (restart, attempt) == (i.restart, 0))
        and i.kind != FaultKind.CKPTCRASH
        and (i.step == step or (i.kind == FaultKind.SLOW and step >= i.step))
    ]


def checkpoint_hook(injections: tuple[Injection, ...], *, rank: int, restart: int,
                    attempt: int) -> Callable[[str, int], None]:
    """The checkpoint plane's ``fault_hook`` for this rank: SIGKILL at a ``ckptcrash`` stage of
    the first save taken from the injection's step on.

    The hook is given the step of the save reaching the stage, not the rank's current step: an
    asynchronous save of an earlier step still writing when training passes the injection's
    step is not the save the injection names.
    """
    mine = [i for i in injections if i.kind == FaultKind.CKPTCRASH and i.rank == rank
            and (i.every or (restart, attempt) == (i.restart, 0))]

    def hook(stage: str, step: int) -> None:
        if any(i.stage == stage and step >= i.step for i in mine):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def fire(injection: Injection, *, preempt_signal: int) -> None:
    """Carry out one injection in this process."""
    if injection.kind == FaultKind.CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    elif injection.kind == FaultKind.HANG:
        while True:
            time.sleep(3600)
    elif injection.kind == FaultKind.PREEMPT:
        # As Slurm does for a step: the agent learns it is a preemption, and this rank's own
        # flag is set at once, so the gang stops at the very next boundary whatever the load.
        os.kill(os.getppid(), preempt_signal)
        os.kill(os.getpid(), preempt_signal)
    elif injection.kind == FaultKind.SLOW:
        time.sleep(injection.seconds)
    elif injection.kind == FaultKind.NODECRASH:
        from hpcrun.proctree import crash_process_tree

        crash_process_tree(os.getppid())


def flip_bit(tensor: Any, *, index: int, bit: int) -> None:
    """Flip bit ``bit`` of element ``index`` of ``tensor``, in place, on its device."""
    import torch

    flat = tensor.detach().view(-1)
    words = flat.view(getattr(torch, f"int{8 * flat.element_size()}")
                      if flat.element_size() > 1 else torch.uint8)
    if not 0 <= bit < 8 * flat.element_size() or not 0 <= index < words.numel():
        raise SpecError(f"sdc injection: bit {bit} of element {index} is outside a tensor of "
                        f"{words.numel()} {flat.dtype} elements; pick a bit below "
                        f"{8 * flat.element_size()}")
    with torch.no_grad():
        words[index] ^= 1 << bit if bit < 8 * flat.element_size() - 1 else -(1 << bit)


def from_environ(env: Mapping[str, str]) -> tuple[Injection, ...]:
    return parse_injections(env.get("HPCRUN_INJECT", ""))
