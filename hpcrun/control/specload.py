"""The generic loader under the run spec: a frozen dataclass from untrusted YAML, every problem
found in one pass.

1. :func:`build` walks a mapping against a dataclass's fields: each unknown key, each value of
   the wrong type or outside its :class:`~enum.StrEnum`, each missing required key is one
   :class:`FieldProblem`; nested sections are built the same way, so a problem in one section
   never hides a problem in another.
2. The dataclass is then constructed, with its defaults standing in for the fields that failed,
   so its ``__post_init__`` checks (bounds, cross-field rules) run too. Each check reports into
   a :class:`Checks` collector, which raises one :class:`InvalidSpecError` holding every
   problem; a problem whose key, or a key it reads (``reads``), failed in step 1 is dropped,
   since it was computed from a stand-in and not from what the user wrote.
3. The caller raises :class:`InvalidSpecError` with every problem, one line each.

Bounds are declared once, as field metadata (:func:`at_least`, :func:`above`): :func:`check_bounds`
enforces them and the spec reference (:mod:`hpcrun.control.specref`) lists them. ``ADDITIVE``
marks a field added within a schema version (left out of the canonical form at its default).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpcrun.errors import SpecError

ADDITIVE = types.MappingProxyType({"additive": True})
"""Field metadata of a field added within a spec schema version: left out of the canonical
form while it holds its default, so specs that do not use it keep their digest (and run
directories written before it keep verifying)."""
_HEAD_RE = re.compile(r"[.\[]")


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One invalid key: its dotted path, what was expected, what was found, and the fix."""

    key: str
    """Dotted key path (``resources.nodes``, ``resources.exclude[0]``)."""
    expected: str
    """What the key accepts."""
    found: object
    """What the spec holds there (``None`` when the key is missing)."""
    fix: str
    """How to fix it."""
    reads: tuple[str, ...] = ()
    """Other keys the check read (a cross-field rule): when one of them is itself invalid the
    problem is not reported, since it was judged against a stand-in value."""

    def line(self) -> str:
        """The problem as one line: ``key: expected E, found F; fix``."""
        return f"{self.key}: expected {self.expected}, found {self.found!r}; {self.fix}"

    def under(self, prefix: str) -> FieldProblem:
        """The same problem with ``prefix`` prepended to its key path (and to ``reads``)."""
        return FieldProblem(join(prefix, self.key), self.expected, self.found, self.fix,
                            tuple(join(prefix, r) for r in self.reads))

    def touches(self, names: Collection[str]) -> bool:
        """Whether the problem's key or a key it reads starts with one of ``names``."""
        return any(_HEAD_RE.split(k, maxsplit=1)[0] in names for k in (self.key, *self.reads))


class InvalidSpecError(SpecError):
    """A spec (or a section of one) with invalid keys: every problem found, one line each.

    Attributes:
        problems: the problems, in the order they were found.
        source: the file they were found in ("" for a value built in code).
    """

    def __init__(self, problems: Sequence[FieldProblem], *, source: str = "") -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__("\n".join(self.lines))

    @property
    def lines(self) -> tuple[str, ...]:
        """One line per problem, each naming the source file when there is one."""
        return tuple(f"{self.source}: {p.line()}" if self.source else p.line()
                     for p in self.problems)


class Checks:
    """The problems of one ``__post_init__``: every check runs, :meth:`done` raises them all."""

    __slots__ = ("problems",)

    def __init__(self) -> None:
        self.problems: list[FieldProblem] = []

    def __call__(self, ok: bool, key: str, expected: str, found: object, fix: str, *,
                 reads: tuple[str, ...] = ()) -> bool:
        """Record a problem unless ``ok``; return ``ok``."""
        if not ok:
            self.problems.append(FieldProblem(key, expected, found, fix, reads))
        return ok

    def done(self) -> None:
        """Raise :class:`InvalidSpecError` with every recorded problem, if any."""
        if self.problems:
            raise InvalidSpecError(self.problems)


# -- declared bounds -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Bound:
    """A numeric field's bound (``>= 1``, ``> 0``); None passes when the field is optional."""

    op: str
    """``>=`` or ``>``."""
    limit: int | float
    """The bound."""
    fix: str = ""
    """The fix the error names ("" for ``set KEY to ...``)."""

    def holds(self, value: Any, *, nullable: bool) -> bool:
        if value is None:
            return nullable
        return bool(value >= self.limit if self.op == ">=" else value > self.limit)

    def expected(self, *, integer: bool, nullable: bool) -> str:
        """``an integer >= 1``, ``a number > 0 or null``: what the error and the reference say."""
        kind = "an integer" if integer else "a number"
        return f"{kind} {self.op} {self.limit}" + (" or null" if nullable else "")

    def fix_for(self, name: str) -> str:
        if self.fix:
            return self.fix
        if self.op == ">=":
            return f"set {name} to {self.limit} or more"
        return f"set {name} to a positive value" if self.limit == 0 else \
            f"set {name} above {self.limit}"


def at_least(limit: int | float, *, fix: str = "") -> Mapping[str, Any]:
    """Field metadata: the value is ``>= limit`` (or null, for an optional field)."""
    return types.MappingProxyType({"bound": Bound(">=", limit, fix)})


def above(limit: int | float, *, fix: str = "") -> Mapping[str, Any]:
    """Field metadata: the value is ``> limit`` (or null, for an optional field)."""
    return types.MappingProxyType({"bound": Bound(">", limit, fix)})


def one_of(values: Iterable[str], *, keys: bool = False) -> Mapping[str, Any]:
    """Field metadata for the reference: the values a field's own check accepts (each item of
    a list; with ``keys``, each key of a mapping). Pass the constant the check uses."""
    return types.MappingProxyType({"allowed": tuple(str(v) for v in values), "keys": keys})


def field_bound(f: dataclasses.Field[Any]) -> Bound | None:
    """The bound declared on ``f``, if any."""
    bound = f.metadata.get("bound")
    return bound if isinstance(bound, Bound) else None


def numeric_kind(cls: type, name: str) -> tuple[bool, bool]:
    """(integer, nullable) of field ``name`` of dataclass ``cls``, from its type hint."""
    tp = type_hints(cls)[name]
    args = typing.get_args(tp)
    nullable = type(None) in args
    inner = [a for a in args if a is not type(None)] if args else [tp]
    return inner[0] is int, nullable


def check_bounds(value: Any, checks: Checks) -> None:
    """Check every declared bound of dataclass instance ``value`` into ``checks``."""
    for f in dataclasses.fields(value):
        bound = field_bound(f)
        if bound is None:
            continue
        integer, nullable = numeric_kind(type(value), f.name)
        found = getattr(value, f.name)
        checks(bound.holds(found, nullable=nullable), f.name,
               bound.expected(integer=integer, nullable=nullable), found, bound.fix_for(f.name))


def check_json_value(value: Any, key: str, checks: Checks) -> None:
    """Check that ``value`` (under ``key``) is plain JSON: string keys, finite numbers."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            checks(isinstance(k, str), key, "string keys", k, "quote the key")
            check_json_value(v, f"{key}.{k}", checks)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_json_value(v, f"{key}[{i}]", checks)
    elif isinstance(value, float):
        checks(math.isfinite(value), key, "a finite number", value, "use a finite value")
    else:
        checks(value is None or isinstance(value, str | int | bool), key,
               "a JSON value (mapping, list, string, number, bool, null)",
               type(value).__name__, "use plain YAML scalars")


# -- building a dataclass from a mapping --------------------------------------------------------

@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of dataclass ``cls`` (cached: specs are built often)."""
    return typing.get_type_hints(cls)


def is_required(f: dataclasses.Field[Any]) -> bool:
    """Whether a dataclass field has neither a default nor a default factory."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def field_default(f: dataclasses.Field[Any]) -> Any:
    """A field's default value (its factory called when it has one)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def join(path: str, key: str) -> str:
    """``path.key`` (either part may be empty)."""
    return f"{path}.{key}" if path and key else (path or key)


def build(cls: type, raw: object, path: str = "") -> tuple[Any, list[FieldProblem]]:
    """Construct dataclass ``cls`` from ``raw``, finding every problem in one pass.

    Returns:
        ``(instance, [])`` when ``raw`` is valid, else ``(None, problems)`` with every unknown
        key, wrong type, bad value and failed ``__post_init__`` check, keyed under ``path``.
    """
    if not isinstance(raw, Mapping):
        return None, [FieldProblem(path, "a mapping", raw, f"write {path} as `key: value`")]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    problems = [FieldProblem(join(path, str(k)), f"one of {sorted(fields)}", k,
                             "remove the key or fix its spelling" + _did_you_mean(k, fields))
                for k in raw if k not in fields]
    kwargs: dict[str, Any] = {}
    failed: set[str] = set()
    for key, value in raw.items():
        if key in fields:
            found: list[FieldProblem] = []
            converted = convert(type_hints(cls)[key], value, join(path, key), found)
            problems += found
            if found:
                failed.add(key)
            else:
                kwargs[key] = converted
    for name, f in fields.items():
        if name not in raw and is_required(f):
            problems.append(FieldProblem(join(path, name), "a value", None, "add the key"))
            failed.add(name)
    instance = _construct(cls, kwargs, failed, path, problems)
    return (None if problems else instance), problems


def _did_you_mean(key: object, names: Collection[str]) -> str:
    close = difflib.get_close_matches(str(key), list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _construct(cls: type, kwargs: dict[str, Any], failed: set[str], path: str,
               problems: list[FieldProblem]) -> Any:
    """``cls(**kwargs)`` with stand-ins for the ``failed`` fields, its checks into ``problems``."""
    stand_ins: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in failed and is_required(f):
            stand_in = _stand_in(type_hints(cls)[f.name])
            if stand_in is _NO_STAND_IN:
                return None
            stand_ins[f.name] = stand_in
    try:
        return cls(**kwargs, **stand_ins)
    except InvalidSpecError as exc:
        problems += [p.under(path) for p in exc.problems if not p.touches(failed)]
        return None


_NO_STAND_IN = object()


def _stand_in(tp: Any) -> Any:
    """A value of type ``tp`` for a required field that failed ("" for a string)."""
    args = typing.get_args(tp)
    if type(None) in args:
        return None
    try:
        return (typing.get_origin(tp) or tp)()
    except TypeError:
        return _NO_STAND_IN


def convert(tp: Any, value: Any, path: str, problems: list[FieldProblem]) -> Any:
    """``value`` as type ``tp``; each problem found is appended to ``problems``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return convert(inner[0], value, path, problems)
    if dataclasses.is_dataclass(tp):
        instance, found = build(tp, value, path)  # type: ignore[arg-type]
        problems += found
        return instance
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        allowed = [m.value for m in tp]
        if value not in allowed:
            problems.append(FieldProblem(path, f"one of {allowed}", value, "pick one of those"))
            return None
        return tp(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            problems.append(FieldProblem(path, "a list", value, f"write {path} as a list"))
            return None
        return tuple(convert(args[0], v, f"{path}[{i}]", problems) for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            problems.append(FieldProblem(path, "a mapping", value, f"write {path} as a mapping"))
            return None
        return {str(k): convert(args[1], v, join(path, str(k)), problems)
                for k, v in value.items()}
    return _scalar(tp, value, path, problems)


def _scalar(tp: Any, value: Any, path: str, problems: list[FieldProblem]) -> Any:
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _bounded_number(float(value), path, problems)
        problems.append(FieldProblem(path, "a number", value, "write a number"))
        return None
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return _bounded_number(value, path, problems) if tp is int else value
    problems.append(FieldProblem(path, f"a {tp.__name__}", value,
                                 f"write {path} as a {tp.__name__}"))
    return None


MAX_DURATION_S = (2**31 - 1) // 1000
"""The longest duration a ``*_s`` key may hold: a C int of milliseconds (about 24.8 days), what
the timeouts of sockets, gloo and NCCL accept; more overflows in the allocation, not at submit."""


def duration_expected(seconds: float) -> str | None:
    """What a positive duration setting (a timeout, a deadline) must be when ``seconds`` is
    not: finite, above 0 and at most :data:`MAX_DURATION_S`; None when it is."""
    if math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S:
        return None
    return (f"finite seconds, > 0 and at most {MAX_DURATION_S} (24.8 days: a C int of "
            "milliseconds, what socket, gloo and NCCL timeouts accept)")


def _bounded_number(value: int | float, path: str, problems: list[FieldProblem]) -> Any:
    """``value`` when it is finite and, for a duration (a key ending in ``_s``), within what the
    consumers of durations accept; None after recording the problem."""
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(FieldProblem(path, "a finite number", value,
                                     "write a finite value (or null where the key allows none)"))
        return None
    if path.endswith("_s") and abs(value) > MAX_DURATION_S:
        problems.append(FieldProblem(path, f"at most {MAX_DURATION_S} s (24.8 days)", value,
                                     "write a shorter duration"))
        return None
    return value


# -- the canonical form -------------------------------------------------------------------------

def to_plain(value: Any) -> Any:
    """JSON-ready form of a spec value; ``ADDITIVE`` fields at their default are left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.metadata.get("additive") and getattr(value, f.name) == field_default(f))}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def canonical(value: Any) -> Any:
    """One spelling per value: integral floats become integers (10.0 and 10 hash alike)."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
