"""Every example and benchmark module imports: a name moved in hpcrun breaks this suite, not a user.

`make demo` once failed with an ImportError for a whole round because nothing imported
`examples/tiny_lm/demo.py`; this walks every module under ``examples/`` and ``benchmarks/`` (new
ones included, without a list to keep) and imports each in one fresh interpreter, reporting every
module that fails, not only the first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("examples", "benchmarks")

# Imports each named module (``pkg.mod``), or runs each script (``path/to/x.py``: a folder without
# ``__init__.py`` holds plain scripts that import their siblings) under a name other than
# ``__main__`` with its folder first on sys.path, catching everything; prints {name: "Error: ..."}.
_PROBE = """
import importlib, json, runpy, sys, traceback
failed = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    try:
        if name.endswith(".py"):
            folder = name.rsplit("/", 1)[0]
            sys.path.insert(0, folder)
            try:
                runpy.run_path(name, run_name="__probe__")
            finally:
                sys.path.remove(folder)
                for new in set(sys.modules) - before:  # siblings: another folder has its own
                    if getattr(sys.modules[new], "__file__", "").startswith(folder):
                        del sys.modules[new]
        else:
            importlib.import_module(name)
    except BaseException as exc:
        failed[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps(failed))
"""


def module_names(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Dotted names of every module under ``packages`` (``__init__`` as its package), and the
    paths of the plain scripts (``.py`` files in folders without an ``__init__.py``)."""
    names = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if not (path.parent / "__init__.py").exists():
                names.append(str(rel))
                continue
            rel = rel.with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.append(".".join(parts))
    return names


def import_failures(modules: list[str]) -> dict[str, str]:
    """Import ``modules`` in a fresh interpreter at the repository root; the ones that failed."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *modules], cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, f"the import probe itself failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_walk_finds_the_demo_and_the_benchmark_entries() -> None:
    names = module_names(REPO, PACKAGES)
    assert {"examples.tiny_lm.demo", "benchmarks.__main__", "benchmarks.gpu.check"} <= set(names)


def test_the_probe_reports_a_module_or_a_script_that_does_not_import(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("from sibling_that_is_not_there import x\n")
    failed = import_failures(["json", "examples.no_such_module", str(script)])
    assert set(failed) == {"examples.no_such_module", str(script)}


def test_every_example_and_benchmark_module_imports() -> None:
    # `__main__` modules and scripts guard their work with `if __name__ == "__main__"`; importing
    # them by name runs only their definitions.
    failed = import_failures(module_names(REPO, PACKAGES))
    assert not failed, "modules that do not import:\n" + "\n".join(
        f"  {name}: {why}" for name, why in sorted(failed.items()))
