"""A rank started by an MPI launcher: one task of the supervising agent's ``srun --mpi=pmix`` step.

``python -m hpcrun.runtime.rank.mpitask --run-dir DIR --generation G --attempt A --wait-s S``
(the step's command line, :func:`hpcrun.launch.ranklaunch.mpi_step_argv`). In order:

1. ``MPI.COMM_WORLD`` gives this task its rank and the world size (the MPI runtime is the
   authority; mpi4py is imported here, by :func:`hpcrun.launch.dist.rendezvous_over_mpi`).
2. Its node's agent wrote the environment it planned for that rank (:func:`rank_env_path`: the
   same variables an agent-started rank gets); the task waits up to ``--wait-s`` for the file and
   reads it as untrusted input (:func:`read_rank_env`).
3. The rendezvous goes over ``COMM_WORLD`` (rank 0's host, the agent's derived port), and what
   MPI says must agree with what the agent planned (:func:`check_agreement`): a task MPI placed
   elsewhere than its agent expects is refused, with both sides in the message.
4. The task leaves its pid where its agent looks (:func:`pid_path`); the agent watches, signals
   and reports it like a rank it forked (:mod:`hpcrun.runtime.node.mpigang`).
5. The normal worker runs (:func:`hpcrun.runtime.rank.worker.run`) with the MPI-placed
   ``DistEnv``; its exit report is what the agent reads. No ``MPI_Finalize``: it is a collective,
   and a rank whose peer failed would wait in it forever.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcrun.errors import EnvError
from hpcrun.launch.env import DistEnv, Launcher
from hpcrun.runtime.incarnation import EXIT_USER_ERROR, Ending, Incarnation, node_logs_dir

ENV_POLL_S = 0.1
_KEPT_PREFIXES = ("SLURM_", "PMIX_", "PMI_", "OMPI_")
"""The task's own variables that the agent's planned environment must not replace: the MPI
runtime's and the step's (the agent's were its own step's)."""


def rank_env_path(run_dir: Path, node: str, *, generation: int, attempt: int, rank: int) -> Path:
    """Where ``node``'s agent leaves the environment it planned for ``rank`` of an incarnation."""
    return (node_logs_dir(run_dir, node) / "mpi" / f"g{generation:04d}.a{attempt}"
            / f"rank-{rank:05d}.env.json")


def pid_path(inc: Incarnation, rank: int) -> Path:
    """Where a task leaves its pid for its agent (beside its exit report, node-local)."""
    return inc.exit_report(rank).with_suffix(".pid")


def read_rank_env(path: Path, *, rank: int) -> dict[str, str]:
    """The planned environment of ``rank`` (untrusted: a JSON object of strings naming it).

    Raises:
        EnvError: unreadable, not a mapping of strings, or planned for another rank.
    """
    try:
        raw: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EnvError(f"{path}: cannot read the environment the agent planned for rank {rank} "
                       f"({exc}); check that the node's agent is running") from None
    env = raw.get("env") if isinstance(raw, dict) else None
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        raise EnvError(f"{path}: expected a JSON object with an 'env' mapping of strings, "
                       f"found {type(env).__name__}; the file is damaged: restart the run")
    if env.get("HPCRUN_RANK") != str(rank) or raw.get("rank") != rank:
        raise EnvError(f"{path}: planned for rank {env.get('HPCRUN_RANK')!r}, expected {rank}; "
                       "the file is damaged: restart the run")
    return dict(env)


def check_agreement(planned: DistEnv, placed: DistEnv) -> None:
    """MPI's placement of this task (``placed``) is the one its agent planned.

    Raises:
        EnvError: naming every field that differs, both sides.
    """
    fields = ("rank", "world_size", "node_rank", "num_nodes", "local_rank", "local_world_size")
    wrong = [f"{f}: MPI {getattr(placed, f)}, agent {getattr(planned, f)}" for f in fields
             if getattr(placed, f) != getattr(planned, f)]
    if wrong:
        raise EnvError(
            "MPI placed this task elsewhere than its agent planned (" + "; ".join(wrong) + "); "
            "the pmix step must place ranks in blocks, in the gang's node order: check the "
            "site's srun_extra_flags and SLURM_DISTRIBUTION, or set rank_launcher: agent")


def merged_environ(planned: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """The agent's planned variables, with the task's own MPI and step variables kept."""
    env = dict(planned)
    env.update({k: v for k, v in own.items() if k.startswith(_KEPT_PREFIXES)})
    return env


def node_name(environ: Mapping[str, str]) -> str:
    """This task's node as its agent names it (the short host name)."""
    return socket.gethostname().split(".")[0] or environ.get("SLURMD_NODENAME", "")


def await_rank_env(path: Path, *, rank: int, wait_s: float) -> dict[str, str]:
    """Wait up to ``wait_s`` for the agent's file (it may not have started the gang yet)."""
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(ENV_POLL_S)
    return read_rank_env(path, rank=rank)


def read_planned(comm: Any, args: argparse.Namespace) -> dict[str, str]:
    """Steps 1-2: this task's environment, the agent's plan for its MPI rank."""
    rank = int(comm.Get_rank())
    path = rank_env_path(Path(args.run_dir), node_name(os.environ), generation=args.generation,
                         attempt=args.attempt, rank=rank)
    return merged_environ(await_rank_env(path, rank=rank, wait_s=args.wait_s), os.environ)


def place(comm: Any, environ: Mapping[str, str]) -> DistEnv:
    """Step 3: the MPI-placed ``DistEnv``, checked against the agent's plan."""
    from hpcrun.launch.dist import rendezvous_over_mpi

    planned = DistEnv.from_environ({k: v for k, v in environ.items()
                                    if not k.startswith(_KEPT_PREFIXES)})
    placed = rendezvous_over_mpi(replace(planned, launcher=Launcher.MPI, master_addr=""),
                                 comm=comm)
    check_agreement(planned, placed)
    # the gang's node names as the agents know them (a host name may be longer)
    return replace(placed, nodes=planned.nodes)


def record_pid(environ: Mapping[str, str], rank: int) -> None:
    """Step 4: the pid, written whole (a reader never sees half of it)."""
    path = pid_path(Incarnation.from_environ(environ), rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(json.dumps({"rank": rank, "pid": os.getpid()}))
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    """Steps 1-5; return the rank's exit status."""
    from hpcrun.launch.dist import comm_world
    from hpcrun.runtime.rank import worker

    comm = comm_world()
    try:
        environ = read_planned(comm, args)
    except EnvError as exc:  # no plan to report under: the agent's start watch sees no rank
        print(f"hpcrun mpitask (MPI rank {comm.Get_rank()}): error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    rank = int(environ["HPCRUN_RANK"])
    os.environ.clear()
    os.environ.update(environ)  # libraries (torch, NCCL, gloo) read the process environment
    record_pid(environ, rank)
    try:
        dist = place(comm, environ)
    except EnvError as exc:
        print(f"hpcrun mpitask (rank {rank}): error: {exc}", file=sys.stderr)
        worker.write_exit_report(Incarnation.from_environ(environ).exit_report(rank), {
            "rank": rank, "status": Ending.FAILED, "fault": "user_error", "detail": str(exc)})
        return EXIT_USER_ERROR
    return worker.run(environ, dist=dist)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hpcrun.runtime.rank.mpitask",
                                description="One rank of a run, started by srun --mpi=pmix.")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--generation", type=int, required=True)
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--wait-s", type=float, default=300.0)
    args = p.parse_args(argv)
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()  # lead a session, as an agent-forked rank does: a stop reaches its helpers
    status = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
