"""What a site needs in the job besides the allocation: setup lines, a container, extra flags.

- ``setup:`` shell lines run by the batch shell before the agents start (``module load``,
  ``source .../activate``, ``conda activate``).
- ``container:`` (:mod:`hpcrun.launch.container`) runs the ranks in an image (Charliecloud,
  Apptainer: the agent stays on the host) or the agents in one (Pyxis: ``--container-image`` on
  their ``srun``).
- ``sbatch_extra:`` any ``sbatch`` option hpcrun does not model (``--mem``, ``--exclusive``,
  ``--reservation``, ``--switches``, ``--mail-type``, ``--network``), site defaults first, the
  spec's ``resources.sbatch_extra`` overriding them; each is checked against
  :data:`SBATCH_OPTIONS`, and options hpcrun sets itself are refused with the key that sets them.

Everything here is pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcrun.errors import ConfigError
from hpcrun.launch.scriptslots import one_line

__all__ = ["MODELED_OPTIONS", "SBATCH_OPTIONS", "check_sbatch_option", "merge_sbatch_extra",
           "sbatch_extra_from_dict"]

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
    one_line(option, key=f"{source}: sbatch_extra option")
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
