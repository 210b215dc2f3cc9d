"""Where a rank's start goes: timestamps on the real start path, one ``startup`` event per rank.

The *start* phase of a recovery (:mod:`hpcrun.drill.rto`: the new fence to the first
``restore`` span) is split into parts, each ending at a mark the rank records as it passes it:

- ``hand_off``: from the new fence until the agent hands the rank its environment (a warm
  process's pipe, or a cold spawn);
- ``process``: until the rank's code runs (cold: interpreter start and the worker's own
  imports; warm: reading the hand-off, or the rest of its imports when it was not ready);
- ``imports``: :func:`~hpcrun.runtime.rank.worker.build_context`'s imports (torch, the checkpoint
  plane);
- ``groups``: the process groups (TCPStore and gloo/NCCL rendezvous);
- ``context``: the Checkpointer, event writer and Context;
- ``entrypoint``: importing the user's ``module:function``;
- ``user_setup``: until the first ``restore`` span begins (model, optimizer, data pipeline:
  the training script).

The agent stamps the hand-off time into the rank's environment (:data:`HANDED_AT_ENV`); the rank
records the rest (:class:`StartMarks`) and emits them as one ``startup`` event (``data.marks``:
mark → wall time) once its entrypoint is imported. :func:`start_parts` (pure) turns the marks of
a generation's ranks into part → seconds (median over ranks), which the RTO tools print.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcrun.observe.events import EventWriter

HANDED_AT_ENV = "HPCRUN_HANDED_AT"
"""The wall time (seconds since the epoch) at which the agent handed the rank its environment."""
STARTUP_EVENT = "startup"
"""The event kind carrying one rank's marks."""
PARTS = ("hand_off", "process", "imports", "groups", "context", "entrypoint", "user_setup")
"""Parts of the start phase, in order (see the module docstring)."""
_MARKS = ("process", "imports", "groups", "context", "entrypoint")
"""The marks a rank records itself, in order (``handed`` comes from its agent)."""


class StartMarks:
    """One rank's start marks (wall times), emitted once as a ``startup`` event."""

    def __init__(self, environ: Mapping[str, str], *, now: float | None = None) -> None:
        self.marks: dict[str, float] = {}
        # started by something other than an agent: no hand-off time
        with contextlib.suppress(ValueError):
            self.marks["handed"] = float(environ.get(HANDED_AT_ENV, ""))
        self.marks["process"] = time.time() if now is None else now
        self._writer: EventWriter | None = None

    def mark(self, name: str) -> None:
        """Record that the rank just passed ``name``."""
        self.marks[name] = time.time()

    def bind(self, writer: EventWriter) -> None:
        """The rank's event writer, once it exists (the marks are emitted through it)."""
        self._writer = writer

    def emit(self) -> None:
        """Emit the ``startup`` event (no-op before :meth:`bind`)."""
        if self._writer is not None:
            self._writer.emit(STARTUP_EVENT, 0, marks=dict(self.marks))


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def rank_parts(marks: Mapping[str, float], *, fence_ts: float | None,
               restore_begin: float | None) -> dict[str, float]:
    """Part → seconds for one rank's marks (pure); parts whose ends are missing are left out."""
    points: list[tuple[str, float | None]] = [
        ("fence", fence_ts), ("handed", marks.get("handed")),
        *((m, marks.get(m)) for m in _MARKS), ("restore", restore_begin)]
    names = dict(zip([p for p, _ in points[1:]], PARTS, strict=True))
    out: dict[str, float] = {}
    last: float | None = None
    for point, ts in points:
        if ts is not None and last is not None and point in names:
            out[names[point]] = max(0.0, ts - last)
        last = ts if ts is not None else None
    return out


def start_parts(events: Iterable[Any], generation: int, *,
                fence_ts: float | None = None) -> dict[str, float]:
    """Part → median seconds over the ranks of ``generation`` (pure; {} without marks).

    Args:
        events: rank events (:class:`~hpcrun.protocols.Event` or their dicts), any order.
        generation: the incarnation whose start to split.
        fence_ts: when its fence was claimed (the start of ``hand_off``).
    """
    marks: dict[int, Mapping[str, float]] = {}
    restore: dict[int, float] = {}
    for ev in events:
        if int(_field(ev, "generation", -1)) != generation:
            continue
        rank, data = int(_field(ev, "rank", -1)), _field(ev, "data", {}) or {}
        if _field(ev, "kind") == STARTUP_EVENT and isinstance(data.get("marks"), Mapping):
            marks[rank] = {str(k): float(v) for k, v in data["marks"].items()
                           if isinstance(v, int | float)}
        elif _field(ev, "kind") == "restore":
            restore[rank] = float(data.get("start_ts", _field(ev, "ts")))
    per_rank = [rank_parts(m, fence_ts=fence_ts, restore_begin=restore.get(r))
                for r, m in marks.items()]
    return {p: statistics.median(vals) for p in PARTS
            if (vals := [parts[p] for parts in per_rank if p in parts])}
