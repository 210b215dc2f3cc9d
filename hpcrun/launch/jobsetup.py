"""What a site needs in the job besides the allocation: setup lines, a container, extra flags.

- ``setup:`` shell lines run by the batch shell before the agents start (``module load``,
  ``source .../activate``, ``conda activate``).
- ``container:`` runs the agents (and so the ranks) in an image: Pyxis/enroot adds
  ``--container-image`` and ``--container-mounts`` to the agents' ``srun``; Apptainer wraps the
  interpreter in ``apptainer exec --nv --bind ...``.
- ``sbatch_extra:`` any ``sbatch`` option hpcrun does not model (``--mem``, ``--exclusive``,
  ``--reservation``, ``--switches``, ``--mail-type``, ``--network``), site defaults first, the
  spec's ``resources.sbatch_extra`` overriding them; each is checked against
  :data:`SBATCH_OPTIONS`, and options hpcrun sets itself are refused with the key that sets them.

Everything here is pure: values in, values out.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpcrun.errors import ConfigError
from hpcrun.launch.sections import section_mapping

__all__ = ["MODELED_OPTIONS", "SBATCH_OPTIONS", "ContainerConfig", "ContainerRuntime",
           "check_sbatch_option", "container_from_dict", "merge_sbatch_extra",
           "render_container", "sbatch_extra_from_dict"]

BARE = ""
"""Value of a flag that takes no argument (``--exclusive``)."""

SBATCH_OPTIONS = frozenset({
    "acctg-freq", "batch", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "contiguous", "core-spec", "cores-per-socket",
    "cpu-freq", "cpus-per-gpu", "deadline", "delay-boot", "distribution", "exclusive",
    "export", "export-file", "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq",
    "gpus", "gpus-per-socket", "gpus-per-task", "hint", "hold", "ignore-pbs", "kill-on-invalid-dep",
    "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu",
    "mem-per-gpu", "mincpus", "network", "nice", "no-kill", "nodefile", "oversubscribe",
    "power", "prefer", "priority", "profile", "propagate", "reboot", "reservation",
    "sockets-per-node", "spread-job", "switches", "thread-spec", "threads-per-core",
    "tmp", "uid", "use-min-nodes", "wckey", "wrap", "account", "cpus-per-task", "dependency",
    "error", "exclude", "gpus-per-node", "gres", "gres-flags", "input", "job-name", "nodelist",
    "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "parsable", "partition", "qos", "quiet",
    "requeue", "no-requeue", "signal", "time", "time-min", "array", "kill-on-bad-exit",
})
"""``sbatch`` long options (Slurm 22.05), without the dashes."""

MODELED_OPTIONS: Mapping[str, str] = {
    "job-name": "the spec's name", "nodes": "resources.nodes (+ spare_nodes)",
    "ntasks-per-node": "resources.tasks_per_node (one agent per node starts the ranks)",
    "ntasks": "resources.nodes and tasks_per_node", "cpus-per-task": "resources.cpus_per_task",
    "gpus-per-node": "resources.gpus_per_node", "gres": "resources.gpus_per_node (site gres)",
    "time": "resources.time_limit_min", "partition": "resources.partition",
    "account": "resources.account", "qos": "resources.qos",
    "constraint": "resources.constraint", "exclude": "resources.exclude",
    "begin": "the retry backoff", "requeue": "the site's requeue_allowed",
    "no-requeue": "the site's requeue_allowed",
    "signal": "the site's preempt_signal and preempt_lead_s",
    "open-mode": "hpcrun (job logs append across requeues)",
    "comment": "hpcrun (the operation id it finds the job by)",
    "output": "hpcrun (RUN_DIR/logs)", "error": "hpcrun (RUN_DIR/logs)",
    "wrap": "hpcrun (the job script)", "array": "the sweep commands",
    "dependency": "the pipeline commands", "parsable": "hpcrun (how it reads the job id)",
    "hold": "hpcrun (requeue holds)", "chdir": "hpcrun (the run directory)",
    "export": "the site's env (exported by the job script)",
}
"""Options hpcrun sets itself, and the setting to use instead of ``sbatch_extra``."""


class ContainerRuntime(StrEnum):
    """How the agents run inside an image."""

    PYXIS = "pyxis"          # srun --container-image (NVIDIA Pyxis + enroot)
    APPTAINER = "apptainer"  # apptainer exec --nv IMAGE python (also Singularity sites)


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerConfig:
    """The image the agents and their ranks run in."""

    runtime: ContainerRuntime
    """``pyxis`` or ``apptainer``."""
    image: str
    """Image reference: ``nvcr.io#nvidia/pytorch:24.05-py3`` (Pyxis), a ``.sif`` path
    (Apptainer)."""
    mounts: tuple[str, ...] = ()
    """``SRC:DST[:FLAGS]`` bind mounts; the shared tier and the run directory must be in it."""
    flags: tuple[str, ...] = ()
    """Extra flags: added to ``srun`` (Pyxis, e.g. ``--container-workdir=/work``) or to
    ``apptainer exec`` (e.g. ``--cleanenv``)."""
    gpus: bool = True
    """Apptainer: pass ``--nv`` (the host's NVIDIA driver into the image)."""

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise ConfigError("container.image: expected an image reference, found ''; name "
                              "the image (a .sif path for apptainer, a registry ref for pyxis)")
        for mount in self.mounts:
            if ":" not in mount or mount.startswith(":"):
                raise ConfigError(f"container.mounts: expected SRC:DST[:FLAGS], found "
                                  f"{mount!r}; write e.g. /lustre:/lustre")

    def srun_flags(self) -> tuple[str, ...]:
        """Flags for the agents' ``srun`` (Pyxis); none for Apptainer."""
        if self.runtime != ContainerRuntime.PYXIS:
            return ()
        mounts = (f"--container-mounts={','.join(self.mounts)}",) if self.mounts else ()
        return (f"--container-image={self.image}", *mounts, *self.flags)

    def wrap(self, python: str) -> str:
        """The interpreter command inside the image (Apptainer); ``python`` as is for Pyxis."""
        if self.runtime != ContainerRuntime.APPTAINER:
            return python
        nv = ("--nv",) if self.gpus else ()
        binds = tuple(f"--bind={m}" for m in self.mounts)
        words = ("apptainer", "exec", *nv, *binds, *self.flags, self.image)
        return " ".join(shlex.quote(w) for w in words) + " " + python

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as :func:`container_from_dict` reads it."""
        return {"runtime": self.runtime.value, "image": self.image, "mounts": list(self.mounts),
                "flags": list(self.flags), "gpus": self.gpus}


_CONTAINER_KEYS = ("runtime", "image", "mounts", "flags", "gpus")


def container_from_dict(raw: object, *, source: str) -> ContainerConfig | None:
    """Validate a site config's ``container:`` mapping (None: no container).

    Raises:
        ConfigError: naming ``source`` and the key.
    """
    raw = section_mapping(raw, key="container", keys=_CONTAINER_KEYS, source=source,
                          expected="a mapping with runtime and image")
    if raw is None:
        return None
    runtime = raw.get("runtime")
    if runtime not in {r.value for r in ContainerRuntime}:
        raise ConfigError(f"{source}: key 'container.runtime': expected pyxis or apptainer, "
                          f"found {runtime!r}")
    lists = {k: _str_list(raw.get(k), f"container.{k}", source) for k in ("mounts", "flags")}
    gpus = raw.get("gpus", True)
    if not isinstance(gpus, bool):
        raise ConfigError(f"{source}: key 'container.gpus': expected true/false, found {gpus!r}")
    image = raw.get("image")
    if not isinstance(image, str):
        raise ConfigError(f"{source}: key 'container.image': expected a string, found {image!r}")
    try:
        return ContainerConfig(runtime=ContainerRuntime(runtime), image=image, gpus=gpus,
                               **lists)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _str_list(value: object, key: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: key {key!r}: expected a list of strings, found {value!r}")
    return tuple(value)


def sbatch_extra_from_dict(raw: object, *, source: str) -> dict[str, str]:
    """Validate an ``sbatch_extra`` mapping: ``option: value``; ``true`` or ``""`` is a bare
    flag, ``false`` leaves the option out.

    Raises:
        ConfigError: not a mapping, a value of the wrong type, an unknown option, or one that
            hpcrun sets itself (naming the setting to use instead).
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: sbatch_extra: expected a mapping option: value (mem: "
                          f"64G), found {raw!r}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        option = str(key).removeprefix("--")
        check_sbatch_option(option, source=source)
        if value is False:
            continue
        if value is True:
            out[option] = BARE
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            out[option] = str(value)
        else:
            raise ConfigError(f"{source}: sbatch_extra.{option}: expected a string, number or "
                              f"true, found {value!r}")
    return out


def check_sbatch_option(option: str, *, source: str) -> None:
    """Refuse an option sbatch does not know, or one hpcrun sets itself.

    Raises:
        ConfigError: one line naming the option and what to do.
    """
    if option in MODELED_OPTIONS:
        raise ConfigError(f"{source}: sbatch_extra.{option}: hpcrun sets --{option} itself "
                          f"from {MODELED_OPTIONS[option]}; set it there instead")
    if option not in SBATCH_OPTIONS:
        close = sorted(o for o in SBATCH_OPTIONS - set(MODELED_OPTIONS)
                       if o[:3] == option[:3])
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"{source}: sbatch_extra.{option}: --{option} is not an sbatch "
                          f"option{hint}; expected one of sbatch's long options (man sbatch), "
                          "written without the dashes")


def merge_sbatch_extra(site: Mapping[str, str], spec: Mapping[str, str], *,
                       source: str = "resources.sbatch_extra") -> list[tuple[str, str]]:
    """The extra flags of one job: the site's defaults, overridden option by option by the
    spec's, sorted by option.

    Raises:
        ConfigError: an option of the spec is unknown or modeled.
    """
    for option in spec:
        check_sbatch_option(option, source=source)
    merged = {**site, **spec}
    return sorted(merged.items())


def render_container(container: ContainerConfig | None, srun_args: Sequence[str],
                     python: str) -> tuple[list[str], str]:
    """The agents' ``srun`` flags and interpreter command with ``container`` applied."""
    if container is None:
        return list(srun_args), python
    return [*srun_args, *container.srun_flags()], container.wrap(python)
