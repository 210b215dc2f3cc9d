"""The reference of a config file, generated from its frozen dataclasses (pure).

:func:`reference_rows` walks any frozen dataclass (the run spec's :class:`RunSpec`, the site's
``SiteConfig``) and yields one :class:`RefRow` per key, nested sections as dotted paths
(``resources.nodes``): its type from the type hint, its default, its allowed values (the
members of a ``StrEnum``, the bound declared with :func:`~hpcrun.control.specload.at_least` /
:func:`~hpcrun.control.specload.above`), its meaning (the docstring written right after the
field, read from the source with :mod:`ast`) and whether it enters the spec digest (``ADDITIVE``
fields only when they differ from their default). A field added to a dataclass appears in the
reference without any other change; ``docs/spec.md`` and ``docs/site.md`` are
:meth:`Reference.markdown` of these rows (``make spec-docs``), and ``hpcrun spec explain``
prints :meth:`Reference.text`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpcrun.control.spec import RunSpec
from hpcrun.control.specload import (
    canonical,
    field_bound,
    field_default,
    is_required,
    join,
    to_plain,
    type_hints,
)
from hpcrun.errors import HpcrunError, SpecError

_ROLE_RE = re.compile(r":[a-z]+:`~?([^`]+)`")
_TYPE_WORDS = {int: "integer", float: "number", str: "string", bool: "boolean"}


class DigestRule(StrEnum):
    """Whether a key's value enters the spec digest (``spec_id``)."""

    ALWAYS = "yes"
    """Always written into the canonical JSON."""
    WHEN_SET = "when not default"
    """``ADDITIVE``: written only when it differs from its default, so older specs keep their id."""
    WITH_SECTION = "when its section is not default"
    """Inside an ``ADDITIVE`` section: written when any key of the section is set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RefRow:
    """One key of a config file, as the reference lists it."""

    key: str
    """Dotted key path (``resources.nodes``)."""
    type: str
    """What the value is (``integer``, ``list of strings``, ``section``)."""
    default: str
    """The default, as JSON (``required`` for a key without one, "" for a section)."""
    allowed: str
    """Allowed values: ``StrEnum`` members or a declared bound ("" when any of the type)."""
    meaning: str
    """One line: the field's docstring."""
    digest: DigestRule | None
    """Whether the key enters the spec digest (None for a file that has no digest)."""
    section: bool = False
    """Whether the key is a section holding more keys."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    """A config file's reference: a title, an introduction and its rows."""

    title: str
    """The page's title (``run.yaml reference``)."""
    intro: str
    """Paragraphs printed under the title in Markdown."""
    what: str
    """What the keys belong to, for errors (``run.yaml``)."""
    command: str
    """The command that lists every key (``hpcrun spec explain``)."""
    rows: tuple[RefRow, ...]
    """Every key, in field order, sections followed by their keys."""

    def select(self, key: str | None, *, error: type[HpcrunError] = SpecError
               ) -> tuple[RefRow, ...]:
        """The rows of ``key`` (a key, or a section and every key under it); every row for None.

        Raises:
            HpcrunError: (``error``) ``key`` is not a key of the file, naming the closest keys.
        """
        if key is None:
            return self.rows
        hits = tuple(r for r in self.rows if r.key == key or r.key.startswith(key + "."))
        if hits:
            return hits
        keys = [r.key for r in self.rows]
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5) or [
            k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]][:3]
        hint = f"did you mean {' or '.join(repr(k) for k in close)}? " if close else ""
        example = next((k for k in keys if "." in k), keys[0])
        raise error(f"unknown key {key!r}: expected a key of {self.what} (a dotted path such "
                    f"as {example!r}); {hint}run `{self.command}` to list every key")

    def text(self, rows: Sequence[RefRow] | None = None) -> str:
        """Plain text for a terminal: per key, a line of facts and a line of meaning."""
        return "\n".join(_text_row(r) for r in (self.rows if rows is None else rows)) + "\n"

    def markdown(self) -> str:
        """The whole reference as a Markdown page (what ``docs/spec.md`` holds)."""
        out = [f"# {self.title}", "", self.intro.strip(), ""]
        top = [r for r in self.rows if "." not in r.key]
        out += _table(top, digest=self.rows[0].digest is not None)
        for section in (r for r in self.rows if r.section):
            children = [r for r in self.rows if r.key.rpartition(".")[0] == section.key]
            out += ["", f"## `{section.key}`", "", section.meaning, ""]
            out += _table(children, digest=section.digest is not None)
        return "\n".join(out) + "\n"


def reference_rows(cls: type, *, digest: bool = True) -> tuple[RefRow, ...]:
    """One row per key of frozen dataclass ``cls``, nested sections as dotted paths.

    Args:
        cls: the dataclass describing the file (its fields' docstrings give the meanings).
        digest: whether the file has a digest (``ADDITIVE`` metadata decides per key).
    """
    return tuple(_rows(cls, "", DigestRule.ALWAYS if digest else None))


def _rows(cls: type, prefix: str, parent: DigestRule | None) -> Iterator[RefRow]:
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        tp = type_hints(cls)[f.name]
        rule = _digest_rule(f, parent)
        inner = section_type(tp)
        yield RefRow(key=join(prefix, f.name), type=describe_type(tp),
                     default=describe_default(f), allowed=describe_allowed(f, tp),
                     meaning=docs.get(f.name, ""), digest=rule, section=inner is not None)
        if inner is not None:
            yield from _rows(inner, join(prefix, f.name), rule)


def _digest_rule(f: dataclasses.Field[Any], parent: DigestRule | None) -> DigestRule | None:
    if parent is None:
        return None
    if f.metadata.get("additive"):
        return DigestRule.WHEN_SET
    return DigestRule.ALWAYS if parent is DigestRule.ALWAYS else DigestRule.WITH_SECTION


@functools.cache
def field_docs(cls: type) -> Mapping[str, str]:
    """Each field's docstring (the string right after it in the class body), on one line."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = one_line(after.value.value)
    return docs


def one_line(doc: str) -> str:
    """A docstring on one line, Sphinx roles and double backticks as plain code spans."""
    text = _ROLE_RE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", " ".join(doc.split()))
    return text.replace("``", "`")


def section_type(tp: Any) -> type | None:
    """The dataclass a field of type ``tp`` holds (``X`` or ``X | None``), if any."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def describe_type(tp: Any) -> str:
    """``integer``, ``number or null``, ``list of strings``, ``mapping string -> integer``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(describe_type(a) for a in inner)
        return f"{text} or null" if type(None) in args else text
    if dataclasses.is_dataclass(tp):
        return "section"
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return "string"
    if origin is tuple:
        return f"list of {describe_type(args[0])}s"
    if origin is Mapping:
        return f"mapping {describe_type(args[0])} -> {describe_type(args[1])}"
    if tp is Any:
        return "any JSON value"
    return _TYPE_WORDS.get(tp, getattr(tp, "__name__", str(tp)))


def describe_default(f: dataclasses.Field[Any]) -> str:
    """The default as JSON; ``required`` without one; "" for a section with its own keys."""
    if is_required(f):
        return "required"
    value = field_default(f)
    if dataclasses.is_dataclass(value):
        return ""
    return json.dumps(canonical(to_plain(value)), ensure_ascii=False)


def describe_allowed(f: dataclasses.Field[Any], tp: Any) -> str:
    """The members of the field's ``StrEnum``, its declared values (``one_of``), its declared
    bound, or ""."""
    enum = next((a for a in (tp, *typing.get_args(tp))
                 if isinstance(a, type) and issubclass(a, StrEnum)), None)
    if enum is not None:
        return ", ".join(m.value for m in enum)
    if "allowed" in f.metadata:
        return ("keys: " if f.metadata["keys"] else "") + ", ".join(f.metadata["allowed"])
    bound = field_bound(f)
    return f"{bound.op} {bound.limit}" if bound is not None else ""


def _text_row(row: RefRow) -> str:
    facts = [row.type]
    if row.default:
        facts.append(row.default if row.default == "required" else f"default {row.default}")
    if row.allowed:
        facts.append(f"allowed: {row.allowed}")
    if row.digest is not None:
        facts.append(f"in the spec digest: {row.digest}")
    return f"{row.key}: {'; '.join(facts)}\n    {row.meaning}"


def _table(rows: Sequence[RefRow], *, digest: bool) -> list[str]:
    head = ["key", "type", "default", "allowed", *(["in digest"] if digest else []), "meaning"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r.key}`" + (f" ([section](#{_anchor(r.key)}))" if r.section else ""),
                 r.type, f"`{r.default}`" if r.default not in ("", "required") else r.default,
                 r.allowed, *([str(r.digest)] if digest else []), r.meaning]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", key.lower())


SPEC_INTRO = """\
Every key a run spec (`run.yaml`) accepts, generated from the spec's own dataclasses
(`hpcrun/control/spec.py`) by `make spec-docs`; edit the field docstrings there, not this page.
`hpcrun spec explain [KEY]` prints the same in a terminal.

Nested keys are written as YAML sections (`resources:` then `  nodes: 2`); this page names them
by dotted path (`resources.nodes`). An unknown key is an error, never ignored, and
`hpcrun submit` lists every problem of a spec at once. *In digest* says whether the key's value
enters the spec digest (`spec_id`, the SHA-256 of the canonical JSON): keys added within a
schema version enter it only when they differ from their default, so older specs keep their id.
"""


def spec_reference() -> Reference:
    """The ``run.yaml`` reference (:class:`~hpcrun.control.spec.RunSpec`)."""
    return Reference(title="run.yaml reference", intro=SPEC_INTRO, what="run.yaml",
                     command="hpcrun spec explain", rows=reference_rows(RunSpec))
