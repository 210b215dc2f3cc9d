"""One name for a run in every command: its id, a unique prefix of the id, or its directory.

Every command that takes a run (or a sweep) resolves the argument here:

1. A path to a run directory (it holds ``log/``) or a sweep directory (it holds ``sweep.json``)
   is that directory, exactly as before.
2. Otherwise the name is looked up among the runs and sweeps directly under the *runs roots*:
   an exact id wins; else a unique prefix of one id; a sweep and its own points (their ids
   start with the sweep's) count as the sweep. More than one match is one error listing the
   candidates; none is one error naming the roots searched.

The runs roots, in order:

- ``$HPCRUN_RUNS`` when it is set: only it;
- else the ``shared_path`` of the site ``$HPCRUN_SITE`` names: only it;
- else the ``shared_path`` of the default site (``local``, a spec's default) first, then of
  every other site config found (the shipped ``site_configs/`` and ``$HPCRUN_SITE_CONFIGS``):
  a run is found under the site it was submitted to without setting anything.

The first root is the *primary* one: ``hpcrun submit`` links a run created elsewhere (under
``--runs-root``, or a site given by file path) into it, and ``hpcrun watch`` keeps its own state
there. :func:`match_reference` is the pure core (a listing in, one entry out); the functions
after it are the thin shell that reads the environment, the site configs and the directories.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from hpcrun.control.sweep import is_sweep_dir, read_sweep_index
from hpcrun.errors import ConfigError, HpcrunError, RecordError, RunReferenceError
from hpcrun.launch.site import (
    SiteConfig,
    default_search_dirs,
    expand_path,
    load_site,
    load_site_snapshot,
)
from hpcrun.vocab import Backend

RUNS_ENV = "HPCRUN_RUNS"
"""Pins the runs root (submit creates runs there; every command looks only there)."""
SITE_ENV = "HPCRUN_SITE"
"""Names the site whose ``shared_path`` is the runs root when ``$HPCRUN_RUNS`` is unset."""
DEFAULT_SITE = "local"
"""The site a spec runs on when it names none; its root is searched first."""
MAX_CANDIDATES = 5
"""Candidates an ambiguous reference's error lists."""


class RefKind(StrEnum):
    """What a reference resolved to."""

    RUN = "run"
    SWEEP = "sweep"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunsRoot:
    """A directory runs and sweeps live directly under, and why it is searched."""

    path: Path
    """The directory (expanded)."""
    source: str
    """Where it came from, for messages (``$HPCRUN_RUNS``, ``site 'local'``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEntry:
    """A run or sweep directory found by a listing (or named by path)."""

    name: str
    """The run or sweep id (the directory entry's name; a link's name for a linked run)."""
    path: Path
    """The directory, symlinks resolved."""
    kind: RefKind
    """Run or sweep."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunsListing:
    """The runs roots searched and what was found directly under them."""

    roots: tuple[RunsRoot, ...]
    """In search order; the first is the primary root."""
    entries: tuple[RunEntry, ...] = ()
    """Runs and sweeps found, one per directory (the first root's name wins)."""


# -- the pure core ------------------------------------------------------------------------------

def looks_like_path(ref: str) -> bool:
    """Whether ``ref`` is written as a path (a separator, ``.``/``~`` first), never an id."""
    return os.sep in ref or ref.startswith((".", "~"))


def match_reference(ref: str, listing: RunsListing, *,
                    at_path: RunEntry | None = None) -> RunEntry:
    """The one run or sweep ``ref`` names (pure).

    Args:
        ref: what the user typed: a run or sweep id, a prefix of one, or a path.
        listing: the roots searched and the entries found under them.
        at_path: the run or sweep directory ``ref`` names as a path, when it names one.

    Raises:
        RunReferenceError: ``ref`` is empty, names no run, or more than one (the candidates,
            up to :data:`MAX_CANDIDATES`, are listed with how to pick one).
    """
    if at_path is not None:
        return at_path
    if not ref.strip():
        raise RunReferenceError("an empty run reference: give a run id, a unique prefix of one "
                                "or a run directory's path (`hpcrun list` shows the runs)")
    if looks_like_path(ref):
        raise RunReferenceError(f"no run at {ref}: expected a directory holding log/ (a run) "
                                "or sweep.json (a sweep); check the path")
    exact = [e for e in listing.entries if e.name == ref]
    found = exact or [e for e in listing.entries if e.name.startswith(ref)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise RunReferenceError(_none_message(ref, listing.roots))
    return _sweep_of_points(found) or _raise_ambiguous(ref, found, same_id=bool(exact))


def _sweep_of_points(found: Sequence[RunEntry]) -> RunEntry | None:
    """The sweep, when the matches are one sweep and runs whose ids extend its id."""
    sweeps = [e for e in found if e.kind is RefKind.SWEEP]
    if len(sweeps) != 1:
        return None
    sweep = sweeps[0]
    points = all(e is sweep or e.name.startswith(f"{sweep.name}-") for e in found)
    return sweep if points else None


def _raise_ambiguous(ref: str, found: Sequence[RunEntry], *, same_id: bool) -> RunEntry:
    shown = sorted(found, key=lambda e: e.name)[:MAX_CANDIDATES]
    more = f" and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
    if same_id:
        where = ", ".join(str(e.path) for e in shown)
        raise RunReferenceError(f"{len(found)} runs are called {ref!r}: {where}{more}; "
                                "give the run directory's path")
    names = ", ".join(e.name for e in shown)
    raise RunReferenceError(f"{ref!r} is ambiguous: it begins {len(found)} run ids: "
                            f"{names}{more}; give more of the id, or the run directory's path")


def _none_message(ref: str, roots: Sequence[RunsRoot]) -> str:
    searched = ", ".join(f"{r.path} ({r.source})" for r in roots) or "no runs root"
    return (f"no run or sweep {ref!r}: searched {searched}; `hpcrun list` shows the runs there; "
            f"give a run directory's path, or set ${RUNS_ENV} (or ${SITE_ENV}, a site whose "
            "shared_path holds the runs) to search another runs root")


def backend_of(job_ids: Sequence[str], job_backends: Mapping[str, Backend],
               site_backend: Backend) -> Backend:
    """The backend that runs a run: its newest job's, else its site's (pure).

    Raises:
        RecordError: the record names a backend this hpcrun does not know.
    """
    if not job_ids:
        return site_backend
    name = job_backends.get(job_ids[-1], Backend.SLURM.value)
    try:
        return Backend(name)
    except ValueError:
        raise RecordError(f"job {job_ids[-1]} runs on backend {name!r}; expected one of "
                          f"{', '.join(b.value for b in Backend)}; use the hpcrun that "
                          "submitted it") from None


# -- the shell: roots, listings, resolution -----------------------------------------------------

def runs_roots(environ: Mapping[str, str]) -> tuple[RunsRoot, ...]:
    """The runs roots to search, primary first (see the module docstring).

    Raises:
        ConfigError: ``$HPCRUN_SITE`` names a site that does not load, or whose shared_path
            cannot be expanded here; or no root at all can be found.
    """
    if environ.get(RUNS_ENV):
        return (RunsRoot(path=Path(environ[RUNS_ENV]).expanduser(), source=f"${RUNS_ENV}"),)
    if environ.get(SITE_ENV):
        site = load_site(environ[SITE_ENV], search_dirs=default_search_dirs(environ))
        return (_site_root(site, environ, source=f"${SITE_ENV}={site.name}"),)
    roots = _dedupe(_every_site_root(environ))
    if not roots:
        raise ConfigError(f"no runs root: ${RUNS_ENV} and ${SITE_ENV} are unset and no site "
                          "config's shared_path expands here (it needs $HOME or $USER); set "
                          f"${RUNS_ENV} to the directory that holds the runs")
    return roots


def primary_root(environ: Mapping[str, str]) -> Path:
    """The primary runs root: where links and ``hpcrun watch``'s own files go."""
    return runs_roots(environ)[0].path


def _site_root(site: SiteConfig, environ: Mapping[str, str], *, source: str) -> RunsRoot:
    try:
        path = expand_path(site.shared_path, environ).expanduser()
    except ConfigError as exc:
        raise ConfigError(f"site {site.name!r}: shared_path: {exc}") from None
    return RunsRoot(path=path, source=source)


def _every_site_root(environ: Mapping[str, str]) -> Iterable[RunsRoot]:
    """The default site's root, then every other loadable site's whose path expands here."""
    dirs = default_search_dirs(environ)
    names = sorted({p.stem for d in dirs if d.is_dir() for p in d.iterdir()
                    if p.suffix in (".yaml", ".yml")}, key=lambda n: (n != DEFAULT_SITE, n))
    for name in names:
        try:
            site = load_site(name, search_dirs=dirs)
            yield _site_root(site, environ, source=f"site {site.name!r}")
        except HpcrunError:
            continue  # a broken or foreign site file hides no run of the others


def _dedupe(roots: Iterable[RunsRoot]) -> tuple[RunsRoot, ...]:
    out: dict[Path, RunsRoot] = {}
    for r in roots:
        out.setdefault(r.path, r)
    return tuple(out.values())


def entry_at(path: Path, *, name: str | None = None) -> RunEntry | None:
    """The run or sweep directory at ``path``, or None."""
    if (path / "log").is_dir():
        kind = RefKind.RUN
    elif is_sweep_dir(path):
        kind = RefKind.SWEEP
    else:
        return None
    return RunEntry(name=name or path.resolve().name, path=path.resolve(), kind=kind)


def list_runs(roots: Sequence[RunsRoot], *, prefix: str = "") -> RunsListing:
    """Every run and sweep directly under ``roots`` whose id starts with ``prefix``."""
    entries: dict[Path, RunEntry] = {}
    for root in roots:
        try:
            names = sorted(p.name for p in root.path.iterdir() if p.name.startswith(prefix))
        except OSError:
            continue  # a root that does not exist (yet) holds no runs
        for name in names:
            entry = entry_at(root.path / name, name=name)
            if entry is not None:
                entries.setdefault(entry.path, entry)
    return RunsListing(roots=tuple(roots), entries=tuple(entries.values()))


def resolve_reference(ref: str, *, environ: Mapping[str, str]) -> RunEntry:
    """The run or sweep ``ref`` names (id, unique prefix or path).

    Raises:
        RunReferenceError: no run or more than one matches (one line saying which and why).
    """
    at_path = entry_at(Path(ref).expanduser()) if ref.strip() else None
    if at_path is not None:
        return at_path
    listing = list_runs(runs_roots(environ), prefix=ref) if not looks_like_path(ref) else \
        RunsListing(roots=())
    return match_reference(ref, listing)


def resolve_run_dir(ref: str, *, environ: Mapping[str, str]) -> Path:
    """The run directory ``ref`` names; a sweep is refused, naming its points.

    Raises:
        RunReferenceError: no run, more than one, or a sweep.
    """
    entry = resolve_reference(ref, environ=environ)
    if entry.kind is RefKind.SWEEP:
        points = [p.run_id for p in read_sweep_index(entry.path).points]
        shown = ", ".join(points[:MAX_CANDIDATES]) + (" ..." if len(points) > MAX_CANDIDATES
                                                      else "")
        raise RunReferenceError(f"{entry.name} is a sweep, and this command takes one run: "
                                f"give one of its points ({shown or 'none'})")
    return entry.path


def expand_runs(ref: str, *, environ: Mapping[str, str]) -> list[Path]:
    """The run directories ``ref`` stands for: a run's, or every point's of a sweep."""
    entry = resolve_reference(ref, environ=environ)
    if entry.kind is RefKind.SWEEP:
        return read_sweep_index(entry.path).run_dirs(entry.path)
    return [entry.path]


def run_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Every run directory under the runs roots, newest first (by log mtime)."""
    listing = list_runs(runs_roots(environ))
    runs = [e.path for e in listing.entries if e.kind is RefKind.RUN]
    return sorted(runs, key=lambda p: ((p / "log").stat().st_mtime, p.name), reverse=True)


def watch_targets(refs: Sequence[str], *, environ: Mapping[str, str]) -> list[Path]:
    """The runs a watch pass reconciles: those ``refs`` stand for (every point of a sweep),
    or without any, every run under the runs roots that has not ended."""
    from hpcrun.control.record import read_record
    from hpcrun.control.states import is_terminal

    if refs:
        return [d for r in refs for d in expand_runs(r, environ=environ)]
    return [d for d in run_dirs(environ) if not is_terminal(read_record(d).state)]


def run_backend(run_dir: Path) -> Backend:
    """The backend that runs ``run_dir``: its newest job's (from the record), else its site's.

    Raises:
        RecordError: the run's record cannot be read.
    """
    from hpcrun.control.record import read_record

    record = read_record(run_dir)
    try:
        site_backend = load_site_snapshot(run_dir).backend
    except ConfigError:
        site_backend = Backend.SLURM  # no site snapshot: only Slurm runs are made without one
    return backend_of(record.job_ids, record.job_backends, site_backend)


def link_into_primary_root(run_dir: Path, *, environ: Mapping[str, str]) -> Path | None:
    """Link a run (or sweep) created outside every runs root into the primary one, so its id
    finds it; return the link (None when none was needed).

    Raises:
        StorageError: the link cannot be made (named, with the fix).
    """
    from hpcrun.errors import StorageError

    roots = runs_roots(environ)
    if run_dir.parent.resolve() in {r.path.resolve() for r in roots}:
        return None
    link = roots[0].path / run_dir.name
    try:
        roots[0].path.mkdir(parents=True, exist_ok=True, mode=0o750)
        if not link.exists():
            link.symlink_to(run_dir.resolve())
    except OSError as exc:
        raise StorageError(f"cannot link {run_dir} into the runs root {roots[0].path}: "
                           f"{exc.strerror}; pass the run directory's path to commands, or "
                           f"set ${RUNS_ENV} to a writable directory") from exc
    return link
