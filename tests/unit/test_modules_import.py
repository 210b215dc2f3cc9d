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

# Imports each named module, catching everything, and prints {module: "Error: message"} as JSON.
_PROBE = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps(failed))
"""


def module_names(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Dotted names of every ``.py`` module under ``packages`` (``__init__`` as its package)."""
    names = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
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


def test_the_probe_reports_a_module_that_does_not_import() -> None:
    assert set(import_failures(["json", "examples.no_such_module"])) == {"examples.no_such_module"}


def test_every_example_and_benchmark_module_imports() -> None:
    # `__main__` modules and scripts guard their work with `if __name__ == "__main__"`; importing
    # them by name runs only their definitions.
    failed = import_failures(module_names(REPO, PACKAGES))
    assert not failed, "modules that do not import:\n" + "\n".join(
        f"  {name}: {why}" for name, why in sorted(failed.items()))
