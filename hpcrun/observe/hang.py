"""Hang detection ("no progress for T"), stack capture, and the response sequence.

The pure core decides: :func:`detect_hangs` over node heartbeats and :func:`learned_threshold`
over observed step times. The shell acts, in this order, because a killed process tells nothing:
capture every rank's Python stacks (faulthandler on :data:`DUMP_SIGNAL`), kill the gang, then
record a ``hang`` fault in the run log for the control plane's retry (:func:`respond_to_hang`).

:data:`DUMP_SIGNAL` is a real-time signal, deliberately not SIGUSR1/SIGUSR2, which carry
preemption.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import FaultPayload
from hpcrun.errors import ArgumentError
from hpcrun.observe.culprit import Culprit
from hpcrun.observe.heartbeat import NodeHeartbeat
from hpcrun.vocab import FaultClass

DUMP_SIGNAL: int = signal.SIGRTMIN + 2
"""Signal on which a rank writes all its threads' Python stacks (faulthandler)."""
DIAGNOSTICS_DIR = "diagnostics"


class HangReason(StrEnum):
    """Why progress is considered stopped."""

    NO_PROGRESS = "no_progress"   # a rank's last completed step is older than the threshold
    NODE_SILENT = "node_silent"   # the node's agent stopped publishing heartbeats
    NEVER_STEPPED = "never_stepped"  # a rank finished no step since its incarnation started


@dataclass(frozen=True, kw_only=True, slots=True)
class Hang:
    """One rank (or node, rank -1) that made no progress for longer than the threshold."""

    node: str
    """Node of the stuck rank."""
    rank: int
    """Global rank, or -1 when the whole node went silent."""
    step: int
    """Last step it completed (-1 when unknown)."""
    stalled_s: float
    """Seconds since its last progress."""
    reason: HangReason
    """What was observed."""
    pid: int = -1
    """Process id on the node, when known."""

    @property
    def signature(self) -> str:
        """A stable signature for repeated-fault detection (not tied to the step)."""
        return f"hang:{self.reason}:{self.node}:{self.rank}"


def detect_hangs(heartbeats: Mapping[str, NodeHeartbeat], now: float, *,
                 threshold_s: float) -> list[Hang]:
    """Ranks whose last progress is older than ``threshold_s`` at ``now`` (pure).

    A node whose agent stopped publishing is reported once, as rank -1, since its ranks'
    beats are then stale by construction. Sorted by node then rank.
    """
    if threshold_s <= 0:
        raise ArgumentError(f"hang threshold must be > 0 s, got {threshold_s}")
    hangs: list[Hang] = []
    for node in sorted(heartbeats):
        hb = heartbeats[node]
        if now - hb.ts > threshold_s:
            hangs.append(Hang(node=node, rank=-1, step=hb.min_step if hb.min_step is not None
                              else -1, stalled_s=now - hb.ts, reason=HangReason.NODE_SILENT))
            continue
        for rank in sorted(hb.ranks):
            beat = hb.ranks[rank]
            if now - beat.ts > threshold_s:
                hangs.append(Hang(node=node, rank=rank, step=beat.step, pid=beat.pid,
                                  stalled_s=now - beat.ts, reason=HangReason.NO_PROGRESS))
    return hangs


def never_stepped(node: str, ranks: Iterable[int], reported: Iterable[int], *, started: float,
                  now: float, grace_s: float) -> list[Hang]:
    """Ranks of ``node`` that finished no step in the ``grace_s`` since ``started`` (pure).

    Start-up (imports, process group, restore, a first step that compiles) has no heartbeat
    to judge; a rank stuck there (a wedged filesystem during restore) would otherwise never be
    caught, so it gets this longer allowance instead of the hang threshold.
    """
    if now - started <= grace_s:
        return []
    seen = set(reported)
    return [Hang(node=node, rank=r, step=-1, stalled_s=now - started,
                 reason=HangReason.NEVER_STEPPED) for r in sorted(set(ranks) - seen)]


def learned_threshold(step_times: Sequence[float], *, floor_s: float, factor: float) -> float:
    """Hang threshold learned from observed step times: ``max(floor, factor × p99)`` (pure).

    The 99th percentile (nearest rank) keeps one odd slow step (a checkpoint boundary) from
    being mistaken for the norm while still tracking the run's real pace.
    """
    if floor_s <= 0 or factor < 1:
        raise ArgumentError(f"need floor_s > 0 and factor >= 1, got floor_s {floor_s}, "
                            f"factor {factor}")
    clean = sorted(t for t in step_times if t >= 0)
    if not clean:
        return floor_s
    p99 = clean[min(len(clean) - 1, max(0, -(-99 * len(clean) // 100) - 1))]
    return max(floor_s, factor * p99)


_DUMP_FILES: list[IO[Any]] = []  # kept open for the process lifetime: faulthandler writes by fd


def stacks_path(run_dir: Path, *, generation: int, rank: int) -> Path:
    """Where rank ``rank`` of ``generation`` dumps its stacks."""
    return Path(run_dir) / DIAGNOSTICS_DIR / f"g{generation:04d}" / f"stacks-rank-{rank:05d}.txt"


def install_stack_dump(path: Path) -> None:
    """In a rank: on :data:`DUMP_SIGNAL`, append all threads' Python stacks to ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - must outlive this call
    _DUMP_FILES.append(f)
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)


def capture_stacks(pids: Iterable[int], *, wait_s: float = 1.0,
                   clock: Clock = SYSTEM_CLOCK) -> list[int]:
    """In the agent: ask every rank to dump its stacks, then wait briefly for the writes.

    Returns the pids that were signalled (those already gone are skipped).
    """
    sent: list[int] = []
    for pid in pids:
        try:
            os.kill(pid, DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError):
            continue
        sent.append(pid)
    if sent:
        clock.sleep(wait_s)
    return sent


CULPRIT_SIGNATURE = "hang:culprit:"
"""Signature prefix of a hang whose evidence names the ranks that did not arrive: the only
hang that counts against a node (``control/retry.py``'s quarantine)."""


def hang_fault_payload(hang: Hang, *, threshold_s: float) -> dict[str, Any]:
    """The run-log payload of the ``hang`` fault (fields the control plane folds)."""
    detail = (f"no step finished {hang.stalled_s:.0f} s after the start "
              f"({hang.reason}: past the start-up allowance, HPCRUN_START_S)"
              if hang.reason == HangReason.NEVER_STEPPED else
              f"no progress for {hang.stalled_s:.0f} s (threshold {threshold_s:.0f} s, "
              f"{hang.reason}); no evidence named the rank that did not arrive")
    return FaultPayload(fault=FaultClass.HANG, node=hang.node, rank=hang.rank, step=hang.step,
                        signature=hang.signature, detail=detail).to_payload()


def culprit_fault_payload(hangs: Sequence[Hang], culprit: Culprit, *,
                          threshold_s: float) -> dict[str, Any]:
    """The one ``hang`` fault of a hang whose culprit is known: it names the ranks that did
    not arrive and their node (the node the quarantine counts), not every stalled rank."""
    rank = culprit.ranks[0]
    node = culprit.nodes[0] if culprit.nodes else None
    own = [h for h in hangs if h.rank in culprit.ranks]
    stalled = max((h.stalled_s for h in hangs), default=0.0)
    return FaultPayload(
        fault=FaultClass.HANG, node=node, rank=rank,
        step=min((h.step for h in own), default=min((h.step for h in hangs), default=-1)),
        signature=f"{CULPRIT_SIGNATURE}{node or '?'}:{rank}",
        detail=(f"{culprit.describe()}; no progress for {stalled:.0f} s "
                f"(threshold {threshold_s:.0f} s)"),
        culprit_ranks=culprit.ranks, culprit_nodes=culprit.nodes).to_payload()


def respond_to_hang(hangs: Sequence[Hang], *, pids: Iterable[int],
                    kill_gang: Callable[[], None], record_fault: Callable[[dict[str, Any]], None],
                    threshold_s: float, wait_s: float = 1.0, clock: Clock = SYSTEM_CLOCK,
                    culprit: Culprit | None = None) -> list[int]:
    """Capture stacks, then kill the gang, then record the ``hang`` fault: one naming the
    ``culprit`` when the evidence named one, else one per stuck rank.

    The order is the point: diagnostics before the kill, the fault after it, so a retry never
    races the old gang. Returns the pids whose stacks were requested.
    """
    if not hangs:
        return []
    signalled = capture_stacks(pids, wait_s=wait_s, clock=clock)
    kill_gang()
    if culprit is not None:
        record_fault(culprit_fault_payload(hangs, culprit, threshold_s=threshold_s))
        return signalled
    for hang in hangs:
        record_fault(hang_fault_payload(hang, threshold_s=threshold_s))
    return signalled
