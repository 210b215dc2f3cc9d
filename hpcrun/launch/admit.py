"""Admission's probes: everything ``hpcrun submit`` can check before it creates a run.

:func:`admit` loads the spec and the site config and probes, collecting every finding instead of
stopping at the first (:mod:`hpcrun.launch.admission` holds the decisions):

- the spec and the site config parse and validate, and the spec fits the site (GPUs per node);
- the entrypoint's module is importable by the job's interpreter with the job's code directory
  first on ``sys.path``: one ``python -c`` through the injected runner, which locates the module
  with :func:`importlib.util.find_spec` for the top-level package and
  :class:`importlib.machinery.PathFinder` for each submodule, so **no user code runs** (not even
  a parent package's ``__init__``); only when that walk finds nothing does it ask
  ``importlib.util.find_spec`` for the full name, which imports the parent packages, so a
  package that extends its ``__path__`` at import time is not refused by mistake. The function
  name itself is not checked (that would mean importing the module);
- the data manifest parses, has a manifest's shape, its seal (``dataset_id``) matches its
  content and the spec's ``data.dataset_id`` when set; every object is present with its size
  and index, and a sample of objects (``--verify-data``) is hashed in full;
- the runs root on the shared tier and the node-local tier are writable by the user (one probe
  file through the storage seam, removed at once; for a Slurm site the node-local template's
  leading part is checked only where it exists on this node, and otherwise reported skipped);
- on a Slurm site, the partition, account and QoS exist (:mod:`hpcrun.launch.slurm_names`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from hpcrun.errors import (
    ConfigError,
    DataError,
    HpcrunError,
    SchedulerError,
    SpecError,
    StorageError,
)
from hpcrun.launch.admission import (
    FIND_SPEC_SCRIPT,
    AdmissionReport,
    CheckKind,
    Finding,
    Passed,
    ProbeTarget,
    Problem,
    Skipped,
    VerifyData,
    assemble,
    capped,
    entrypoint_findings,
    nearest_existing,
    node_local_prefix,
    problem_of,
    sample_objects,
)
from hpcrun.launch.site import SiteConfig, expand_path, load_site
from hpcrun.runner import CommandRunner
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import Backend, RankLauncher

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec

ENTRYPOINT_TIMEOUT_S = 60.0
"""Longest the import probe may take (a cold interpreter on a busy login node)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionRequest:
    """What the user asked ``hpcrun submit`` for, and where it runs."""

    spec_path: Path
    """The run spec (run.yaml)."""
    code_path: Path
    """The code directory the job will import from (the repository root)."""
    python: str
    """The submitting interpreter (the job's, unless the site names another)."""
    user: str
    """Login name (its Slurm associations are checked)."""
    site: str | None = None
    """``--site``: a site name or path overriding the spec's."""
    backend: Backend | None = None
    """``--backend``; None lets the site decide."""
    runs_root: str | None = None
    """``--runs-root``; None: ``$HPCRUN_RUNS``, else the site's shared path."""
    have_sbatch: bool = False
    """Whether ``sbatch`` is on PATH."""
    verify_data: VerifyData = VerifyData.SAMPLE
    """How many data objects to hash in full."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Admission:
    """The outcome: the loaded inputs (None where they did not load) and the report."""

    spec: RunSpec | None
    """The validated spec, when it loaded."""
    site: SiteConfig | None
    """The site config, when it loaded."""
    backend: Backend
    """Where the run would run."""
    runs_root: Path | None
    """Where the run directory would be created, when known."""
    notice: str
    """A line for the user about the backend choice ("" when none)."""
    report: AdmissionReport
    """Every finding."""


def parse_backend(value: str | None) -> Backend | None:
    """A requested backend (``--backend``, the Python API's ``backend=``) as the enum.

    Raises:
        SpecError: a name that is not a backend.
    """
    if value is None or isinstance(value, Backend):
        return value
    try:
        return Backend(value)
    except ValueError:
        raise SpecError(f"backend: expected one of {', '.join(b.value for b in Backend)}, "
                        f"found {value!r}") from None


def choose_backend(requested: Backend | None, site: SiteConfig, *,
                   have_sbatch: bool) -> tuple[Backend, str]:
    """The backend to use and a notice for the user ("" when none is due). Pure."""
    if requested:
        return requested, ""
    if site.backend is Backend.LOCAL:
        return Backend.LOCAL, ""
    if not have_sbatch:
        return Backend.LOCAL, ("hpcrun: sbatch not found on PATH; running on the embedded "
                               "local backend")
    return Backend.SLURM, ""


def admit(request: AdmissionRequest, *, environ: Mapping[str, str], runner: CommandRunner,
          storage: Storage = LOCAL_STORAGE, extra: Sequence[Finding] = ()) -> Admission:
    """Run every admission check for ``request``; never raises for bad input."""
    findings: list[Finding] = list(extra)
    spec = _load_spec(request.spec_path, findings)
    site = _load_site(request, spec, findings)
    backend, notice = (choose_backend(request.backend, site, have_sbatch=request.have_sbatch)
                       if site is not None else (request.backend or Backend.LOCAL, ""))
    runs_root = _runs_root(request, site, environ, findings)
    if spec is not None:
        python = site.python if site is not None and backend == Backend.SLURM and site.python \
            else request.python
        target = ProbeTarget(python=python, code_path=str(request.code_path))
        findings += (probe_script(spec, target) if spec.script_mode else probe_entrypoint(
            spec.entrypoint, target, runner=runner,
            env=dict(site.env) if site is not None else {}))
        findings += probe_data(spec, request.verify_data, storage=storage)
        findings += probe_init_from(spec)
        findings += probe_tracker(spec, target, runner=runner,
                                  env=dict(site.env) if site is not None else {})
    else:
        findings.append(Skipped(check=CheckKind.ENTRYPOINT, what="entrypoint and data not "
                                "checked: the spec did not load (see its problem)"))
    if spec is not None and site is not None:
        findings += backend_findings(spec, site)
        findings += rank_launcher_findings(spec, site, backend)
    if site is not None:
        findings += container_findings(site, backend)
        findings += _storage_findings(site, backend, runs_root, environ, storage)
    if spec is not None and site is not None and backend == Backend.SLURM:
        findings += _script_findings(spec, site)
        findings += _scheduler_findings(spec, site, runner, request.user)
    return Admission(spec=spec, site=site, backend=backend, runs_root=runs_root, notice=notice,
                     report=assemble(findings))


def point_problems(spec: RunSpec, base: RunSpec, site: SiteConfig, backend: Backend, *,
                   verify_data: VerifyData, storage: Storage = LOCAL_STORAGE) -> list[Problem]:
    """The problems of one sweep point: every check of :func:`admit` whose answer can depend on
    a point's own values, run on the point's spec. Its resources are the base spec's (a sweep is
    one job shape), so the scheduler's checks of the base hold for every point; its data and
    entrypoint are probed again only where the point changes them."""
    findings = [*backend_findings(spec, site), *probe_init_from(spec)]
    if spec.data != base.data:
        findings += probe_data(spec, verify_data, storage=storage)
    if backend == Backend.SLURM:
        findings += _script_findings(spec, site)
    return [f for f in findings if isinstance(f, Problem)]


def _load_spec(path: Path, findings: list[Finding]) -> RunSpec | None:
    from hpcrun.control.spec import load_spec

    try:
        spec = load_spec(path)
    except HpcrunError as exc:
        findings.append(problem_of(CheckKind.SPEC, exc))
        return None
    findings.append(Passed(check=CheckKind.SPEC, what=f"{path} is a valid spec ({spec.name})"))
    return spec


def _load_site(request: AdmissionRequest, spec: RunSpec | None,
               findings: list[Finding]) -> SiteConfig | None:
    name = request.site or (spec.site if spec is not None else _raw_site(request.spec_path))
    if name is None:
        findings.append(Skipped(check=CheckKind.SITE, what="site config not checked: the spec "
                                "did not load and --site was not given"))
        return None
    try:
        site = load_site(name)
    except ConfigError as exc:
        findings.append(problem_of(CheckKind.SITE, exc))
        return None
    findings.append(Passed(check=CheckKind.SITE, what=f"site {site.name!r} loaded"))
    return site


def _raw_site(spec_path: Path) -> str | None:
    """The spec's ``site`` key read leniently, so a bad spec does not hide a bad site."""
    try:
        raw = yaml.safe_load(spec_path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    site = raw.get("site", "local") if isinstance(raw, dict) else None
    return site if isinstance(site, str) else None


def _runs_root(request: AdmissionRequest, site: SiteConfig | None, environ: Mapping[str, str],
               findings: list[Finding]) -> Path | None:
    given = request.runs_root or environ.get("HPCRUN_RUNS")
    if given:
        return Path(given).expanduser()
    if site is None:
        return None
    try:
        return expand_path(site.shared_path, environ).expanduser()
    except ConfigError as exc:
        findings.append(problem_of(CheckKind.SITE, exc))
        return None


# -- entrypoint ---------------------------------------------------------------------------------

def probe_init_from(spec: RunSpec) -> list[Finding]:
    """``checkpoint.init_from``: it exists, is DCP or safetensors, and each of its files can be
    read (its first bytes: cheap at any size; the run log gets the digest when a run loads it)."""
    path = spec.checkpoint.init_from
    if path is None:
        return []
    from hpcrun.checkpoint.initfrom import check_readable, detect_source

    try:
        src = detect_source(path)
        check_readable(src)
    except HpcrunError as exc:
        return [problem_of(CheckKind.SPEC, exc)]
    return [Passed(check=CheckKind.SPEC, what=f"checkpoint.init_from {path} is {src.fmt} "
                   f"({len(src.files)} files)")]


TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
                    "mlflow": ("mlflow", "mlflow-skinny")}
"""``observe.tracker`` → (the module rank 0 imports, the pip package that provides it)."""
_HAS_MODULE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) " \
              "else 3)"


def probe_tracker(spec: RunSpec, target: ProbeTarget, *, runner: CommandRunner,
                  env: Mapping[str, str]) -> list[Finding]:
    """``observe.tracker``: its package is importable by the job's interpreter."""
    if spec.observe.tracker is None:
        return []
    module, package = TRACKER_PACKAGES[spec.observe.tracker.value]
    try:
        result = runner.run([target.python, "-c", _HAS_MODULE, module], env=env or None,
                            timeout=ENTRYPOINT_TIMEOUT_S)
    except SchedulerError as exc:
        return [Skipped(check=CheckKind.SPEC, what=f"observe.tracker {module} not checked: the "
                        f"job's interpreter cannot be run on this node ({exc})")]
    if result.returncode != 0:
        return [Problem(check=CheckKind.SPEC,
                        what=f"observe.tracker is {module} but {target.python} cannot import "
                             f"{module!r}", expected=f"the {package} package installed",
                        fix=f"pip install {package} (or `pip install hpcrun[trackers]`) in "
                            "the job's environment, or remove observe.tracker")]
    return [Passed(check=CheckKind.SPEC, what=f"observe.tracker {module} is importable")]


def probe_entrypoint(entrypoint: str, target: ProbeTarget, *, runner: CommandRunner,
                     env: Mapping[str, str]) -> list[Finding]:
    """Whether ``entrypoint``'s module (and hpcrun) is importable where the job will run."""
    module = entrypoint.partition(":")[0]
    argv = [target.python, "-c", FIND_SPEC_SCRIPT, target.code_path, module, "hpcrun"]
    try:
        result = runner.run(argv, env=env or None, timeout=ENTRYPOINT_TIMEOUT_S)
    except SchedulerError as exc:
        return [Skipped(check=CheckKind.ENTRYPOINT,
                        what=f"module {module!r} not checked: the job's interpreter cannot be "
                             f"run on this node ({exc})")]
    return entrypoint_findings(module, target, returncode=result.returncode,
                               stdout=result.stdout, stderr=result.stderr)


def probe_script(spec: RunSpec, target: ProbeTarget) -> list[Finding]:
    """Script mode: the script is a file inside the code directory (a ``command`` is the
    user's own and is not probed)."""
    if spec.script is None:
        return [Skipped(check=CheckKind.ENTRYPOINT, what=f"command {spec.command[0]!r} not "
                        "probed: it runs as written in the code directory")]
    root = Path(target.code_path).resolve()
    path = (root / spec.script).resolve()
    if not path.is_relative_to(root):
        return [Problem(check=CheckKind.ENTRYPOINT,
                        what=f"script {spec.script!r} resolves to {path}, outside the code "
                             f"directory {root}", expected="a script inside the project",
                        fix="move the script into the project or point script at its copy")]
    if not path.is_file():
        return [Problem(check=CheckKind.ENTRYPOINT,
                        what=f"script {spec.script!r} is not a file under the code directory "
                             f"{root} (looked at {path})", expected="an existing script",
                        fix="fix `script` in run.yaml (a path from the project root) or "
                            "submit from the project root")]
    return [Passed(check=CheckKind.ENTRYPOINT, what=f"script {spec.script} found in {root}")]


# -- data ---------------------------------------------------------------------------------------

def probe_data(spec: RunSpec, mode: VerifyData, *, storage: Storage = LOCAL_STORAGE
               ) -> list[Finding]:
    """The manifest's shape and seal, every object's presence, a sample's digests."""
    from hpcrun.data.dataset import audit_objects, load_manifest

    path = spec.data.manifest
    if not path:
        return [Passed(check=CheckKind.DATA, what="the spec names no data manifest")]
    if "://" in path:
        return [Skipped(check=CheckKind.DATA, what=f"manifest {path} is remote; not checked")]
    try:
        manifest = load_manifest(path, storage=storage)
    except (DataError, StorageError) as exc:
        return [problem_of(CheckKind.DATA, exc)]
    out: list[Finding] = []
    pinned = spec.data.dataset_id
    if pinned and pinned != manifest.dataset_id:
        out.append(Problem(check=CheckKind.DATA,
                           what=f"manifest {path} is dataset {manifest.dataset_id}, the spec "
                                f"pins data.dataset_id {pinned}",
                           fix="point data.manifest at the pinned dataset, or update "
                               "data.dataset_id"))
    if mode is VerifyData.NONE:
        return [*out, Skipped(check=CheckKind.DATA, what=f"objects of {manifest.dataset_id} "
                              "not opened (--verify-data none)")]
    objects = [(o.path, o.nbytes) for s in manifest.sources for o in s.objects]
    hashed = sample_objects(objects, mode, key=manifest.dataset_id)
    errors = audit_objects(manifest, path, digest=hashed)
    out += capped([problem_of(CheckKind.DATA, e) for e in errors], noun="object problems")
    if not errors:
        out.append(Passed(check=CheckKind.DATA,
                          what=f"{manifest.dataset_id}: {len(objects)} objects present, "
                               f"{len(hashed)} hashed in full ({mode})"))
    return out


# -- storage ------------------------------------------------------------------------------------

def probe_writable(label: str, path: Path, *, storage: Storage = LOCAL_STORAGE) -> Finding:
    """Whether files can be created at ``path`` (or, when it does not exist yet, in its
    nearest existing ancestor, where creating it would start); the probe file is removed."""
    where = nearest_existing(path, storage.exists)
    probe = where / f".hpcrun-admission-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        storage.create_exclusive(probe, b"")
        storage.remove(probe)
    except StorageError as exc:
        cause = exc.__cause__
        why = getattr(cause, "strerror", None) or str(exc)
        return Problem(check=CheckKind.STORAGE,
                       what=f"{label}: cannot create files in {where} ({why})",
                       expected=f"a directory you can write, for {path}",
                       fix="fix its permissions or pick another location")
    return Passed(check=CheckKind.STORAGE, what=f"{label}: {path} is writable")


def _storage_findings(site: SiteConfig, backend: Backend, runs_root: Path | None,
                      environ: Mapping[str, str], storage: Storage) -> list[Finding]:
    out: list[Finding] = []
    if runs_root is not None:
        out.append(probe_writable("runs root (shared tier)", runs_root, storage=storage))
    if backend == Backend.LOCAL:
        try:
            local = expand_path(site.node_local_path, environ)
        except ConfigError as exc:
            return [*out, problem_of(CheckKind.SITE, exc)]
        return [*out, probe_writable("node-local tier", local, storage=storage)]
    prefix = node_local_prefix(site.node_local_path, environ)
    if prefix is None or not storage.exists(prefix):
        shown = f"{prefix} does not exist on this node" if prefix else "it has no fixed part"
        return [*out, Skipped(check=CheckKind.STORAGE,
                              what=f"node-local tier {site.node_local_path}: {shown}; it lives "
                                   "on the compute nodes (`hpcrun preflight` checks it there)")]
    return [*out, probe_writable(f"node-local tier (under {prefix})", prefix, storage=storage)]


# -- container ---------------------------------------------------------------------------------

def container_findings(site: SiteConfig, backend: Backend) -> list[Finding]:
    """The site's image is readable here and, on the local backend, its runtime is on PATH (on
    Slurm, ``hpcrun preflight`` run on a compute node checks the runtime there)."""
    from hpcrun.launch.container import COMMAND, ContainerRuntime, container_problems

    container = site.container
    if container is None:
        return []
    if container.runtime == ContainerRuntime.PYXIS:
        return [Skipped(check=CheckKind.SITE, what=f"pyxis image {container.image}: enroot "
                        "pulls it on the compute nodes (`hpcrun preflight` there checks it)")]
    problems = container_problems(container, backend=backend)
    if problems:
        return [Problem(check=CheckKind.SITE, what=p) for p in problems]
    where = "on PATH" if backend == Backend.LOCAL else (
        "on the compute nodes (`hpcrun preflight` there checks it)")
    return [Passed(check=CheckKind.SITE, what=f"{container.runtime} image {container.image} "
                   f"is readable; {COMMAND[container.runtime]} {where}")]


# -- process group backend ---------------------------------------------------------------------

def backend_findings(spec: RunSpec, site: SiteConfig) -> list[Finding]:
    """The run's process group backend fits the site: NCCL only where the run has GPUs."""
    from hpcrun.launch.gpu import backend_problem, requested_backend, resolve_backend, run_gpus

    problem = backend_problem(spec, site)
    if problem is not None:
        return [Problem(check=CheckKind.SITE, what=problem)]
    chosen = resolve_backend(requested_backend(spec, site), gpus=run_gpus(spec, site))
    return [Passed(check=CheckKind.SITE, what=f"process group backend {chosen}")]


def rank_launcher_findings(spec: RunSpec, site: SiteConfig, backend: Backend) -> list[Finding]:
    """``pmix`` ranks only where Slurm starts them, and only for an entrypoint run."""
    from hpcrun.launch.ranklaunch import rank_launcher, rank_launcher_problem

    problem = rank_launcher_problem(spec, site, backend)
    if problem is not None:
        return [Problem(check=CheckKind.SITE, what=problem)]
    if rank_launcher(spec, site) is RankLauncher.PMIX:
        return [Passed(check=CheckKind.SITE, what="ranks started by `srun --mpi=pmix`, placed "
                       "by MPI.COMM_WORLD")]
    return []


# -- scheduler ----------------------------------------------------------------------------------

def _script_findings(spec: RunSpec, site: SiteConfig) -> list[Finding]:
    """Both job scripts render: every value fits its slot (:mod:`hpcrun.launch.scriptslots`)."""
    from hpcrun.launch.sbatch import render_sbatch
    from hpcrun.launch.submit import setup_lines

    try:
        render_sbatch(spec, site, run_dir=Path("/admission"), op_id="admission")
        setup_lines(site, run_dir=Path("/admission"), op_id="admission")
    except ConfigError as exc:
        return [problem_of(CheckKind.SITE, exc)]
    return [Passed(check=CheckKind.SITE, what="the job script renders: every value fits its slot")]


def _scheduler_findings(spec: RunSpec, site: SiteConfig, runner: CommandRunner,
                        user: str) -> list[Finding]:
    from hpcrun.launch.sbatch import sbatch_args
    from hpcrun.launch.slurm_limits import JobAsk, limit_findings
    from hpcrun.launch.slurm_names import SlurmAsk, scheduler_findings

    try:
        args = sbatch_args(spec, site, run_dir=Path("/admission"), op_id="admission")
    except ConfigError as exc:
        return [problem_of(CheckKind.SITE, exc)]
    return [*scheduler_findings(SlurmAsk.from_args(args), runner, user=user),
            *limit_findings(JobAsk.from_args(args), args, runner, user=user)]
