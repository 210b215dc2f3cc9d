"""A run's GPU settings: backend choice, collective timeouts, NCCL environment, GPU count (pure).

The node agent resolves these once per rank from the run spec and the site config
(:func:`rank_environ`) and hands them to the rank as environment variables; the rank reads
them back once (:meth:`GpuSettings.from_environ`) and forms its process groups
(:func:`hpcrun.launch.dist.form_groups`).

- **Backend.** ``dist.backend`` in the spec, else the site's ``dist_backend``; ``auto`` means NCCL
  when the run has GPUs (the site has them and the spec asks for ``resources.gpus_per_node``),
  gloo otherwise. NCCL asked for a run without GPUs is refused at submit (:func:`backend_problem`).
- **Timeouts.** Three, each from the spec's ``dist`` section or the site config: the rendezvous
  and process-group init, one training or step-agreement collective, one checkpoint collective.
- **NCCL environment.** :data:`DEFAULT_NCCL_ENV` plus the flight recorder's dump file under the
  run's hang diagnostics, overridden by the site's ``nccl_env`` (an empty value unsets one).
- **GPU count.** A node that sees fewer GPUs than the run needs is a ``node_failure`` found at
  agent start (:func:`gpu_shortfall`), never a hang in the first collective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.errors import EnvError
from hpcrun.vocab import DistBackend

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.site import SiteConfig

DEFAULT_NCCL_ENV: Mapping[str, str] = {
    # A failed or timed-out NCCL collective aborts the communicator and raises in the rank
    # instead of leaving every peer blocked in the kernel.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # Warnings and errors only, into the rank's own log (its stdout is rank-NNNNN.out).
    "NCCL_DEBUG": "WARN",
    # The flight recorder: the last collectives of each rank, dumped when a collective times out.
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
"""NCCL variables the agent sets for every rank of an NCCL run (the site may override them)."""

FLIGHT_RECORDER_VAR = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
"""Prefix of the flight recorder's per-rank dump file (torch appends the rank)."""
FLIGHT_RECORDER_FILE = "nccl-trace-rank-"
"""File name prefix of the dumps in the run's hang diagnostics directory."""

_VARS = {"backend": "HPCRUN_DIST_BACKEND", "init_timeout_s": "HPCRUN_PG_INIT_TIMEOUT_S",
         "step_timeout_s": "HPCRUN_STEP_TIMEOUT_S",
         "checkpoint_timeout_s": "HPCRUN_CKPT_TIMEOUT_S", "cpus": "HPCRUN_CPU_AFFINITY"}


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveTimeouts:
    """How long each phase's collectives may wait for every rank, in seconds."""

    init_s: float = 300.0
    """The rendezvous (TCP store) and the process groups' creation."""
    step_s: float = 120.0
    """One collective of the training step (DDP, the step agreement)."""
    checkpoint_s: float = 600.0
    """One collective of a save or a restore (the checkpoint group)."""

    def __post_init__(self) -> None:
        for name in ("init_s", "step_s", "checkpoint_s"):
            value = getattr(self, name)
            if not value > 0:
                raise EnvError(f"collective timeout {name} must be > 0 s, found {value!r}; "
                               "set a positive value in the spec's dist section or the site")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSettings:
    """What a rank needs to form its process groups, as resolved by its agent."""

    backend: DistBackend = DistBackend.GLOO
    """``nccl`` or ``gloo`` (never ``auto``: resolved by :func:`resolve_backend`)."""
    timeouts: CollectiveTimeouts = CollectiveTimeouts()
    """Per-phase collective timeouts."""
    cpus: tuple[int, ...] = ()
    """CPU cores this rank is bound to (its GPU's NUMA node); empty: not bound."""

    def to_environ(self) -> dict[str, str]:
        """The ``HPCRUN_*`` variables carrying these settings to the rank."""
        t = self.timeouts
        return {_VARS["backend"]: str(self.backend), _VARS["init_timeout_s"]: f"{t.init_s:g}",
                _VARS["step_timeout_s"]: f"{t.step_s:g}",
                _VARS["checkpoint_timeout_s"]: f"{t.checkpoint_s:g}",
                _VARS["cpus"]: format_cpulist(self.cpus)}

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> GpuSettings:
        """Read the settings back; absent variables keep the defaults (gloo, default timeouts).

        Raises:
            EnvError: a variable is malformed (named, with its value).
        """
        default = CollectiveTimeouts()
        backend = env.get(_VARS["backend"], "") or DistBackend.GLOO
        if backend not in (DistBackend.NCCL, DistBackend.GLOO):
            raise EnvError(f"{_VARS['backend']}={backend!r}: expected nccl or gloo; the agent "
                           "resolves auto before starting a rank")
        timeouts = CollectiveTimeouts(
            init_s=_seconds(env, "init_timeout_s", default.init_s),
            step_s=_seconds(env, "step_timeout_s", default.step_s),
            checkpoint_s=_seconds(env, "checkpoint_timeout_s", default.checkpoint_s))
        cpus = parse_cpulist(env.get(_VARS["cpus"], ""), source=_VARS["cpus"])
        return cls(backend=DistBackend(backend), timeouts=timeouts, cpus=cpus)


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(_VARS[key], "")
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{_VARS[key]}={raw!r} is not a number of seconds; fix the site config "
                       "or the spec's dist section") from None


# -- resolution (spec + site) -------------------------------------------------------------------

def run_gpus(spec: RunSpec, site: SiteConfig) -> int:
    """GPUs per node the run gets: the spec's request on a site that has GPUs, else 0."""
    return spec.resources.gpus_per_node if site.gpus_per_node > 0 else 0


def requested_backend(spec: RunSpec, site: SiteConfig) -> DistBackend:
    """The spec's ``dist.backend``, else the site's default (may be ``auto``)."""
    return spec.dist.backend if spec.dist.backend is not None else site.dist_backend


def resolve_backend(requested: DistBackend, *, gpus: int) -> DistBackend:
    """``nccl`` or ``gloo``: ``auto`` is NCCL when the run has GPUs."""
    if requested is DistBackend.AUTO:
        return DistBackend.NCCL if gpus > 0 else DistBackend.GLOO
    return requested


def backend_problem(spec: RunSpec, site: SiteConfig) -> str | None:
    """Why the run's backend cannot work on ``site``, or None (checked at submit)."""
    asked = requested_backend(spec, site)
    if asked is not DistBackend.NCCL or run_gpus(spec, site) > 0:
        return None
    source = "dist.backend" if spec.dist.backend is not None else f"site {site.name!r} default"
    if site.gpus_per_node == 0:
        why = f"site {site.name!r} has no GPUs (gpus_per_node: 0)"
        fix = "set dist.backend: gloo (or auto), or submit to a GPU site"
    else:
        why = "the spec asks for no GPUs (resources.gpus_per_node: 0)"
        fix = "set resources.gpus_per_node, or dist.backend: gloo (or auto)"
    return f"{source} is nccl but {why}; NCCL needs a GPU per rank; {fix}"


def resolve_timeouts(spec: RunSpec, site: SiteConfig) -> CollectiveTimeouts:
    """Each timeout from the spec's ``dist`` section when set, else from the site config."""
    d = spec.dist
    return CollectiveTimeouts(
        init_s=d.init_timeout_s or site.pg_init_timeout_s,
        step_s=d.step_timeout_s or site.step_timeout_s,
        checkpoint_s=d.checkpoint_timeout_s or site.checkpoint_timeout_s)


def nccl_environ(overrides: Mapping[str, str], *, diagnostics_dir: Path) -> dict[str, str]:
    """The NCCL variables of a rank: defaults, the flight recorder's dump path, site overrides.

    An override with an empty value removes the variable (the rank then inherits NCCL's own
    default, or the node's environment).
    """
    env = dict(DEFAULT_NCCL_ENV)
    env[FLIGHT_RECORDER_VAR] = str(Path(diagnostics_dir) / FLIGHT_RECORDER_FILE)
    env.update(overrides)
    return {k: v for k, v in env.items() if v != ""}


def rank_environ(spec: RunSpec, site: SiteConfig, *, diagnostics_dir: Path,
                 cpus: Sequence[int] = ()) -> dict[str, str]:
    """Everything GPU-related the agent puts into one rank's environment."""
    backend = resolve_backend(requested_backend(spec, site), gpus=run_gpus(spec, site))
    settings = GpuSettings(backend=backend, timeouts=resolve_timeouts(spec, site),
                           cpus=tuple(cpus))
    env = settings.to_environ()
    if backend is DistBackend.NCCL:
        env.update(nccl_environ(site.nccl_env, diagnostics_dir=diagnostics_dir))
    return env


# -- the node's GPUs ----------------------------------------------------------------------------

def needed_gpus(spec: RunSpec, site: SiteConfig) -> int:
    """GPUs each node must see: the request, and one per rank on an NCCL run."""
    gpus = run_gpus(spec, site)
    backend = resolve_backend(requested_backend(spec, site), gpus=gpus)
    per_rank = spec.resources.tasks_per_node if backend is DistBackend.NCCL else 0
    return max(gpus, per_rank)


def visible_gpu_count(environ: Mapping[str, str], driver_gpus: Sequence[str]) -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else the driver's list.

    Args:
        environ: the agent's environment (Slurm sets ``CUDA_VISIBLE_DEVICES`` for the GPUs it
            allocated).
        driver_gpus: entries of ``/proc/driver/nvidia/gpus`` (one per GPU the driver sees).
    """
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return len(driver_gpus)
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if entries in (["NoDevFiles"], ["-1"]):
        return 0
    return len(entries)


def gpu_shortfall(node: str, *, needed: int, seen: int) -> str | None:
    """The error of a node that sees fewer GPUs than the run needs, or None."""
    if seen >= needed:
        return None
    return (f"node {node} sees {seen} GPU(s) but the run needs {needed} per node "
            "(resources.gpus_per_node, and one per rank with NCCL); the node is quarantined. "
            "Check the node's driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the GPU request")


def physical_gpu(environ: Mapping[str, str], local_rank: int) -> int:
    """The driver's index of the GPU ``cuda:<local_rank>`` names (through CUDA_VISIBLE_DEVICES)."""
    entries = [e.strip() for e in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if local_rank < len(entries) and entries[local_rank].isdigit():
        return int(entries[local_rank])
    return local_rank


# -- CPU lists ----------------------------------------------------------------------------------

def parse_cpulist(text: str, *, source: str = "cpu list") -> tuple[int, ...]:
    """``0-3,8,10-11`` → ``(0, 1, 2, 3, 8, 10, 11)`` (the kernel's cpulist format)."""
    cpus: list[int] = []
    for item in text.strip().split(","):
        item = item.strip()
        if not item:
            continue
        lo, _, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise EnvError(f"{source}: {text!r} is not a CPU list such as 0-3,8") from None
        if last < first:
            raise EnvError(f"{source}: range {item!r} in {text!r} runs backwards")
        cpus.extend(range(first, last + 1))
    return tuple(sorted(set(cpus)))


def format_cpulist(cpus: Sequence[int]) -> str:
    """Inverse of :func:`parse_cpulist`, with runs folded: ``(0, 1, 2, 5)`` → ``0-2,5``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
