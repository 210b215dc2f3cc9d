"""Rules of docs/architecture.md that import-linter does not check, read from the source with ast.

- every error hpcrun raises derives from HpcrunError (a bare builtin raise is allowed only as a
  protocol signal, listed below with its reason);
- no private name (``_x``) and no private module is imported across modules.

The layer order itself is checked by ``lint-imports`` (setup.cfg) in ``make lint``.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcrun.errors
from hpcrun.errors import HpcrunError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpcrun"

BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))

PROTOCOL_RAISES = {
    ("__next__", "StopIteration"): "the iterator protocol ends iteration with StopIteration",
    ("__getattr__", "AttributeError"): "hasattr() and getattr(x, name, default) rely on "
                                       "AttributeError from __getattr__",
}
"""(enclosing function, builtin) → why that bare raise is the protocol, not an error."""

def bare_raises(source: str) -> Iterator[tuple[int, str, str]]:
    """(line, enclosing function, builtin name) of each ``raise <Builtin>(...)`` in ``source``."""

    def visit(node: ast.AST, func: str) -> Iterator[tuple[int, str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN_EXCEPTIONS:
                    yield child.lineno, func, exc.id
            yield from visit(child, func)

    yield from visit(ast.parse(source), "<module>")


def private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of each import of a private name or from a private module in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                if private(alias.name) or any(private(p) for p in module.split(".")):
                    yield node.lineno, f"from {'.' * node.level}{module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(private(p) for p in alias.name.split(".")):
                    yield node.lineno, f"import {alias.name}"


def sources() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_the_checkers_find_what_they_look_for() -> None:
    snippet = ("def f():\n    raise ValueError('x')\n"
               "class It:\n    def __next__(self):\n        raise StopIteration\n"
               "from hpcrun.data.manifest import _source\nimport hpcrun._hidden\n")
    assert list(bare_raises(snippet)) == [(2, "f", "ValueError"), (5, "__next__", "StopIteration")]
    assert [what for _, what in private_imports(snippet)] == [
        "from hpcrun.data.manifest import _source", "import hpcrun._hidden"]


def test_no_bare_builtin_raise_outside_the_protocol_signals() -> None:
    found: list[str] = []
    for rel, text in sources():
        found += [f"{rel}:{line}: raise {name} in {func}()" for line, func, name
                  in bare_raises(text) if (func, name) not in PROTOCOL_RAISES]
    assert not found, (
        "raise an hpcrun.errors class (it also derives from the builtin, so `except ValueError` "
        "callers keep working; add a subclass to errors.py if none fits):\n" + "\n".join(found))


def test_no_private_name_is_imported_across_modules() -> None:
    found = [f"{rel}:{line}: {what}" for rel, text in sources()
             for line, what in private_imports(text)]
    assert not found, ("a private name is for its own module: make it public (and document it "
                       "in the package README) or move the code:\n" + "\n".join(found))


def test_exception_classes_are_defined_on_the_taxonomy() -> None:
    """No class outside errors.py derives directly from a builtin exception."""
    found = []
    for rel, text in sources():
        if rel == "hpcrun/errors.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                found += [f"{rel}:{node.lineno}: {node.name}({b})"
                          for b in sorted(bases & BUILTIN_EXCEPTIONS)]
    assert not found, "derive from an hpcrun.errors class instead:\n" + "\n".join(found)


def test_every_error_class_has_the_root_and_a_builtin() -> None:
    classes = [v for v in vars(hpcrun.errors).values()
               if isinstance(v, type) and issubclass(v, BaseException)]
    assert classes and all(issubclass(c, HpcrunError) for c in classes)
    generic = {HpcrunError, Exception, BaseException, object}
    for cls in classes:
        if cls is HpcrunError:
            continue
        builtin_bases = [b for b in cls.__mro__
                         if b not in generic and b.__module__ == "builtins"]
        assert builtin_bases, f"{cls.__name__} needs the builtin it resembles as a second base"


def test_converted_raises_are_both_hpcrun_errors_and_their_builtin() -> None:
    from hpcrun.data.permutation import Permutation
    from hpcrun.launch.env import derive_master_port
    from hpcrun.protocols import Event

    with pytest.raises(ValueError, match=">= 0") as bad_port:
        derive_master_port("1", -1, 0)
    with pytest.raises(IndexError, match="out of range") as bad_index:
        Permutation(4, seed=0, epoch=0)[4]
    with pytest.raises(ValueError, match="not an hpcrun event") as bad_event:
        Event.from_json('{"kind": "step"}')
    for caught in (bad_port, bad_index, bad_event):
        assert isinstance(caught.value, HpcrunError), type(caught.value)
