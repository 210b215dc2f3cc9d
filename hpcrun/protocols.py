"""The seams every plane plugs into, defined once.

- :class:`Stateful`: anything with ``state_dict``/``load_state_dict`` (torch modules, optimizers,
  schedulers, the data cursor, user objects) that a checkpoint saves and restores.
- :class:`InputWaitSource`: a loader that measures how long each step waited for its batch.
- :class:`RunContext`: what a training ``main(ctx)`` receives (filled in by ``hpcrun.runtime``).
- :class:`Event`: the record every observability event is written as (``hpcrun.observe``).
- :class:`CursorEnvelope`: the versioned envelope around a data cursor (``hpcrun.data``).
- :class:`~hpcrun.clock.Clock`, :class:`~hpcrun.runner.CommandRunner`,
  :class:`~hpcrun.storage.Storage`: time, subprocesses and files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from hpcrun.clock import Clock
from hpcrun.errors import DataError, FormatError
from hpcrun.runner import CommandResult, CommandRunner
from hpcrun.storage import Storage

__all__ = [
    "EVENT_SCHEMA_VERSION",
    "Clock",
    "CommandResult",
    "CommandRunner",
    "CursorEnvelope",
    "CursorSource",
    "Event",
    "InputWaitSource",
    "RunContext",
    "Stateful",
    "Storage",
]


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint saves and restores."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], /) -> Any: ...


@runtime_checkable
class InputWaitSource(Protocol):
    """A data loader that measures how long its caller waited for each batch.

    ``ctx.step_done()`` asks every object registered with ``ctx.restore(...)`` that has this
    method, so a step's event carries its input wait without a change to the training loop
    (:class:`hpcrun.data.pipeline.DataPipeline` implements it).
    """

    def take_input_wait(self) -> float:
        """Seconds waited for batches handed out since the previous call (each counted once)."""
        ...


@runtime_checkable
class CursorSource(Protocol):
    """A data loader whose position a commit publishes (a CURSOR entry beside the PROGRESS).

    The context asks the objects registered with ``ctx.restore(...)`` for this method when a
    save starts (:class:`hpcrun.data.pipeline.DataPipeline` implements it).
    """

    def cursor_envelope(self) -> dict[str, Any]:
        """The position of the next batch, as a :class:`CursorEnvelope` dict."""
        ...


@runtime_checkable
class RunContext(Protocol):
    """The object a training ``main(ctx)`` receives.

    A script builds its model, optimizer and loader, calls ``ctx.restore(...)``, then loops
    ``for step in ctx.steps(total):`` and calls ``ctx.step_done(...)`` after each optimizer step.
    Signals, checkpoint cadence, commits and requeue are hpcrun's job.
    """

    rank: int
    """Global rank of this process."""
    local_rank: int
    """Rank within this node."""
    node_rank: int
    """Index of this node in the allocation."""
    world_size: int
    """Number of ranks in the gang."""
    generation: int
    """Fencing token of this incarnation of the run."""

    @property
    def device(self) -> Any:
        """``torch.device`` this rank computes on (``cuda:<local_rank>`` or ``cpu``)."""
        ...

    @property
    def spec(self) -> Any:
        """The frozen :class:`hpcrun.control.spec.RunSpec`."""
        ...

    @property
    def config(self) -> Mapping[str, Any]:
        """The free-form user config from the spec."""
        ...

    def restore(self, **state: Stateful) -> int:
        """Register ``state`` for checkpoints and load the newest committed checkpoint into it.

        Returns the step to start from (0 on a fresh start).
        """
        ...

    def steps(self, total: int) -> Iterator[int]:
        """Yield step numbers from the restored step to ``total``; stop at an agreed boundary."""
        ...

    def step_done(self, *, tokens: int = 0, loss: float | None = None,
                  input_wait_s: float | None = None, **metrics: float) -> None:
        """Report the optimizer step as done: heartbeat, progress, cursor, maybe a checkpoint.

        ``tokens`` are this rank's for the step; hpcrun sums them over the gang at the next
        step boundary, so progress and status report the whole gang's tokens.
        ``input_wait_s`` is how long the step waited for its batch; when omitted it is what
        the registered :class:`InputWaitSource` objects and ``with ctx.input_wait():`` blocks
        measured during the step (None in the step event when nothing measured it).
        """
        ...

    def input_wait(self) -> AbstractContextManager[None]:
        """Time the enclosed block as input wait of the current step (for a user's own loader)."""
        ...

    def run_step(self, fn: Callable[[Any], Any], batch: Any) -> Any:
        """Run the optimizer step ``fn(batch)`` and return what it returns (the loss).

        Registered this way, a step that looks corrupted (replicas disagree, a non-finite or
        spiking loss) can be replayed from the last checked state with the same inputs, which
        tells a faulty device from bad data. ``fn`` must do the whole step from ``batch`` alone,
        deterministically, without other side effects.
        """
        ...


EVENT_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One structured event, written as one JSON line."""

    kind: str
    """What happened (``step``, ``span``, ``checkpoint``, ``fault``, ...)."""
    ts: float
    """Wall-clock seconds since the epoch."""
    run_id: str
    """The run this belongs to."""
    generation: int
    """Generation (fencing token) of the writer."""
    step: int
    """Global optimizer step at the time of the event."""
    rank: int = -1
    """Global rank of the writer, -1 for an agent or the CLI."""
    node: str = ""
    """Hostname of the writer."""
    dataset_id: str = ""
    """Dataset ID the run consumes."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """hpcrun / torch / python versions of the writer."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific payload (durations in seconds, counts, names)."""
    schema_version: int = EVENT_SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Event:
        raw = json.loads(line)
        if not isinstance(raw, dict) or raw.get("schema_version") != EVENT_SCHEMA_VERSION:
            raise FormatError(f"not an hpcrun event of schema {EVENT_SCHEMA_VERSION} (a JSON "
                              f"object with schema_version {EVENT_SCHEMA_VERSION}): {line[:80]!r}")
        return cls(**raw)


CURSOR_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CursorEnvelope:
    """The versioned envelope a data cursor travels in (inside checkpoints and log entries)."""

    kind: str
    """Which cursor implementation wrote ``state`` (e.g. ``hpcrun.data.cursor/1``)."""
    algorithm_version: int
    """Version of the order algorithm (permutation, mixture, packer) that ``state`` assumes."""
    dataset_id: str
    """Dataset the position refers to."""
    state: Mapping[str, Any]
    """JSON-serialisable position (position, epoch, mixture counts, packer residual)."""
    schema_version: int = CURSOR_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CursorEnvelope:
        if raw.get("schema_version") != CURSOR_SCHEMA_VERSION:
            raise DataError(
                f"cursor schema_version is {raw.get('schema_version')!r}, expected "
                f"{CURSOR_SCHEMA_VERSION}; this checkpoint was written by another hpcrun version"
            )
        return cls(**{k: raw[k] for k in ("kind", "algorithm_version", "dataset_id", "state",
                                           "schema_version")})

    def check_compatible(self, *, dataset_id: str, algorithm_version: int) -> None:
        """Raise :class:`DataError` printing both sides when this cursor cannot resume here."""
        if (self.dataset_id, self.algorithm_version) != (dataset_id, algorithm_version):
            raise DataError(
                "cursor does not match this run's data: checkpoint has "
                f"dataset_id={self.dataset_id} algorithm_version={self.algorithm_version}, "
                f"run has dataset_id={dataset_id} algorithm_version={algorithm_version}; "
                "resume with the same dataset manifest and hpcrun data version, or start fresh"
            )
