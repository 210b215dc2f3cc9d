"""Admission: what ``hpcrun submit`` checks before a run record exists, as values (pure).

Every check yields typed findings: a :class:`Problem` (the run would fail; names what is wrong,
what was expected and the fix), a :class:`Skipped` (what could not be checked here, and why) or
a :class:`Passed`. :func:`assemble` turns them into one :class:`AdmissionReport`; submit
refuses the run, before anything is created, when the report holds any problem, and prints
every problem on its own line. The probes that produce findings (they run commands and touch
the filesystem) are in :mod:`hpcrun.launch.admit`; this module holds the decisions: which data
objects are hashed, which part of a node-local template can be checked on a login node, what
``sinfo``/``sacctmgr`` printed and whether the job's partition, account and QoS are among it,
and what the entrypoint probe's answer means.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from hpcrun.errors import AdmissionError, ConfigError
from hpcrun.launch.site import expand_path, path_variables


class CheckKind(StrEnum):
    """What a finding is about; reports list findings in this order."""

    SPEC = "spec"
    SITE = "site"
    ENTRYPOINT = "entrypoint"
    DATA = "data"
    STORAGE = "storage"
    SCHEDULER = "scheduler"


class VerifyData(StrEnum):
    """How many data objects submit hashes in full (``--verify-data``)."""

    ALL = "all"
    """Every object (as long as reading the whole dataset takes)."""
    SAMPLE = "sample"
    """A bounded, deterministic sample (:func:`sample_objects`); every object is still stat'ed."""
    NONE = "none"
    """No object is opened; the manifest is still parsed, shape- and seal-checked."""


SAMPLE_OBJECTS = 8
"""Most objects hashed in full by ``--verify-data sample``."""
SAMPLE_BYTES = 2 << 30
"""Most bytes hashed by ``--verify-data sample`` (one object is hashed whatever its size)."""
MAX_LISTED = 20
"""Most problems of one kind listed one per line; the rest are counted on one more line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """Something that would make the run fail; submit refuses it."""

    check: CheckKind
    """What the problem is about."""
    what: str
    """What is wrong, naming the thing (a key, a path, a module, a partition)."""
    expected: str = ""
    """What was expected instead ("" when ``what`` already says)."""
    fix: str = ""
    """How to fix it ("" when ``what`` already says)."""

    def line(self) -> str:
        """The problem as one line."""
        text = f"{self.check}: {self.what}"
        if self.expected:
            text += f"; expected {self.expected}"
        return f"{text}; {self.fix}" if self.fix else text


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped:
    """A check that could not run here; the run is not refused for it."""

    check: CheckKind
    """What was not checked."""
    what: str
    """What was skipped and why."""

    def line(self) -> str:
        return f"{self.check}: {self.what}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Passed:
    """A check that ran and found nothing wrong."""

    check: CheckKind
    """What was checked."""
    what: str
    """What was found (for ``--dry-run`` and ``hpcrun preflight``)."""

    def line(self) -> str:
        return f"{self.check}: {self.what}"


Finding = Problem | Skipped | Passed


def problem_of(check: CheckKind, exc: BaseException) -> Problem:
    """A problem from an :class:`~hpcrun.errors.HpcrunError` whose message already says what was
    expected and the fix."""
    return Problem(check=check, what=str(exc))


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionReport:
    """Every finding of one admission, in :class:`CheckKind` order."""

    problems: tuple[Problem, ...] = ()
    """What would make the run fail."""
    skipped: tuple[Skipped, ...] = ()
    """What was not checked here, and why."""
    passed: tuple[Passed, ...] = ()
    """What was checked and found right."""

    @property
    def ok(self) -> bool:
        """Whether the run may be created and submitted."""
        return not self.problems

    def findings(self) -> list[Finding]:
        """Every finding, in :class:`CheckKind` order (passed, skipped, problems within)."""
        order = list(CheckKind)
        every: list[Finding] = [*self.passed, *self.skipped, *self.problems]
        return sorted(every, key=lambda f: order.index(f.check))

    def render(self) -> str:
        """Every finding, one line each, marked ``ok`` / ``PROBLEM`` / ``skipped``."""
        marks = {Passed: "ok", Skipped: "skipped", Problem: "PROBLEM"}
        return "\n".join(f"{marks[type(f)]:<8} {f.line()}" for f in self.findings())

    def refusal(self) -> AdmissionError:
        """The error submit raises: a header, then one line per problem."""
        n = len(self.problems)
        lines = [f"run not submitted, nothing was created: {n} problem{'s' if n != 1 else ''} "
                 "found; fix them and submit again (`hpcrun submit --dry-run` runs the same "
                 "checks)"]
        lines += [f"  {p.line()}" for p in self.problems]
        return AdmissionError("\n".join(lines))


def assemble(findings: Iterable[Finding]) -> AdmissionReport:
    """The report of ``findings``, each kind in :class:`CheckKind` order (stable within).

    A problem whose message holds several lines (a spec with several invalid keys: one
    :class:`~hpcrun.control.specload.InvalidSpecError` line each) becomes one problem per line.
    """
    order = list(CheckKind)
    ranked = sorted((one for f in findings for one in _per_line(f)),
                    key=lambda f: order.index(f.check))
    return AdmissionReport(
        problems=tuple(f for f in ranked if isinstance(f, Problem)),
        skipped=tuple(f for f in ranked if isinstance(f, Skipped)),
        passed=tuple(f for f in ranked if isinstance(f, Passed)))


def _per_line(finding: Finding) -> list[Finding]:
    if not isinstance(finding, Problem) or "\n" not in finding.what:
        return [finding]
    return [replace(finding, what=line) for line in finding.what.splitlines()
            if line.strip()]


def capped(problems: Sequence[Problem], *, noun: str, limit: int = MAX_LISTED) -> list[Problem]:
    """The first ``limit`` problems, and one more line counting the rest."""
    if len(problems) <= limit:
        return list(problems)
    rest = len(problems) - limit
    return [*problems[:limit], Problem(check=problems[limit].check,
                                       what=f"... and {rest} more {noun} like those above")]


# -- data ---------------------------------------------------------------------------------------

def sample_objects(objects: Sequence[tuple[str, int]], mode: VerifyData, *, key: str,
                   limit: int = SAMPLE_OBJECTS, budget: int = SAMPLE_BYTES) -> frozenset[str]:
    """Paths of the objects to hash in full, from ``(path, nbytes)`` pairs.

    ``sample`` ranks objects by a hash of ``key`` (the dataset ID) and the path, then takes
    them in that order while they fit ``limit`` objects and ``budget`` bytes (the first always
    fits): the same manifest is always sampled the same way, and which objects are checked
    does not depend on their order in the manifest.
    """
    if mode is VerifyData.NONE:
        return frozenset()
    if mode is VerifyData.ALL:
        return frozenset(path for path, _ in objects)
    ranked = sorted(objects, key=lambda o: hashlib.blake2b(
        f"{key}\0{o[0]}".encode(), digest_size=8).digest())
    chosen: list[str] = []
    total = 0
    for path, nbytes in ranked:
        if len(chosen) == limit:
            break
        if chosen and total + nbytes > budget:
            continue
        chosen.append(path)
        total += nbytes
    return frozenset(chosen)


# -- storage ------------------------------------------------------------------------------------

def node_local_prefix(template: str, environ: Mapping[str, str]) -> Path | None:
    """The leading part of a node-local path template that is the same on the login node.

    Components up to the first that needs a job variable (``$SLURM_*``) or a variable not set
    here are kept and expanded (``/local/nvme/$USER/hpcrun/${SLURM_JOB_ID}`` →
    ``/local/nvme/alice/hpcrun``). None when not even the first component is known.
    """
    kept: list[str] = []
    for part in template.split("/"):
        names = path_variables(part)
        if any(n.startswith("SLURM_") or n not in environ for n in names):
            break
        kept.append(part)
    if not any(kept):
        return None
    try:
        return expand_path("/".join(kept), environ)
    except ConfigError:
        return None


def nearest_existing(path: Path, exists: Callable[[Path], bool]) -> Path:
    """The first of ``path`` and its ancestors for which ``exists`` holds (else the root): where
    creating ``path`` with its parents would start."""
    for candidate in (path, *path.parents):
        if exists(candidate):
            return candidate
    return Path(path.anchor or "/")


# -- entrypoint ---------------------------------------------------------------------------------

FIND_SPEC_SCRIPT = r"""
import importlib.machinery, importlib.util, json, sys

def walk(name):
    # Locate NAME running no package's code: the top-level name through the import system's
    # finders, each submodule on its parent's search path (no parent __init__ is executed).
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[:i + 1]), list(spec.submodule_search_locations))
    return spec is not None

def confirm(name):
    # Only after the walk failed: the import system's own answer (imports the parent packages).
    try:
        return {"found": importlib.util.find_spec(name) is not None, "via": "import"}
    except ModuleNotFoundError as exc:
        return {"found": False, "via": "import", "missing": exc.name}
    except Exception as exc:
        return {"found": None, "via": "import", "error": f"{type(exc).__name__}: {exc}"}

code = sys.argv[1]
sys.path[:] = [code] + [p for p in sys.path if p not in ("", code)]
out = {}
for name in sys.argv[2:]:
    try:
        found = walk(name)
    except Exception:
        found = False
    out[name] = {"found": True, "via": "path"} if found else confirm(name)
print(json.dumps(out))
"""
"""Run as ``python -c FIND_SPEC_SCRIPT CODE_PATH MODULE...``; prints one JSON object."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeTarget:
    """Where the job will import its code from."""

    python: str
    """The job's interpreter."""
    code_path: str
    """The directory the job puts first on ``sys.path`` (``HPCRUN_CODE_PATH``)."""


def entrypoint_findings(module: str, target: ProbeTarget, *, returncode: int, stdout: str,
                        stderr: str) -> list[Finding]:
    """What the entrypoint probe's output means for ``module`` and for hpcrun itself."""
    try:
        answers = json.loads(stdout.strip().splitlines()[-1]) if returncode == 0 else None
    except (ValueError, IndexError):
        answers = None
    if not isinstance(answers, dict):
        last = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        return [Problem(check=CheckKind.ENTRYPOINT,
                        what=f"the job's interpreter {target.python} could not run the import "
                             f"probe (exit {returncode}: {last[0]})",
                        expected="a Python >= 3.11 interpreter with hpcrun installed",
                        fix="set `python` in the site config to the job's interpreter")]
    return [_module_finding(name, answers.get(name), target) for name in (module, "hpcrun")]


def _module_finding(name: str, answer: object, target: ProbeTarget) -> Finding:
    where = f"{target.python} with {target.code_path} first on sys.path"
    if not isinstance(answer, dict) or answer.get("found") is None:
        error = answer.get("error") if isinstance(answer, dict) else "no answer"
        return Skipped(check=CheckKind.ENTRYPOINT,
                       what=f"module {name!r} could not be confirmed on this node: importing "
                            f"its parent package raised {error}; the job imports it on the "
                            "compute node")
    if answer["found"]:
        return Passed(check=CheckKind.ENTRYPOINT, what=f"module {name!r} found by {where}")
    missing = answer.get("missing")
    detail = f" (no module named {missing!r})" if missing and missing != name else ""
    if name == "hpcrun":
        return Problem(check=CheckKind.ENTRYPOINT,
                       what=f"hpcrun is not importable by the job's interpreter {target.python}",
                       expected="hpcrun installed in the environment the job runs in",
                       fix="install hpcrun there, or set `python` in the site config")
    return Problem(check=CheckKind.ENTRYPOINT,
                   what=f"entrypoint module {name!r} is not importable by {where}{detail}",
                   expected="a module in the code directory or installed in the job's "
                            "environment",
                   fix="fix `entrypoint` in the spec (package.module:function) or submit from "
                       "the repository that holds the code")
