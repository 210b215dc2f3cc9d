"""Recovery time, split into phases, from the run log and the ranks' events (pure).

For every interruption of generation ``g`` that a newer generation ``g'`` recovered from:

```
interrupted ─ detect ─► decided ─ requeue/wait ─► fence g' ─ start ─► restore begins
            ─ restore ─► restored ─ first step ─► RUNNING (a step validated after the restore)
```

- *interrupted*: the earliest evidence between the two incarnations: a ``fault_injected``
  event or note (a drill's fault from outside, such as a node crash), a ``fault`` entry, or
  the start of the stop commit after a preemption signal;
- *decided*: the first decision entry after ``g`` started (PREEMPTED, RECOVERING, FAILED or
  REQUEUED state, or a requeue operation; by the supervisor, by a login-node reconcile pass,
  or, for a requeue Slurm did by itself, by the next incarnation with Slurm's end time of the
  interrupted run as ``decided_at``); for a preemption it includes the stop commit and the
  tier-1 drain, which must finish before the allocation is given back;
- *fence g'*: the new incarnation's claim (after the relaunch, backoff or queue wait);
- *restore begins / restored*: the earliest ``restore`` span start and the latest end over
  the ranks of ``g'`` (process start, imports and the process group come before);
- *RUNNING*: rank 0's validation of the first step after the restore.

The *start* phase is split further from the ranks' ``startup`` events
(:mod:`hpcrun.runtime.rank.startup`: hand-off, process, imports, process groups, context,
entrypoint, the training script's setup), as ``RtoSplit.start_parts``.

RTO is *interrupted → RUNNING*; RPO is the steps lost: the last step reached in ``g`` minus the
step ``g'`` restored.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcrun.runtime.faults import FaultKind
from hpcrun.runtime.rank.startup import start_parts

PHASES = ("detect", "requeue_wait", "start", "restore", "first_step")
"""Phase names, in order."""
_DECISIONS = ("PREEMPTED", "RECOVERING", "FAILED", "REQUEUED")


@dataclass(frozen=True, kw_only=True, slots=True)
class RtoSplit:
    """One recovery, measured."""

    from_generation: int
    """Generation interrupted."""
    to_generation: int
    """Generation that recovered."""
    cause: str
    """Fault class acted on (``preemption``, ``node_failure``, ``process_crash``, ...)."""
    phases: Mapping[str, float]
    """Phase name → seconds (see :data:`PHASES`); a phase without evidence is absent."""
    total_s: float
    """Interruption → validated resumed progress."""
    last_step: int
    """Last step reached in the interrupted generation."""
    restored_step: int
    """Step the recovering generation restored (0 for a fresh start)."""
    start_parts: Mapping[str, float] = field(default_factory=dict)
    """The *start* phase split (:data:`hpcrun.runtime.rank.startup.PARTS` → median seconds over
    the ranks), from their ``startup`` events; empty when the ranks emitted none."""

    @property
    def steps_lost(self) -> int:
        """RPO in steps: work redone after the restore."""
        return max(0, self.last_step - self.restored_step)

    def row(self) -> str:
        """``detect 1.2 s · requeue/wait 3.4 s · ...`` for tables."""
        names = {"requeue_wait": "requeue/wait", "first_step": "first step"}
        return " · ".join(f"{names.get(p, p)} {self.phases[p]:.1f} s"
                          for p in PHASES if p in self.phases)


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _payload(entry: Any) -> Mapping[str, Any]:
    p = _field(entry, "payload", {})
    return p if isinstance(p, Mapping) else {}


def _state_of(entry: Any) -> str:
    return str(_payload(entry).get("state", "")) if _field(entry, "kind") == "state" else ""


def rto_splits(entries: Sequence[Any], events: Iterable[Any]) -> list[RtoSplit]:
    """Every recovery of the run, in order (pure).

    An incarnation is a generation that started (a STARTING or RUNNING entry); a generation
    that only decided (a login-node reconcile pass, a cancel) belongs to the gap between the
    incarnations around it, and what it logged counts for that gap.

    Args:
        entries: run log entries (:class:`~hpcrun.control.log.LogEntry`) in slot order.
        events: rank events (:class:`~hpcrun.protocols.Event`), any order.
    """
    by_gen: dict[int, list[Any]] = {}
    for ev in events:
        by_gen.setdefault(int(_field(ev, "generation", -1)), []).append(ev)
    started = {int(_field(e, "generation")) for e in entries
               if _state_of(e) in ("STARTING", "RUNNING")}
    fences = [i for i, e in enumerate(entries) if _field(e, "kind") == "fence"
              and int(_field(e, "generation")) in started]
    out = []
    for i, j in itertools.pairwise(fences):
        g2 = int(_field(entries[j], "generation"))
        # up to g2's STARTING: what g2 logged before it (why Slurm requeued) is about the gap
        k = next((n for n in range(j, len(entries)) if _field(entries[n], "generation") == g2
                  and _state_of(entries[n]) == "STARTING"), j)
        split = _split(entries[i:k], entries, by_gen, int(_field(entries[i], "generation")),
                       g2, float(_field(entries[j], "ts")))
        if split is not None:
            out.append(split)
    return out


def _split(window: Sequence[Any], entries: Sequence[Any], by_gen: Mapping[int, list[Any]],
           g: int, g2: int, fence_ts: float) -> RtoSplit | None:
    decided = next((e for e in window if _state_of(e) in _DECISIONS
                    or (_field(e, "kind") == "op"
                        and _payload(e).get("action") == "requeue")), None)
    running = next((e for e in entries if _field(e, "generation") == g2
                    and _state_of(e) == "RUNNING"), None)
    if decided is None or running is None:
        return None  # not a recovery (the new generation never ran)
    # a requeue Slurm decided is logged by the next incarnation, with Slurm's time of it
    at = _payload(decided).get("decided_at")
    decided_ts = float(at) if isinstance(at, int | float) else float(_field(decided, "ts"))
    interrupted = _interrupted(window, by_gen.get(g, []), decided_ts)
    restores = [ev for ev in by_gen.get(g2, []) if _field(ev, "kind") == "restore"]
    marks = {"interrupted": interrupted, "decided": decided_ts,
             "fence": fence_ts, "running": float(_field(running, "ts"))}
    if restores:
        marks["restore_begin"] = min(float(_field(ev, "data", {}).get("start_ts", _field(ev, "ts")))
                                     for ev in restores)
        marks["restored"] = max(float(_field(ev, "ts")) for ev in restores)
    return RtoSplit(from_generation=g, to_generation=g2, cause=_cause(window),
                    phases=phase_durations(marks), total_s=marks["running"] - interrupted,
                    last_step=_last_step(by_gen.get(g, []), window),
                    restored_step=int(_payload(running).get("restored_step") or 0),
                    start_parts=start_parts(by_gen.get(g2, []), g2, fence_ts=fence_ts))


def phase_durations(marks: Mapping[str, float]) -> dict[str, float]:
    """Phase → seconds from named timestamps; phases whose ends are missing are left out."""
    bounds = {"detect": ("interrupted", "decided"), "requeue_wait": ("decided", "fence"),
              "start": ("fence", "restore_begin"), "restore": ("restore_begin", "restored"),
              "first_step": ("restored", "running")}
    if "restore_begin" not in marks:
        bounds["start"] = ("fence", "running")
    return {p: max(0.0, marks[b] - marks[a]) for p, (a, b) in bounds.items()
            if a in marks and b in marks}


_NOT_INTERRUPTIONS = frozenset({FaultKind.SLOW.value, FaultKind.FSSTALL.value})
"""Injected faults that do not interrupt the gang: a straggler's pacing sleeps in every step
(a test keeps a run observable with it), a shared-filesystem stall blocks it for a while, and
their events are no evidence of a recovery."""


def _interrupted(entries: Sequence[Any], events: Sequence[Any], decided: float) -> float:
    times = [float(_field(ev, "ts")) for ev in events if _field(ev, "kind") == "fault_injected"
             and _field(ev, "data", {}).get("fault") not in _NOT_INTERRUPTIONS]
    times += [float(_field(e, "ts")) for e in entries if _field(e, "kind") == "fault"
              or _payload(e).get("event") == "fault_injected"]
    times += [float(_field(ev, "data", {}).get("start_ts", _field(ev, "ts"))) for ev in events
              if _field(ev, "kind") == "ckpt_commit"
              and _field(ev, "data", {}).get("reason") == "stop"]
    return min([*times, decided])


def _cause(entries: Sequence[Any]) -> str:
    faults = [str(_payload(e).get("fault")) for e in entries if _field(e, "kind") == "fault"]
    for preferred in ("node_failure", "hang"):
        if preferred in faults:
            return preferred
    return faults[0] if faults else "preemption"


def _last_step(events: Sequence[Any], entries: Sequence[Any]) -> int:
    steps = [int(_field(ev, "step", 0)) for ev in events if _field(ev, "kind") == "step"]
    steps += [int(_payload(e).get("step") or 0) for e in entries
              if _field(e, "kind") == "progress"]
    return max(steps, default=0)


def summarize(splits: Sequence[RtoSplit]) -> dict[str, dict[str, float]]:
    """Cause → mean seconds per phase and in total, for reports."""
    out: dict[str, dict[str, float]] = {}
    for cause in sorted({s.cause for s in splits}):
        mine = [s for s in splits if s.cause == cause]
        row = {p: sum(s.phases.get(p, 0.0) for s in mine) / len(mine) for p in PHASES}
        row["total"] = sum(s.total_s for s in mine) / len(mine)
        row["count"] = float(len(mine))
        out[cause] = row
    return out
