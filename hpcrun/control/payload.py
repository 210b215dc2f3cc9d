"""The machinery under the run log's typed payloads: the kind enum, the payload base class,
field validation and the log's JSON encoding.

:mod:`hpcrun.control.entries` is the public face of the vocabulary (it re-exports these names);
:mod:`hpcrun.control.notes` builds the ``note`` payloads on the same base. The payload shapes are
part of log schema :data:`LOG_SCHEMA_VERSION`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from hpcrun.errors import MalformedEntryError, PayloadError

__all__ = ["LOG_SCHEMA_VERSION", "REQUIRED", "EntryKind", "EntryPayload", "FieldReader",
           "MalformedEntryError", "PayloadError", "canonical_json", "listed", "present"]

LOG_SCHEMA_VERSION = 1
"""Version of the entry envelope and of every payload shape."""


class EntryKind(StrEnum):
    """What a log entry records."""

    FENCE = "fence"            # an incarnation claims generation g+1
    STATE = "state"            # run state transition
    JOB = "job"                # a scheduler job id bound to the run
    OP = "op"                  # an action's intent, logged before it is sent, and its outcome
    HEARTBEAT = "heartbeat"    # one node's heartbeat summary
    PROGRESS = "progress"      # validated progress (step, tokens)
    COMMIT = "commit"          # a checkpoint committed on a tier
    DRAINED = "drained"        # one node drained a checkpoint to the shared tier
    CURSOR = "cursor"          # data cursor at a committed step
    FAULT = "fault"            # a classified failure
    QUARANTINE = "quarantine"  # a node excluded from later allocations
    RESULT = "result"          # terminal result / post-run manifest reference
    NOTE = "note"              # an observation for people and tools (see NoteEvent)
    SUPERVISE = "supervise"    # a surviving agent takes over supervision of the job start


def canonical_json(obj: Any, *, allow_nan: bool = False) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, ASCII only, one byte string per value.

    The encoding of log entries (which keep a NaN or infinity: ``allow_nan=True``), checkpoint
    manifests and the spec digest (which refuse them with ``ValueError``).
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=allow_nan).encode()


REQUIRED: Any = object()
"""Default of a field reader call: the field must be present."""


class FieldReader:
    """Reads typed fields out of one raw payload, remembering which keys it used."""

    def __init__(self, what: str, raw: Mapping[str, Any]) -> None:
        if not isinstance(raw, Mapping):
            raise PayloadError(f"{what} payload must be a JSON object, found "
                               f"{type(raw).__name__}; the log entry is damaged")
        self.what, self.raw, self.used = what, raw, set[str]()

    def _take(self, key: str, ok: Any, expected: str, default: Any) -> Any:
        self.used.add(key)
        value = self.raw.get(key)
        if value is None:
            if default is REQUIRED:
                raise PayloadError(f"{self.what} payload lacks {key!r} ({expected}); the entry "
                                   "was written by an incompatible hpcrun or is damaged")
            return default
        if not ok(value):
            raise PayloadError(f"{self.what} payload field {key!r} must be {expected}, found "
                               f"{value!r}; the entry was written by an incompatible hpcrun "
                               "or is damaged")
        return value

    def text(self, key: str, default: Any = REQUIRED) -> Any:
        return self._take(key, lambda v: isinstance(v, str), "a string", default)

    def integer(self, key: str, default: Any = REQUIRED) -> Any:
        return self._take(key, _is_int, "an integer", default)

    def number(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._take(key, lambda v: _is_int(v) or isinstance(v, float), "a number",
                           default)
        return float(value) if value is not None and value is not default else value

    def flag(self, key: str, default: Any = REQUIRED) -> Any:
        return self._take(key, lambda v: isinstance(v, bool), "true or false", default)

    def texts(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._take(key, lambda v: isinstance(v, list) and all(
            isinstance(x, str) for x in v), "a list of strings", default)
        return tuple(value) if isinstance(value, list) else value

    def integers(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._take(key, lambda v: isinstance(v, list) and all(map(_is_int, v)),
                           "a list of integers", default)
        return tuple(value) if isinstance(value, list) else value

    def mapping(self, key: str, default: Any = REQUIRED) -> Any:
        return self._take(key, lambda v: isinstance(v, dict), "a JSON object", default)

    def choice(self, key: str, enum: type[StrEnum], default: Any = REQUIRED, *,
               only: Collection[StrEnum] | None = None) -> Any:
        members = {m.value for m in (enum if only is None else only)}
        names = ", ".join(m.value for m in enum if m.value in members)
        value = self._take(key, lambda v: isinstance(v, str) and v in members,
                           f"one of {names}", default)
        return enum(value) if isinstance(value, str) else value

    def extra(self) -> dict[str, Any]:
        """The keys no field took: a newer writer's fields, kept and written back."""
        return {k: v for k, v in self.raw.items() if k not in self.used}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def present(**fields: Any) -> dict[str, Any]:
    """Optional fields that are set (None means unset and is left out)."""
    return {k: v for k, v in fields.items() if v is not None}


def listed(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else list(values)


P = TypeVar("P", bound="EntryPayload")


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryPayload(ABC):
    """Base of every payload: its kind, and the fields this version does not know.

    A subclass sets ``KIND``, declares its fields, and implements :meth:`fields` (encode) and
    :meth:`read_fields` (decode with a :class:`FieldReader`).
    """

    KIND: ClassVar[EntryKind]
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields of a newer writer, kept so they are written back unchanged."""

    @property
    def entry_kind(self) -> str:
        """The ``kind`` of the entry that carries this payload."""
        return self.KIND.value

    @abstractmethod
    def fields(self) -> dict[str, Any]:
        """This kind's own fields, as JSON values (unset optional fields left out)."""

    def to_payload(self) -> dict[str, Any]:
        """The JSON object stored in the entry."""
        return {**self.extra, **self.fields()}

    @classmethod
    def reader(cls, raw: Mapping[str, Any]) -> FieldReader:
        """A field reader over ``raw`` that names this payload in its errors."""
        return FieldReader(f"{cls.KIND.value} entry", raw)

    @classmethod
    def from_payload(cls: type[P], raw: Mapping[str, Any]) -> P:
        """Validate a payload read back from the log.

        Raises:
            PayloadError: a field is missing or of the wrong type.
        """
        f = cls.reader(raw)
        return cls(**cls.read_fields(f), extra=f.extra())

    @classmethod
    @abstractmethod
    def read_fields(cls, f: FieldReader) -> dict[str, Any]:
        """This kind's fields read out of a raw payload (constructor keywords)."""
