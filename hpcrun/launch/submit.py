"""Submitting a run's allocation: through submitit, or a rendered script through ``sbatch``.

Both paths use :func:`hpcrun.launch.sbatch.sbatch_args` for the flags and start the same agents.

submitit coexistence. submitit 1.5.4 installs, in every task of its job, a handler for its own
signal (``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default) that on global rank 0 calls the callable's
``checkpoint()`` if it has one and then ``scontrol requeue``s the job and exits; for a callable
without ``checkpoint()`` it still requeues (a "preemption"), or raises inside the handler when it
judges the job "timed out" (always, for jobs shorter than 10 minutes). Either would requeue or end
the job before hpcrun has committed. So hpcrun switches it off:

- the job's only ``--signal`` is hpcrun's (``<site.preempt_signal>@<lead>``, to the steps), set
  through ``additional_parameters``, which replaces submitit's ``--signal=USR2@90``;
- the submitted callable is :func:`submitit_entry`, which first replaces submitit's handler with
  one that only logs, then runs the agent's entry the caller passed
  (:func:`hpcrun.runtime.agent.agent_main`: launch sits below the runtime and does not import
  it); the agent's own handler
  (installed with :func:`hpcrun.launch.signals.stop_on`) takes hpcrun's signal, and the node-0
  agent alone decides whether to requeue, after the commit (never when Slurm's
  ``PreemptMode=REQUEUE`` already requeues). A requeue therefore happens exactly once.

submitit still logs SIGTERM/SIGCONT (its ``bypass``), which keeps a task alive through the
preemption grace time until the agent installs its own SIGTERM handler.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrun.errors import SchedulerError
from hpcrun.launch.container import render_container
from hpcrun.launch.sbatch import (
    BARE,
    agent_count_exports,
    agent_step,
    job_exit_lines,
    job_logs_dir,
    sbatch_args,
)
from hpcrun.launch.scriptslots import env_name, guarded_setup, word
from hpcrun.launch.signals import signal_number
from hpcrun.launch.site import SiteConfig
from hpcrun.runner import CommandRunner

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec

SUBMITIT_DIR = "submitit"
"""Subdirectory of the run directory that is submitit's folder (pickles, per-task logs)."""

# Flags submitit must see as its own parameters: it counts tasks and sets timeouts from them.
_NATIVE = {"job-name": "job_name", "nodes": "nodes", "ntasks-per-node": "ntasks_per_node",
           "time": "time"}
_INT_NATIVE = frozenset({"nodes", "ntasks_per_node", "time"})
_JOB_ID_RE = re.compile(r"^\s*(\d+)(?:;\S+)?\s*$")


def setup_lines(site: SiteConfig, *, run_dir: Path, op_id: str,
                agents: Sequence[str] = ()) -> list[str]:
    """Lines submitit's batch shell runs before its ``srun``: modules, exports, traps.

    The traps keep that shell alive: submitit runs ``srun`` in the foreground, and bash runs a
    trap only after the foreground command ends, so a SIGTERM (preemption, time limit) or a
    preemption signal sent to the batch shell no longer ends the job under the agents before
    they commit. The agents get the signal from Slurm directly (``--signal`` without ``B:``).
    """
    lines = [f"module load {word(m, key=f'site modules[{i}]')}"
             for i, m in enumerate(site.modules)]
    lines += [guarded_setup(line, key=f"site setup[{i}]") for i, line in enumerate(site.setup)]
    exports = {"HPCRUN_RUN_DIR": str(run_dir), "HPCRUN_SITE": site.name, "HPCRUN_OP_ID": op_id}
    exports.update(sorted(site.env.items()))
    lines += [f"export {env_name(name)}={word(value, key=f'env {name}')}"
              for name, value in exports.items()]
    lines += job_exit_lines(run_dir)
    sig = site.signal_name()
    lines += list(agents)  # an elastic job: one agent per granted node
    lines += ["trap 'echo \"hpcrun: batch shell got SIGTERM after the agents\" >&2' TERM",
              f"trap 'echo \"hpcrun: batch shell got SIG{sig}; the agents get it from Slurm\" "
              f">&2' {sig}"]
    return lines


def submitit_parameters(spec: RunSpec, site: SiteConfig, *, run_dir: Path, op_id: str,
                        exclude: Sequence[str] = (), begin: str | None = None,
                        dependency: str | None = None) -> dict[str, Any]:
    """``SlurmExecutor.update_parameters`` keywords carrying exactly :func:`sbatch_args`' flags."""
    params: dict[str, Any] = {}
    additional: dict[str, Any] = {}
    for key, value in sbatch_args(spec, site, run_dir=run_dir, op_id=op_id, exclude=exclude,
                                  begin=begin, dependency=dependency):
        if key in _NATIVE:
            name = _NATIVE[key]
            params[name] = int(value) if name in _INT_NATIVE else value
        else:
            additional[key] = True if value == BARE else value
    params.update(
        additional_parameters=additional,
        setup=setup_lines(site, run_dir=run_dir, op_id=op_id,
                          agents=agent_count_exports(spec)),
        srun_args=render_container(site.container, agent_step(spec, site).srun_args(), "")[0],
        signal_delay_s=site.preempt_lead_s,
    )
    return params


AgentEntry = Callable[[str], int]
"""What each task of the job runs: the node's agent, given the run directory; returns the exit
status (:func:`hpcrun.runtime.agent.agent_main`)."""


def submit_submitit(spec: RunSpec, site: SiteConfig, *, run_dir: Path, op_id: str,
                    entry: AgentEntry, exclude: Sequence[str] = (), begin: str | None = None,
                    python: str | None = None, dependency: str | None = None) -> str:
    """Submit the run's gang through submitit; return the Slurm job id.

    submitit's folder is ``run_dir/submitit``; it needs ``srun`` and ``sbatch`` on PATH.
    ``entry`` is pickled by reference into the job and run by :func:`submitit_entry` in every
    task.

    Raises:
        SchedulerError: submitit could not be set up or ``sbatch`` refused the job.
    """
    import submitit

    run_dir = Path(run_dir)
    job_logs_dir(run_dir).mkdir(parents=True, exist_ok=True)
    interpreter = python or site.python
    try:
        executor = submitit.SlurmExecutor(folder=run_dir / SUBMITIT_DIR, python=interpreter)
        executor.update_parameters(**submitit_parameters(
            spec, site, run_dir=run_dir, op_id=op_id, exclude=exclude, begin=begin,
            dependency=dependency))
        job = executor.submit(submitit_entry, str(run_dir), site.signal_name(), entry)
    except (RuntimeError, ValueError, OSError) as exc:
        raise SchedulerError(f"submitit could not submit run {spec.name!r}: "
                             f"{_first_line(exc)}; check `sbatch` works on this host, or "
                             "submit the script from `hpcrun sbatch` by hand") from exc
    return str(job.job_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def submitit_entry(run_dir: str, preempt_signal: str, entry: AgentEntry) -> int:
    """What submitit runs in each task of the job (one per node): hpcrun's agent.

    Switches submitit's requeueing handler off (see module doc), then runs ``entry(run_dir)``.
    """
    neutralise_submitit_handler(preempt_signal)
    return int(entry(run_dir))


def neutralise_submitit_handler(preempt_signal: str) -> int | None:
    """Replace submitit's preemption handler by one that only logs; return its signal number.

    When submitit's signal is hpcrun's own, the agent's handler replaces this one while the agent
    runs. Returns None outside a submitit job.
    """
    try:
        from submitit.core.job_environment import JobEnvironment
        theirs = int(JobEnvironment._usr_sig())
    except (ImportError, RuntimeError):
        return None
    current = signal.getsignal(theirs)
    if not _is_submitit_handler(current):
        return None
    ours = signal_number(preempt_signal)

    def log_only(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        print(f"hpcrun: ignoring {name} (submitit's requeue signal); hpcrun preempts on "
              f"{signal.Signals(ours).name} and requeues after its commit", file=sys.stderr)

    signal.signal(theirs, log_only)
    return theirs


def _is_submitit_handler(handler: object) -> bool:
    owner = getattr(handler, "__self__", None)
    return type(owner).__module__.startswith("submitit.") if owner is not None else False


def submit_sbatch(script_text: str, *, runner: CommandRunner,
                  env: Mapping[str, str] | None = None) -> str:
    """Submit a rendered job script with ``sbatch --parsable`` (script on stdin); return the id.

    Raises:
        SchedulerError: sbatch failed, or printed something that is not a job id.
    """
    result = runner.run(["sbatch", "--parsable"], input=script_text, env=env).check()
    return parse_parsable_job_id(result.stdout)


def parse_parsable_job_id(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    match = _JOB_ID_RE.match(lines[-1]) if lines else None
    if match is None:
        raise SchedulerError(f"sbatch --parsable printed {stdout.strip()!r}, expected a job id "
                             "such as 123 or 123;cluster; check the sbatch wrapper on this host")
    return match.group(1)
