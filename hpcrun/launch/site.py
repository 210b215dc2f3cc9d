"""Site configs: what hpcrun needs to know about one cluster, as a frozen value.

A site config is a small YAML file in ``site_configs/`` (or ``$HPCRUN_SITE_CONFIGS``) naming the
cluster's partitions, account, GPU request syntax, node-local and shared tier paths, modules and
environment, and its preemption behaviour. :func:`load_site` turns it into a :class:`SiteConfig`;
every problem (unknown key, missing key, wrong type, bad value) is one :class:`ConfigError` that
names the file and the key.

Paths may hold ``$SLURM_JOB_ID``, ``${SLURM_JOB_ID}``, ``$USER`` and ``~``; they are kept as
templates and expanded where they are used (on the compute node) by :func:`expand_path`, from an
environment passed in as a value.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from hpcrun.checkpoint.cadence import DEFAULT_MTBF_PRIOR_H
from hpcrun.control.specload import duration_expected
from hpcrun.errors import ConfigError
from hpcrun.launch.alertsinks import AlertSinks, alert_sinks_from_dict
from hpcrun.launch.container import ContainerConfig, container_from_dict
from hpcrun.launch.fabric import check_interface_name
from hpcrun.launch.jobsetup import sbatch_extra_from_dict
from hpcrun.launch.sections import str_tuple
from hpcrun.launch.shipped import shipped_dir
from hpcrun.launch.signals import signal_number
from hpcrun.launch.striping import SharedTierConfig, shared_tier_from_dict
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import Backend, DistBackend, RankLauncher

SITE_SCHEMA_VERSION = 1
SITE_CONFIGS_ENV = "HPCRUN_SITE_CONFIGS"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_VAR_RE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
_MAX_SIGNAL_LEAD_S = 65535  # Slurm's --signal accepts at most 0xffff seconds


class PreemptMode(StrEnum):
    """What Slurm itself does to a preempted job of this site's partition."""

    REQUEUE = "requeue"  # Slurm requeues the job itself: hpcrun must not requeue it again
    CANCEL = "cancel"    # Slurm cancels the job: hpcrun requeues (or resubmits) after its commit
    OFF = "off"          # no preemption on this partition; only time limits and failures


@dataclass(frozen=True, kw_only=True, slots=True)
class SiteConfig:
    """One cluster's settings (``site_configs/<name>.yaml``)."""

    name: str
    """Short name of the site (``generic-gpu``); a run spec's ``site`` refers to it."""
    node_local_path: str
    """Node-local tier (NVMe) root, a template expanded on the node (``/scratch/$SLURM_JOB_ID``)."""
    shared_path: str
    """Runs root on the parallel filesystem (Lustre/GPFS), a template (``/lustre/$USER/runs``)."""
    backend: Backend = Backend.SLURM
    """``slurm`` or ``local`` (the embedded backend: local processes, no scheduler)."""
    partition: str | None = None
    """Default partition for runs (a spec's ``resources.partition`` overrides it)."""
    high_partition: str | None = None
    """A higher-priority partition whose jobs preempt ``partition`` (tests, urgent reruns)."""
    account: str | None = None
    """Default account to charge (``--account``)."""
    qos: str | None = None
    """Default quality of service (``--qos``)."""
    constraint: str | None = None
    """Default node feature constraint (``--constraint``)."""
    gpus_per_node: int = 0
    """GPUs each node has; a spec may ask for at most this many."""
    gres: str | None = None
    """GRES template with ``{n}`` for the GPU count (``gpu:a100:{n}``); None: --gpus-per-node."""
    modules: tuple[str, ...] = ()
    """Environment modules loaded (``module load``) before the agents start."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables exported before the agents start."""
    preempt_signal: str = "USR1"
    """Signal Slurm sends before a preemption or the time limit (some NCCL versions catch USR1)."""
    preempt_lead_s: int = 120
    """Seconds before the time limit the signal is sent (``--signal=<sig>@<lead>``)."""
    preempt_mode: PreemptMode = PreemptMode.REQUEUE
    """What Slurm does to a preempted job of ``partition`` (``PreemptMode`` in slurm.conf)."""
    srun_extra_flags: tuple[str, ...] = ()
    """Extra flags for the ``srun`` that starts the agents (``--mpi=pmix``, ``--network=...``)."""
    python: str | None = None
    """Python interpreter on the compute nodes; None means the submitting interpreter."""
    fabric_interface: str = ""
    """Network interface the agents talk to each other on (partner copies of tier 0, the
    restore's peer tier, liveness beats), e.g. ``ib0`` or ``hsn0``: each node binds that
    interface's IPv4 address, and a run that uses them fails at its start on a node without
    it. Empty: the interface holding the node's Slurm ``NodeAddr`` (``hpcrun/launch/fabric.py``)."""
    mtbf_prior_h: float = DEFAULT_MTBF_PRIOR_H
    """Prior mean time between interruptions of one run, in hours: the checkpoint cadence and
    the report combine it with the run's observed interruptions
    (:func:`hpcrun.checkpoint.cadence.posterior_mtbf`)."""
    requeue_allowed: bool = True
    """Whether jobs may be requeued on this site (``--requeue``, ``scontrol requeue``)."""
    dist_backend: DistBackend = DistBackend.AUTO
    """Default process group backend of this site's runs (a spec's ``dist.backend`` wins)."""
    rank_launcher: RankLauncher = RankLauncher.AGENT
    """What starts the ranks: ``agent`` (each node's agent forks them) or ``pmix`` (one
    ``srun --mpi=pmix`` step per incarnation, ranks placed by MPI: needs Slurm's PMIx plugin,
    Open MPI and mpi4py on the nodes); a spec's ``dist.rank_launcher`` wins."""
    pg_init_timeout_s: float = 300.0
    """Seconds the rendezvous and process-group init may wait for every rank."""
    step_timeout_s: float = 120.0
    """Seconds one training or step-agreement collective may wait before it counts as a hang."""
    checkpoint_timeout_s: float = 600.0
    """Seconds one checkpoint collective may wait (a save agreement waits for the slowest
    rank's staging; a restore exchange moves shard bytes)."""
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    """Overrides of the NCCL variables the agent sets for GPU ranks (an empty value unsets
    one); see :data:`hpcrun.launch.gpu.DEFAULT_NCCL_ENV`."""
    setup: tuple[str, ...] = ()
    """Shell lines the job runs before the agents start (``module load ...``, ``source
    /path/venv/bin/activate``, ``conda activate env``); a failing line ends the job."""
    container: ContainerConfig | None = None
    """The image the ranks (Charliecloud, Apptainer) or the agents (Pyxis) run in
    (:class:`~hpcrun.launch.container.ContainerConfig`); None: the host environment."""
    sbatch_extra: Mapping[str, str] = field(default_factory=dict)
    """sbatch options hpcrun does not model (``mem: 0``, ``exclusive: true``); a spec's
    ``resources.sbatch_extra`` overrides them option by option."""
    shared_tier: SharedTierConfig | None = None
    """Lustre striping of checkpoint directories and the deadline of shared-tier operations
    (:class:`~hpcrun.launch.striping.SharedTierConfig`); None: defaults, no striping."""
    sweep_max_points: int = 1000
    """Most points one sweep may have (``hpcrun sweep`` refuses a larger one before it
    creates anything): one Slurm job array, and ``MaxArraySize`` in slurm.conf is often near
    1,000."""
    alerts: AlertSinks | None = None
    """Where ``hpcrun watch`` delivers new alerts (:class:`~hpcrun.launch.alertsinks.AlertSinks`:
    a webhook, email); None: alerts are only shown by ``hpcrun status``."""

    def __post_init__(self) -> None:
        _check(bool(_NAME_RE.match(self.name)), "name", "letters, digits, '_', '.', '-'",
               self.name)
        _check(bool(self.node_local_path.strip()), "node_local_path", "a non-empty path",
               self.node_local_path)
        _check(bool(self.shared_path.strip()), "shared_path", "a non-empty path", self.shared_path)
        self._check_numbers()
        if self.gres is not None:
            _check("{n}" in self.gres, "gres", "a template holding '{n}' (gpu:{n})", self.gres)
        check_interface_name(self.fabric_interface)
        try:
            signal_number(self.preempt_signal)
        except ConfigError as exc:
            raise ConfigError(f"site {self.name!r}: preempt_signal: {exc}") from None
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "nccl_env", MappingProxyType(dict(self.nccl_env)))
        object.__setattr__(self, "sbatch_extra", MappingProxyType(dict(self.sbatch_extra)))

    def _check_numbers(self) -> None:
        """Every number is finite and within what its consumer accepts."""
        _check(self.gpus_per_node >= 0, "gpus_per_node", "an integer >= 0", self.gpus_per_node)
        _check(0 <= self.preempt_lead_s <= _MAX_SIGNAL_LEAD_S, "preempt_lead_s",
               f"0..{_MAX_SIGNAL_LEAD_S} seconds", self.preempt_lead_s)
        _check(math.isfinite(self.mtbf_prior_h) and self.mtbf_prior_h > 0, "mtbf_prior_h",
               "finite hours > 0", self.mtbf_prior_h, fix="write the site's expected hours "
               "between interruptions of a run, e.g. 24")
        for key in ("pg_init_timeout_s", "step_timeout_s", "checkpoint_timeout_s"):
            expected = duration_expected(getattr(self, key))
            _check(expected is None, key, expected or "", getattr(self, key),
                   fix="write a finite number of seconds within that range")
        _check(self.sweep_max_points >= 1, "sweep_max_points", "an integer >= 1",
               self.sweep_max_points, fix="write the most points one sweep may have, e.g. 1000")

    def signal_name(self) -> str:
        """The preemption signal as Slurm spells it in ``--signal`` (``USR1``)."""
        import signal

        return signal.Signals(signal_number(self.preempt_signal)).name.removeprefix("SIG")

    def gpu_flag(self, gpus: int) -> tuple[str, str] | None:
        """The sbatch flag requesting ``gpus`` GPUs per node, or None for a CPU-only request."""
        if gpus <= 0:
            return None
        if self.gres is not None:
            return ("gres", self.gres.format(n=gpus))
        return ("gpus-per-node", str(gpus))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with ``schema_version``), as :func:`site_from_dict` reads it."""
        out: dict[str, Any] = {"schema_version": SITE_SCHEMA_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ContainerConfig | SharedTierConfig | AlertSinks):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value.value if isinstance(value, StrEnum) else value
        return out


def _check(ok: bool, key: str, expected: str, found: object, *, fix: str = "") -> None:
    if not ok:
        raise ConfigError(f"site config key {key!r}: expected {expected}, found {found!r}"
                          + (f"; {fix}" if fix else ""))


# -- parsing ------------------------------------------------------------------------------------

_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "node_local_path": (str,), "shared_path": (str,), "backend": (str,),
    "partition": (str,), "high_partition": (str,), "account": (str,), "qos": (str,),
    "constraint": (str,), "gpus_per_node": (int,), "gres": (str,), "preempt_signal": (str, int),
    "preempt_lead_s": (int,), "preempt_mode": (str,), "python": (str,),
    "mtbf_prior_h": (int, float), "requeue_allowed": (bool,), "dist_backend": (str,),
    "rank_launcher": (str,),
    "pg_init_timeout_s": (int, float), "step_timeout_s": (int, float),
    "checkpoint_timeout_s": (int, float), "sweep_max_points": (int,), "fabric_interface": (str,),
}
_LIST_KEYS = frozenset({"modules", "srun_extra_flags", "setup"})
_MAPPING_KEYS = frozenset({"container", "sbatch_extra", "shared_tier", "alerts"})
_NULLABLE = frozenset({"partition", "high_partition", "account", "qos", "constraint", "gres",
                       "python"})
_REQUIRED = ("name", "node_local_path", "shared_path")
_ENUMS: dict[str, type[StrEnum]] = {"backend": Backend, "preempt_mode": PreemptMode,
                                     "dist_backend": DistBackend, "rank_launcher": RankLauncher}
_ENV_KEYS = frozenset({"env", "nccl_env"})


def site_from_dict(raw: object, *, source: str = "<site config>") -> SiteConfig:
    """Validate a parsed site config (untrusted) and build the :class:`SiteConfig`.

    Raises:
        ConfigError: naming ``source`` and the offending key, with what was expected and found.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping of site settings at the top level, "
                          f"found {type(raw).__name__}; see site_configs/generic-gpu.yaml")
    body = {k: v for k, v in raw.items() if k != "schema_version"}
    _check_schema_version(raw.get("schema_version", SITE_SCHEMA_VERSION), source)
    _check_keys(body, source)
    kwargs: dict[str, Any] = {key: _convert(key, value, source) for key, value in body.items()}
    try:
        return SiteConfig(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_schema_version(version: object, source: str) -> None:
    if version != SITE_SCHEMA_VERSION:
        raise ConfigError(f"{source}: key 'schema_version': expected {SITE_SCHEMA_VERSION}, "
                          f"found {version!r}; this file was written for another hpcrun version")


def _check_keys(body: Mapping[Any, Any], source: str) -> None:
    known = set(_SCALAR_TYPES) | _LIST_KEYS | _ENV_KEYS | _MAPPING_KEYS
    for key in body:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r}; expected one of "
                              f"{', '.join(sorted(known))}; remove or rename it")
    for key in _REQUIRED:
        if key not in body:
            raise ConfigError(f"{source}: missing required key {key!r}; add `{key}: ...` "
                              "(see site_configs/generic-gpu.yaml)")


def _convert(key: str, value: object, source: str) -> object:
    if key in _LIST_KEYS:
        return str_tuple(key, value, source)
    if key in _ENV_KEYS:
        return _as_env(value, source, key=key)
    if key == "container":
        return container_from_dict(value, source=source)
    if key == "alerts":
        return alert_sinks_from_dict(value, source=source)
    if key == "shared_tier":
        return shared_tier_from_dict(value, source=source)
    if key == "sbatch_extra":
        return sbatch_extra_from_dict(value, source=source)
    if value is None and key in _NULLABLE:
        return None
    if value is None and key == "fabric_interface":
        return ""  # `fabric_interface:` with nothing after it: the default
    types = _SCALAR_TYPES[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ConfigError(f"{source}: key {key!r}: expected {_type_words(types)}, found "
                          f"{value!r} ({type(value).__name__})")
    if key in _ENUMS:
        return _as_enum(key, str(value), source)
    return str(value) if key == "preempt_signal" else value


def _type_words(types: tuple[type, ...]) -> str:
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number",
                        "bool": "true/false"}[t.__name__] for t in types)


def _as_enum(key: str, value: str, source: str) -> StrEnum:
    enum = _ENUMS[key]
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)  # type: ignore[attr-defined]
        raise ConfigError(f"{source}: key {key!r}: expected one of {choices}, "
                          f"found {value!r}") from None


def _as_env(value: object, source: str, *, key: str = "env") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: key {key!r}: expected a mapping NAME: value, "
                          f"found {value!r}")
    out: dict[str, str] = {}
    for name, val in value.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"{source}: key '{key}.{name}': expected a shell variable name")
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise ConfigError(f"{source}: key '{key}.{name}': expected a string or number, "
                              f"found {val!r}")
        out[name] = str(val)
    return out


# -- finding and loading ------------------------------------------------------------------------

def site_configs_dir() -> Path:
    """The shipped ``site_configs/`` directory (:func:`~hpcrun.launch.shipped.shipped_dir`)."""
    return shipped_dir("site_configs")


def default_search_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Where site names are looked up: the shipped directory, then ``$HPCRUN_SITE_CONFIGS``."""
    dirs = [site_configs_dir()]
    extra = environ.get(SITE_CONFIGS_ENV, "")
    dirs += [Path(p) for p in extra.split(os.pathsep) if p]
    return dirs


def find_site_file(name_or_path: str, search_dirs: Sequence[Path]) -> Path:
    """Resolve a site name or a path to a YAML file; raise ConfigError listing where it looked."""
    candidate = Path(name_or_path).expanduser()
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if candidate.is_file():
            return candidate
        raise ConfigError(f"site config file {name_or_path!r} does not exist; pass an existing "
                          "file or a site name")
    for directory in search_dirs:
        for suffix in (".yaml", ".yml"):
            path = directory / f"{name_or_path}{suffix}"
            if path.is_file():
                return path
    looked = ", ".join(str(d) for d in search_dirs)
    raise ConfigError(f"unknown site {name_or_path!r}: no {name_or_path}.yaml in {looked}; "
                      f"pick one of {', '.join(available_sites(search_dirs)) or '(none)'} or "
                      f"add a directory to ${SITE_CONFIGS_ENV}")


def available_sites(search_dirs: Sequence[Path]) -> list[str]:
    """Names of the site configs found in ``search_dirs``."""
    names = {p.stem for d in search_dirs if d.is_dir() for p in d.iterdir()
             if p.suffix in (".yaml", ".yml")}
    return sorted(names)


def load_site(name_or_path: str, *, search_dirs: Sequence[Path] | None = None) -> SiteConfig:
    """Load a site config by name (``site_configs/<name>.yaml``) or by path.

    Args:
        name_or_path: a site name (``testbed``) or a path to a YAML file.
        search_dirs: directories to look names up in; default the shipped ``site_configs/``
            then each directory of ``$HPCRUN_SITE_CONFIGS``.

    Raises:
        ConfigError: unknown site, unreadable file, bad YAML, or an invalid key (named).
    """
    dirs = list(search_dirs) if search_dirs is not None else default_search_dirs(os.environ)
    path = find_site_file(name_or_path, dirs)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read site config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); "
                          "fix the syntax") from exc
    return site_from_dict(raw, source=str(path))


def path_variables(template: str) -> list[str]:
    """Names of the variables (``$VAR``, ``${VAR}``) a path template uses, in order (pure)."""
    return [m.group("braced") or m.group("bare") for m in _VAR_RE.finditer(template)]


def expand_path(template: str, env: Mapping[str, str]) -> Path:
    """Expand ``$VAR``, ``${VAR}`` and a leading ``~`` in ``template`` from ``env``.

    Raises:
        ConfigError: a variable the template needs is not in ``env`` (named, with the template).
    """
    def substitute(match: re.Match[str]) -> str:
        var = match.group("braced") or match.group("bare")
        if var not in env:
            raise ConfigError(f"path {template!r} needs ${var}, which is not set here; expand it "
                              "where it is set (on the compute node) or set it")
        return env[var]

    expanded = _VAR_RE.sub(substitute, template)
    if expanded == "~" or expanded.startswith("~/"):
        if "HOME" not in env:
            raise ConfigError(f"path {template!r} starts with ~ but $HOME is not set; "
                              "use an absolute path")
        expanded = env["HOME"] + expanded[1:]
    return Path(expanded)


# -- the run directory's copy -------------------------------------------------------------------

SITE_SNAPSHOT = "site.json"
"""File name of the site config frozen into a run directory at submit."""


def save_site_snapshot(run_dir: Path, site: SiteConfig, *,
                       storage: Storage = LOCAL_STORAGE) -> Path:
    """Freeze ``site`` into ``run_dir/site.json`` (durably), so every node reads the same values.

    A requeued job, or an agent on a node without the submitter's ``$HPCRUN_SITE_CONFIGS``, then
    runs with exactly the settings the run was submitted with.
    """
    path = Path(run_dir) / SITE_SNAPSHOT
    body = json.dumps(site.to_dict(), sort_keys=True, indent=1) + "\n"
    storage.write_atomic(path, body.encode())
    return path


def load_site_snapshot(run_dir: Path, *, storage: Storage = LOCAL_STORAGE) -> SiteConfig:
    """Read back the site config frozen into ``run_dir`` (validated like any site file).

    Raises:
        ConfigError: the snapshot is missing, not JSON, or invalid (naming the file and key).
    """
    path = Path(run_dir) / SITE_SNAPSHOT
    try:
        raw = json.loads(storage.read_bytes(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the run's site snapshot {path}: {exc}; the run "
                          "directory is incomplete, submit the run again") from exc
    return site_from_dict(raw, source=str(path))
