"""Sweeps: one base spec, many points, each a full run; submitted as one Slurm job array.

A sweep is a base ``run.yaml`` plus a grid (``--grid config.lr=1e-3,3e-3``, or ``grid:`` in a
sweep YAML: every combination) and/or a list of points (``points:``). :func:`expand_points`
turns them into per-point overrides, :func:`point_specs` into validated specs (a grid key not
in the spec, an empty grid and duplicate points are errors, before anything is created). Each
point is frozen into its own run directory and run record; the sweep directory holds only the
index (``sweep.json``, written once) that maps an array task id to its point's run directory
(:func:`array_task_run_dir`), which is how every array task becomes a full hpcrun run with its
own fencing, preemption, requeue, retries and quarantine.

A sweep YAML::

    sweep:
      spec: run.yaml            # the base spec, relative to this file
      grid:                     # every combination (keys are dotted spec paths)
        config.lr: [0.001, 0.003]
        config.seed: [0, 1, 2]
      points:                   # and/or explicit points
        - {config.lr: 0.01, config.seed: 7}
      max_parallel: 2           # array tasks running at once (``%P``)
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcrun.control.spec import RunSpec, resolve_aliases
from hpcrun.errors import RecordError, SpecError
from hpcrun.storage import LOCAL_STORAGE, Storage

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA_VERSION = 1
ARRAY_TASK_ENV = "SLURM_ARRAY_TASK_ID"

Grid = tuple[tuple[str, tuple[Any, ...]], ...]
"""Grid axes in order: (dotted key, values)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPlan:
    """What to sweep, before it is checked against the spec."""

    grid: Grid = ()
    """Axes whose every combination is a point."""
    points: tuple[Mapping[str, Any], ...] = ()
    """Explicit points (dotted key → value)."""
    max_parallel: int | None = None
    """Points running at once (None: as many as the scheduler allows)."""

    def __post_init__(self) -> None:
        bad = self.max_parallel is not None and (
            not isinstance(self.max_parallel, int) or isinstance(self.max_parallel, bool)
            or self.max_parallel < 1)
        if bad:
            raise SpecError(f"max_parallel: expected an integer >= 1, found "
                            f"{self.max_parallel!r}; leave it out for no limit")


def parse_grid_option(text: str) -> tuple[str, tuple[Any, ...]]:
    """``config.lr=1e-3,3e-3`` → ``("config.lr", (0.001, 0.003))`` (values read as YAML).

    Raises:
        SpecError: no ``=``, an empty key, no values, or a value that is not YAML a safe
            loader reads (one line naming the item).
    """
    key, sep, values = text.partition("=")
    parsed = tuple(_scalar(v, item=text) for v in values.split(",") if v.strip()) if sep else ()
    if not key.strip() or not parsed:
        raise SpecError(f"--grid {text!r}: expected KEY=V1,V2,... with at least one value, e.g. "
                        "--grid config.lr=1e-3,3e-3; an empty grid sweeps nothing")
    return key.strip(), parsed


def _scalar(text: str, *, item: str) -> Any:
    try:
        value = yaml.safe_load(text.strip())
    except yaml.YAMLError as exc:
        # a list or a mapping cannot be one --grid value: ',' separates the values
        reason = getattr(exc, "problem", None) or " ".join(str(exc).split()[:12])
        raise SpecError(f"--grid {item!r}: value {text.strip()!r} is not valid YAML "
                        f"({reason}); expected KEY=V1,V2,... with plain values (numbers, "
                        "strings, true/false; no tags, anchors or aliases): quote or fix the "
                        "value, or put list values in a sweep YAML's grid:") from None
    if isinstance(value, str) and _is_float(value):
        return float(value)  # YAML 1.1 reads 1e-3 as a string
    return value


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_sweep_file(path: Path) -> tuple[Path, SweepPlan]:
    """The base spec path and the plan of a sweep YAML (see the module doc).

    Raises:
        SpecError: not a sweep YAML, or a malformed one.
    """
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read sweep file {path}: {exc}; check the path and the "
                        "YAML") from exc
    body = raw.get("sweep") if isinstance(raw, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("spec"), str):
        raise SpecError(f"{path}: expected a mapping `sweep:` with `spec: run.yaml` and `grid:` "
                        "and/or `points:`; see `hpcrun sweep --help`")
    unknown = set(body) - {"spec", "grid", "points", "max_parallel"}
    if unknown:
        raise SpecError(f"{path}: sweep: unknown keys {sorted(unknown)}; expected spec, grid, "
                        "points, max_parallel")
    return (path.parent / body["spec"]), SweepPlan(
        grid=_grid_of(body.get("grid") or {}, path), points=_points_of(body.get("points") or [],
                                                                          path),
        max_parallel=body.get("max_parallel"))


def _grid_of(raw: Any, path: Path) -> Grid:
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: sweep.grid: expected a mapping KEY: [values], found "
                        f"{type(raw).__name__}")
    out = []
    for key, values in raw.items():
        vals = tuple(values) if isinstance(values, list) else (values,)
        if not vals:
            raise SpecError(f"{path}: sweep.grid.{key}: expected at least one value, found "
                            "an empty list; an empty grid sweeps nothing")
        out.append((str(key), vals))
    return tuple(out)


def _points_of(raw: Any, path: Path) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(raw, list) or not all(isinstance(p, dict) and p for p in raw):
        raise SpecError(f"{path}: sweep.points: expected a list of non-empty mappings "
                        "KEY: value")
    return tuple({str(k): v for k, v in p.items()} for p in raw)


def expand_points(plan: SweepPlan, *, max_points: int) -> list[dict[str, Any]]:
    """Every point's overrides: the grid's combinations (first axis slowest), then the list.

    Args:
        max_points: the most points one sweep may have: the site's ``sweep_max_points`` (one
            Slurm job array; sites cap ``MaxArraySize`` near 1,000).

    Raises:
        SpecError: the plan has no point at all, a grid axis has no values, or it has more
            than ``max_points`` points (counted before any is built).
    """
    points: list[dict[str, Any]] = []
    for key, values in plan.grid:
        if not values:
            raise SpecError(f"sweep grid axis {key!r} has no values; an empty grid sweeps "
                            "nothing; nothing was submitted")
    count = (math.prod(len(v) for _, v in plan.grid) if plan.grid else 0) + len(plan.points)
    if count > max_points:
        raise SpecError(f"the sweep has {count} points, more than the cap of {max_points} "
                        "(the site's sweep_max_points); split it into several sweeps, sweep "
                        "fewer values, or raise sweep_max_points in the site config; nothing "
                        "was submitted")
    if plan.grid:
        keys = [k for k, _ in plan.grid]
        points += [dict(zip(keys, combo, strict=True))
                   for combo in itertools.product(*(vals for _, vals in plan.grid))]
    points += [dict(p) for p in plan.points]
    if not points:
        raise SpecError("the sweep is empty: give --grid KEY=V1,V2 (or `grid:` / `points:` in a "
                        "sweep YAML); nothing was submitted")
    return points


def point_specs(base: Mapping[str, Any], points: Sequence[Mapping[str, Any]], *,
                base_dir: Path, source: str = "run.yaml") -> list[RunSpec]:
    """One validated spec per point: ``base`` (the raw run.yaml) with the point's overrides.

    Raises:
        SpecError: a key is not in the spec, a point makes an invalid spec, or two points are
            the same run.
    """
    filled = RunSpec.from_dict(resolve_aliases(dict(base), base_dir), source=source).to_dict()
    specs: list[RunSpec] = []
    seen: dict[str, int] = {}
    for i, point in enumerate(points):
        raw = copy.deepcopy(dict(base))
        for key, value in point.items():
            _check_key(filled, key, source)
            _set(raw, key, value)
        spec = RunSpec.from_dict(resolve_aliases(raw, base_dir), source=f"{source} point {i}")
        if spec.spec_id in seen:
            raise SpecError(f"sweep points {seen[spec.spec_id]} and {i} are the same run "
                            f"({_describe(points[seen[spec.spec_id]])} vs {_describe(point)}); "
                            "remove the duplicate; nothing was submitted")
        seen[spec.spec_id] = i
        specs.append(spec)
    return specs


def _describe(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())


def _schema_keys() -> frozenset[str]:
    """Every key path of the spec's schema that holds a value (not a section)."""
    from hpcrun.control.specref import reference_rows

    return frozenset(r.key for r in reference_rows(RunSpec) if not r.section)


def _check_key(filled: Mapping[str, Any], key: str, source: str) -> None:
    """``key`` is a field of the spec's schema (``dist.step_timeout_s``, set or not in the base),
    or a key the base spec holds (``config.lr``: ``config`` is free-form, so a name the base
    does not have is refused as a likely typo)."""
    if key in _schema_keys():
        return
    node: Any = filled
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            where = sorted(node) if isinstance(node, Mapping) else []
            raise SpecError(f"sweep key {key!r} is not in {source} ({part!r} not found"
                            + (f"; there: {', '.join(where)}" if where else "") + "); sweep "
                            "keys name existing spec fields, e.g. config.lr; nothing was "
                            "submitted")
        node = node[part]


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def array_flag(points: int, max_parallel: int | None) -> str:
    """``--array`` value: task ids ``0..points-1``, at most ``max_parallel`` at once."""
    return f"0-{points - 1}" + (f"%{max_parallel}" if max_parallel else "")


def render_points(points: Sequence[Mapping[str, Any]], specs: Sequence[RunSpec]) -> str:
    """The sweep's points as a table (pure): array task, each swept key's value, spec id.

    ``hpcrun sweep --dry-run`` prints it next to the array script, so a grid can be checked
    before anything is created.
    """
    keys = list(dict.fromkeys(k for p in points for k in p))
    rows = [["task", *keys, "spec"]]
    rows += [[str(i), *(_cell(p, k) for k in keys), s.spec_id.split(":", 1)[-1][:12]]
             for i, (p, s) in enumerate(zip(points, specs, strict=True))]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    return "\n".join(lines)


def _cell(point: Mapping[str, Any], key: str) -> str:
    return json.dumps(point[key]) if key in point else "-"


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPoint:
    """One point of a sweep."""

    index: int
    """Its array task id."""
    run_id: str
    """Its run's id (a run directory beside the sweep directory)."""
    overrides: Mapping[str, Any]
    """What it changes in the base spec."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepIndex:
    """``sweep.json``: written once, when the sweep is created."""

    sweep_id: str
    """The sweep's id (its directory name)."""
    points: tuple[SweepPoint, ...]
    """Points in array task order."""
    max_parallel: int | None = None
    """Points running at once."""
    backend: str = "slurm"
    """``slurm`` (one job array) or ``local`` (bounded local launchers)."""

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SWEEP_SCHEMA_VERSION, "sweep_id": self.sweep_id,
                "max_parallel": self.max_parallel, "backend": self.backend,
                "points": [{"index": p.index, "run_id": p.run_id,
                            "overrides": dict(p.overrides)} for p in self.points]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SweepIndex:
        if raw.get("schema_version") != SWEEP_SCHEMA_VERSION:
            raise RecordError(f"sweep.json has schema_version {raw.get('schema_version')!r}, "
                              f"expected {SWEEP_SCHEMA_VERSION}; use the hpcrun that wrote it")
        return cls(sweep_id=str(raw["sweep_id"]), max_parallel=raw.get("max_parallel"),
                   backend=str(raw.get("backend", "slurm")),
                   points=tuple(SweepPoint(index=int(p["index"]), run_id=str(p["run_id"]),
                                           overrides=dict(p["overrides"]))
                                for p in raw["points"]))

    def run_dirs(self, sweep_dir: Path) -> list[Path]:
        """Each point's run directory (beside the sweep directory)."""
        return [sweep_dir.parent / p.run_id for p in self.points]


def is_sweep_dir(path: Path) -> bool:
    """Whether ``path`` is a sweep directory."""
    return (path / SWEEP_FILE).is_file()


def write_sweep_index(sweep_dir: Path, index: SweepIndex, *,
                      storage: Storage = LOCAL_STORAGE) -> None:
    """Write ``sweep.json`` once (exclusively).

    Raises:
        RecordError: the directory already holds a sweep.
    """
    data = json.dumps(index.to_dict(), sort_keys=True, indent=1).encode()
    if not storage.create_exclusive(sweep_dir / SWEEP_FILE, data):
        raise RecordError(f"{sweep_dir} already holds a sweep; choose another sweep id")


def read_sweep_index(sweep_dir: Path, *, storage: Storage = LOCAL_STORAGE) -> SweepIndex:
    """Read ``sweep.json``.

    Raises:
        RecordError: missing or malformed.
    """
    path = sweep_dir / SWEEP_FILE
    try:
        return SweepIndex.from_dict(json.loads(storage.read_bytes(path)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"{path} is not a readable sweep index ({exc}); is {sweep_dir} a "
                          "sweep directory made by `hpcrun sweep`?") from exc


POINT_INJECT_ENV = "HPCRUN_INJECT_POINT_"
"""Prefix of a drill's per-point fault schedule (``HPCRUN_INJECT_POINT_3``): the point's
runs see it as ``HPCRUN_INJECT``."""


def point_environ(environ: Mapping[str, str], index: int) -> dict[str, str]:
    """``environ`` as point ``index`` of a sweep sees it: its own fault schedule, if a drill
    gave one (``hpcrun sweep --inject-point K:FAULTS``), is its ``HPCRUN_INJECT``; in a Slurm
    job array its job id is the element's ``ARRAYJOB_TASK`` (what ``squeue``, ``sacct`` and
    ``scontrol requeuehold`` name it by, and what submit recorded), not the element's own
    numeric id, which ``squeue`` reports under the array's name."""
    out = {k: v for k, v in environ.items() if not k.startswith(POINT_INJECT_ENV)}
    mine = environ.get(f"{POINT_INJECT_ENV}{index}")
    if mine is not None:
        out["HPCRUN_INJECT"] = mine
    array_job = environ.get("SLURM_ARRAY_JOB_ID")
    if array_job and environ.get(ARRAY_TASK_ENV) == str(index):
        out["SLURM_JOB_ID"] = f"{array_job}_{index}"
    return out


def parse_point_inject(text: str) -> tuple[int, str]:
    """``K:FAULTS`` → (K, FAULTS).

    Raises:
        SpecError: another form.
    """
    k, sep, faults = text.partition(":")
    if not sep or not k.isdigit() or not faults:
        raise SpecError(f"--inject-point {text!r}: expected K:FAULTS, e.g. "
                        "--inject-point 2:preempt@step=20")
    return int(k), faults


def array_task_run_dir(run_dir: Path, environ: Mapping[str, str]) -> Path:
    """The run directory an agent serves: ``run_dir`` itself, or, for a sweep's job array, the
    directory of the point whose index is this task's ``SLURM_ARRAY_TASK_ID``.

    Raises:
        RecordError: a sweep directory without a task id, or a task id that is no point.
    """
    if not is_sweep_dir(run_dir):
        return run_dir
    index = read_sweep_index(run_dir)
    task = environ.get(ARRAY_TASK_ENV, "")
    dirs = index.run_dirs(run_dir)
    if not task.isdigit() or int(task) >= len(dirs):
        raise RecordError(f"{run_dir} is sweep {index.sweep_id} of {len(dirs)} points but this "
                          f"task has {ARRAY_TASK_ENV}={task!r}; a sweep runs as a job array "
                          f"(--array=0-{len(dirs) - 1})")
    return dirs[int(task)]


__all__ = [
    "ARRAY_TASK_ENV", "SWEEP_FILE", "SweepIndex", "SweepPlan", "SweepPoint", "array_flag",
    "array_task_run_dir", "expand_points", "is_sweep_dir", "load_sweep_file",
    "parse_grid_option", "point_specs", "read_sweep_index", "render_points",
    "write_sweep_index",
]
