"""Acting on a live run through its own backend: cancel it (or every point of a sweep), send it
the preemption signal, or emulate a node's power loss on the local backend.

Each function does its effect and returns the line a person reads; the CLI prints it. Slurm
commands go through the injected :class:`~hpcrun.runner.CommandRunner` (or the
:class:`~hpcrun.scheduler.slurm.SlurmClient` built on one); local-backend runs are reached
through their launcher's and agents' pids (:mod:`hpcrun.launch.local`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from hpcrun.control.cancel import cancel_run
from hpcrun.control.ending import EndPublisher
from hpcrun.control.record import read_record
from hpcrun.control.states import is_terminal
from hpcrun.control.sweep import read_sweep_index
from hpcrun.errors import SchedulerError
from hpcrun.launch.local import launcher_alive, read_agents, read_launcher
from hpcrun.launch.runref import run_backend
from hpcrun.launch.signals import signal_number
from hpcrun.launch.sweep_local import stop_launcher
from hpcrun.proctree import crash_process_tree
from hpcrun.runner import CommandRunner
from hpcrun.scheduler.slurm import SlurmClient
from hpcrun.vocab import Backend

__all__ = ["cancel_run_dir", "cancel_sweep", "crash_local_node", "signal_run",
           "stop_local_launcher"]


def stop_local_launcher(run_dir: Path) -> None:
    """SIGTERM the run's local launcher if it is alive (it stops the run's local agents)."""
    info = read_launcher(run_dir)
    if info is not None and launcher_alive(info):
        os.kill(int(info["pid"]), signal.SIGTERM)


def cancel_run_dir(run_dir: Path, *, slurm: SlurmClient, user: str,
                   on_end: EndPublisher | None = None) -> str:
    """Fence and cancel one run (scancel of its Slurm jobs), then stop its local launcher."""
    cancel_run(run_dir, slurm=slurm, user=user, on_end=on_end)  # scancels Slurm jobs only
    if run_backend(run_dir) is Backend.LOCAL:
        stop_local_launcher(run_dir)
    return f"{run_dir.name}: CANCELLED"


def cancel_sweep(sweep_dir: Path, *, slurm: SlurmClient, user: str) -> list[str]:
    """Fence and cancel every point (each through the ordinary cancel), then the array; one
    line per point's state afterwards and one for the sweep."""
    index = read_sweep_index(sweep_dir)
    dirs = index.run_dirs(sweep_dir)
    for run_dir in dirs:  # fence every point first, so no point can publish any more
        if not is_terminal(read_record(run_dir).state):
            cancel_run(run_dir, slurm=slurm, user=user)
    stop_launcher(sweep_dir)
    lines = []
    for run_dir in dirs:
        stop_local_launcher(run_dir)
        lines.append(f"{run_dir.name}: {read_record(run_dir).state}")
    return [*lines, f"{index.sweep_id}: CANCELLED"]


def signal_run(run_dir: Path, name: str, *, runner: CommandRunner) -> str:
    """Deliver signal ``name`` (``USR1``) as the run's backend does before a preemption: the
    local launcher relays it to the run's agents; on Slurm ``scancel --signal`` reaches the
    newest job's steps.

    Raises:
        SchedulerError: nothing to signal (the run has ended, no live launcher, no Slurm job).
    """
    state = read_record(run_dir).state
    if is_terminal(state):
        raise SchedulerError(f"run {run_dir.name} has ended ({state}); there is nothing to "
                             "signal: `hpcrun submit` starts a new run")
    if run_backend(run_dir) is Backend.LOCAL:
        return _signal_local(run_dir, name)
    return _signal_slurm(run_dir, name, runner)


def _signal_local(run_dir: Path, name: str) -> str:
    info = read_launcher(run_dir)
    if info is None or not launcher_alive(info):
        raise SchedulerError(f"run {run_dir.name} runs on the local backend and its launcher is "
                             f"not running (the run is {read_record(run_dir).state}); there is "
                             "nothing to signal")
    os.kill(int(info["pid"]), signal_number(name))
    return f"sent SIG{name} to {run_dir.name} (local backend)"


def _signal_slurm(run_dir: Path, name: str, runner: CommandRunner) -> str:
    record = read_record(run_dir)
    jobs = record.slurm_job_ids()
    if not jobs:
        raise SchedulerError(f"run {run_dir.name} has no Slurm job to signal; it is "
                             f"{record.state}")
    runner.run(["scancel", f"--signal={name}", jobs[-1]]).check()
    return f"sent SIG{name} to job {jobs[-1]} steps"


def crash_local_node(run_dir: Path, node: str) -> str:
    """Emulate the power loss of ``node`` of a local-backend run: SIGKILL its agent and ranks.

    Raises:
        SchedulerError: the run is not on the local backend, is not live, has no such node, or
            ``node`` hosts the supervising agent.
    """
    backend = run_backend(run_dir)
    if backend is not Backend.LOCAL:
        raise SchedulerError(f"--crash-node emulates a node loss on the local backend; run "
                             f"{run_dir.name} runs on {backend}: use `hpcrun testbed crash`")
    info = read_launcher(run_dir)
    agents = read_agents(run_dir)
    if info is None or not launcher_alive(info) or node not in agents:
        raise SchedulerError(f"cannot crash node {node!r} of {run_dir.name}: expected a live "
                             f"local-backend run with that node, found nodes "
                             f"{sorted(agents) or 'none'}; on Slurm use `hpcrun testbed crash`")
    if node == next(iter(agents)):
        raise SchedulerError(f"{node} hosts the supervising agent; crash another node (the "
                             "local backend has no scheduler to notice a lost node 0)")
    crash_process_tree(agents[node])
    return f"crashed {node} of {run_dir.name} (local backend)"
