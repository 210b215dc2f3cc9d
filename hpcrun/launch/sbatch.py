"""The job's Slurm flags, and the job script rendered from ``sbatch_templates/``.

:func:`sbatch_args` is the one source of truth for the flags of a run's allocation; both ways
in use it: :func:`render_sbatch` writes them as ``#SBATCH`` lines of a script a user submits with
plain ``sbatch`` (``hpcrun sbatch run.yaml > job.sh``), and
:func:`hpcrun.launch.submit.submit_submitit` hands them to submitit. Both start one agent per
node of the allocation with ``srun -n <nodes + spare_nodes> --ntasks-per-node=1``; each agent
spawns its node's ranks (a hot spare's agent idles until it is swapped in). With spare nodes
the job and its step are ``--no-kill``: measured on the testbed, a step without it is killed on
every node once Slurm marks one of its nodes DOWN, and the job ends with it
(``docs/recovery.md``).

Everything here is pure: values in, text out.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from hpcrun.control.elastic import (
    AGENT_COUNT_ENV,
    is_elastic,
    sbatch_nodes,
    survives_node_loss,
)
from hpcrun.errors import ConfigError
from hpcrun.launch.container import render_container
from hpcrun.launch.jobsetup import merge_sbatch_extra
from hpcrun.launch.scriptslots import directive, env_name, guarded_setup, one_line, word
from hpcrun.launch.shipped import shipped_dir
from hpcrun.launch.site import SiteConfig

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec

DEFAULT_TEMPLATE = "job.sh.j2"
BARE = ""
"""Value of a flag that takes no argument (``--requeue``)."""


def sbatch_templates_dir() -> Path:
    """The shipped ``sbatch_templates/`` directory (:func:`~hpcrun.launch.shipped.shipped_dir`)."""
    return shipped_dir("sbatch_templates")


def job_logs_dir(run_dir: Path) -> Path:
    """Where the batch shell's stdout/stderr go (``<run_dir>/logs``); must exist at submit."""
    return Path(run_dir) / "logs"


def job_exit_path(run_dir: Path, job_id: str) -> Path:
    """Where the supervisor writes the exit status the job should end with once the run has
    ended (``<run_dir>/logs/job-<job>.exit``): the batch shell exits with it
    (:func:`job_exit_lines`)."""
    return job_logs_dir(run_dir) / f"job-{job_id}.exit"


def job_exit_lines(run_dir: Path) -> list[str]:
    """Batch-shell lines that make the job's exit status the run's outcome.

    The agent step's ``srun`` exits with its worst task: after a node loss that a hot spare or
    a shrink repaired, the lost node's task counts as killed (137) and the job would end FAILED
    in ``sacct`` although the run SUCCEEDED. The supervisor writes the run's exit status to
    :func:`job_exit_path` when the run ends; an EXIT trap replaces the shell's status with it.
    Without that file (a requeue, a job Slurm ended) the shell's own status stands.
    """
    exit_file = shlex.quote(str(job_logs_dir(run_dir))) + '/job-"${SLURM_JOB_ID:-}".exit'
    return [f"hpcrun_exit_file={exit_file}",
            'rm -f "$hpcrun_exit_file"',
            "hpcrun_job_exit() {",
            "    local rc=$? ended",
            '    ended=$(head -c 4 "$hpcrun_exit_file" 2>/dev/null)',
            "    case \"$ended\" in ''|*[!0-9]*) ;; *) rc=$ended ;; esac",
            '    exit "$rc"',
            "}",
            "trap hpcrun_job_exit EXIT"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentStep:
    """How the job starts its agents: ``srun <args> <python> -m hpcrun.runtime``."""

    nodes: int | None
    """Agents to start: one per node of the allocation (the gang's and the hot spares'); None
    for an elastic run, whose allocation has however many nodes Slurm granted in its
    ``--nodes=min-max`` range (srun then starts one task on each node of the allocation)."""
    cpus_per_agent: int
    """CPUs each agent's step task gets (its ranks run inside it)."""
    extra_flags: tuple[str, ...] = ()
    """Site ``srun_extra_flags``."""
    no_kill: bool = False
    """Keep the step running on the other nodes when one of its nodes fails (``--no-kill``):
    runs with hot spares replace the node inside the allocation, elastic ones shrink."""

    def srun_args(self) -> list[str]:
        """The ``srun`` flags, without the command."""
        count = ["-n", str(self.nodes)] if self.nodes is not None else []
        return [*count, "--ntasks-per-node=1",
                f"--cpus-per-task={self.cpus_per_agent}", "--kill-on-bad-exit=0",
                *(["--no-kill"] if self.no_kill else []), *self.extra_flags]


def agent_count_exports(spec: RunSpec) -> list[str]:
    """Batch-shell lines that make ``srun`` without a task count start one agent per granted
    node: an elastic job may run on fewer nodes than its first allocation, and a requeued job
    keeps that allocation's ``SLURM_NTASKS`` (measured on the testbed: "More processors
    requested than permitted"). Empty for any other run."""
    if not is_elastic(spec):
        return []
    return [f'export {name}="$SLURM_JOB_NUM_NODES"' for name in AGENT_COUNT_ENV]


def agent_step(spec: RunSpec, site: SiteConfig) -> AgentStep:
    """The agent step of ``spec`` on ``site``."""
    r = spec.resources
    return AgentStep(nodes=None if is_elastic(spec) else r.nodes + r.spare_nodes,
                     cpus_per_agent=r.tasks_per_node * r.cpus_per_task,
                     extra_flags=site.srun_extra_flags, no_kill=survives_node_loss(spec))


def agent_output_flags(step: AgentStep, run_dir: Path) -> list[str]:
    """Where the agents' own output goes when the step must outlive a node (``--no-kill``):
    one file per node that each node's slurmstepd writes itself
    (``<run_dir>/logs/agent-<job>-<node>.{out,err}``), so an agent's output never passes
    through ``srun``, which runs on the job's first node and dies with it. Empty otherwise
    (the output goes to the job's files, as before); submitit's own ``srun`` writes per-task
    files already."""
    if not step.no_kill:
        return []
    logs = job_logs_dir(run_dir)
    return [shlex.quote(f"--{stream}={logs / f'agent-%j-%N.{ext}'}")
            for stream, ext in (("output", "out"), ("error", "err"))] + ["--input=none"]


def sbatch_args(spec: RunSpec, site: SiteConfig, *, run_dir: Path, op_id: str,
                exclude: Sequence[str] = (), begin: str | None = None,
                dependency: str | None = None,
                array: str | None = None, requeue: bool = False) -> list[tuple[str, str]]:
    """The allocation's flags as ``(long option without dashes, value)``; value ``""`` is bare.

    Args:
        spec: the run spec (resources; its own ``exclude``).
        site: the site config (defaults for partition, account, QOS, constraint; GPU syntax;
            preemption signal and lead; requeue policy).
        run_dir: the run directory; job output goes to ``run_dir/logs``.
        op_id: the operation id tagged on the job (``--comment=hpcrun:<op_id>``), so a retry
            after a crash can find the job an earlier attempt submitted.
        exclude: nodes to keep out of this allocation (the quarantine list).
        begin: earliest start (``--begin``, e.g. ``now+60``) for a backed-off resubmission.
        dependency: ``--dependency`` value (``afterok:123``) of a run that waits for others.
        array: ``--array`` value (``0-5%2``) of a sweep's job array.
        requeue: the job runs a run again (a resubmission): an elastic run then asks for
            ``--nodes=min_nodes-nodes`` (:func:`~hpcrun.control.elastic.sbatch_nodes`).

    Raises:
        ConfigError: the spec asks for more GPUs per node than the site has, its
            ``resources.sbatch_extra`` names an unknown option or one hpcrun sets itself, or a
            value is not one line of printable text (it would end its ``#SBATCH`` line).
    """
    r = spec.resources
    args: list[tuple[str, str]] = [
        ("job-name", spec.name),
        ("nodes", sbatch_nodes(spec, requeue=requeue)),
        ("ntasks-per-node", "1"),
        ("cpus-per-task", str(r.tasks_per_node * r.cpus_per_task)),
    ]
    gpu = site.gpu_flag(_checked_gpus(spec, site))
    if gpu is not None:
        args.append(gpu)
    args.append(("time", str(r.time_limit_min)))
    args += _placement(spec, site, exclude, begin)
    args.append(("requeue", BARE) if site.requeue_allowed else ("no-requeue", BARE))
    if survives_node_loss(spec):
        # a lost node must not end the allocation: a hot spare takes its place in this job,
        # or the elastic gang shrinks
        args.append(("no-kill", BARE))
    logs = job_logs_dir(run_dir)
    args += [
        ("signal", f"{site.signal_name()}@{site.preempt_lead_s}"),
        ("open-mode", "append"),
        ("comment", f"hpcrun:{op_id}"),
        ("output", str(logs / "slurm-%j.out")),
        ("error", str(logs / "slurm-%j.err")),
    ]
    args += [(key, value) for key, value in (("dependency", dependency), ("array", array))
             if value]
    args += merge_sbatch_extra(site.sbatch_extra, spec.resources.sbatch_extra)
    # both ways in write these as `#SBATCH --key=value` lines: each value is one line
    return [(one_line(k, key="sbatch option"), one_line(v, key=f"sbatch --{k}"))
            for k, v in args]


def _checked_gpus(spec: RunSpec, site: SiteConfig) -> int:
    gpus = spec.resources.gpus_per_node
    if gpus > site.gpus_per_node:
        raise ConfigError(
            f"run asks for resources.gpus_per_node={gpus} but site {site.name!r} has "
            f"gpus_per_node={site.gpus_per_node}; lower the request or pick a GPU site"
        )
    return gpus


def _placement(spec: RunSpec, site: SiteConfig, exclude: Sequence[str],
               begin: str | None) -> list[tuple[str, str]]:
    r = spec.resources
    chosen = {"partition": r.partition or site.partition, "account": r.account or site.account,
              "qos": r.qos or site.qos, "constraint": r.constraint or site.constraint}
    out = [(key, value) for key, value in chosen.items() if value]
    excluded = sorted(set(r.exclude) | {n for n in exclude if n})
    if excluded:
        out.append(("exclude", ",".join(excluded)))
    if begin:
        out.append(("begin", begin))
    return out


def format_flag(key: str, value: str) -> str:
    """``--key=value`` (shell-quoted as sbatch reads it), or ``--key`` for a bare flag.

    Raises:
        ConfigError: the value is not one line (it would end the directive).
    """
    return directive(key, value, bare=BARE)


def render_sbatch(spec: RunSpec, site: SiteConfig, *, run_dir: Path, op_id: str,
                  exclude: Sequence[str] = (), begin: str | None = None,
                  python: str | None = None, template: str = DEFAULT_TEMPLATE,
                  dependency: str | None = None, array: str | None = None,
                  requeue: bool = False) -> str:
    """The job script for ``spec`` on ``site`` (pure).

    Args:
        python: interpreter command on the compute nodes; default the site's, else the one
            running this function.
        template: file name in ``sbatch_templates/``.

    See :func:`sbatch_args` for the other arguments.
    """
    flags = sbatch_args(spec, site, run_dir=run_dir, op_id=op_id, exclude=exclude, begin=begin,
                        dependency=dependency, array=array, requeue=requeue)
    step = agent_step(spec, site)
    srun_args, interpreter = render_container(
        site.container, [*step.srun_args(), *agent_output_flags(step, run_dir)],
        python or site.python or shlex.quote(sys.executable), shell=True)
    context = {
        "run_name": one_line(spec.name, key="name"),
        "site_name": one_line(site.name, key="site name"),
        "spec_id": spec.spec_id, "op_id": one_line(op_id, key="operation id"),
        "sbatch_lines": [format_flag(k, v) for k, v in flags],
        "modules": [word(m, key=f"site modules[{i}]") for i, m in enumerate(site.modules)],
        "env": [(env_name(k), word(v, key=f"site env.{k}")) for k, v in sorted(site.env.items())],
        "setup": [guarded_setup(line, key=f"site setup[{i}]")
                  for i, line in enumerate(site.setup)],
        "run_dir": word(run_dir, key="run directory"), "signal": site.signal_name(),
        "srun_args": [one_line(a, key="srun argument") for a in srun_args],
        "python": one_line(interpreter, key="site python"),
        "agent_count": agent_count_exports(spec),
        "job_exit": job_exit_lines(run_dir),
    }
    return _environment().get_template(template).render(**context)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(sbatch_templates_dir())),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env
