"""Forming the process group from a :class:`~hpcrun.launch.env.DistEnv`.

NCCL when CUDA is available (each rank on ``cuda:<local_rank>``), gloo otherwise; the rendezvous
is a TCP store on ``master_addr:master_port``, both derived without talking (see
:func:`hpcrun.launch.env.derive_master_port`). When the program was launched by ``mpirun`` and
no ``MASTER_ADDR`` is set, rank 0's host and port travel over ``MPI.COMM_WORLD`` instead; mpi4py
is imported only on that path.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from datetime import timedelta
from typing import Any

from hpcrun.errors import DistInitError, EnvError
from hpcrun.launch.env import DistEnv, Launcher

_BACKENDS = ("nccl", "gloo", "mpi")


def default_backend() -> str:
    """``nccl`` when CUDA is available in this process, else ``gloo``."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def device_for(env: DistEnv) -> Any:
    """The ``torch.device`` this rank computes on: ``cuda:<local_rank>`` or ``cpu``.

    Raises:
        EnvError: CUDA is available but this node has fewer GPUs than ranks.
    """
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise EnvError(
            f"local rank {env.local_rank} has no GPU: this node has {count} visible GPU(s) for "
            f"{env.local_world_size} ranks; request tasks_per_node <= GPUs per node, or check "
            "CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", env.local_rank)


def init_process_group(env: DistEnv, *, timeout_s: float = 300, backend: str | None = None) -> str:
    """Join (or form) the gang's default process group; return the backend used.

    Args:
        env: this rank's place in the gang.
        timeout_s: how long the rendezvous and later collectives may wait for peers.
        backend: ``nccl``, ``gloo`` or ``mpi``; default :func:`default_backend`.

    Raises:
        DistInitError: the rendezvous failed or timed out, or a group with another layout is
            already initialised.
        EnvError: NCCL was asked for without a GPU for this rank.
    """
    import torch.distributed as dist

    chosen = (backend or default_backend()).lower()
    if chosen not in _BACKENDS:
        raise DistInitError(f"unknown backend {backend!r}: expected one of {', '.join(_BACKENDS)}")
    if dist.is_initialized():
        return _check_existing(env, chosen)
    if chosen == "nccl":
        _select_cuda_device(env)
    if env.launcher is Launcher.MPI and not env.master_addr:
        env = rendezvous_over_mpi(env)
    _init(env, chosen, timeout_s)
    return chosen


def _select_cuda_device(env: DistEnv) -> None:
    import torch

    if not torch.cuda.is_available():
        raise EnvError("backend 'nccl' needs CUDA, which is not available in this process; "
                       "use backend='gloo' (the default without CUDA) or run on a GPU node")
    torch.cuda.set_device(device_for(env))


def _init(env: DistEnv, backend: str, timeout_s: float) -> None:
    import torch.distributed as dist

    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    try:
        dist.init_process_group(
            backend, init_method=f"tcp://{host}:{env.master_port}", rank=env.rank,
            world_size=env.world_size, timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DistInitError(
            f"rank {env.rank}/{env.world_size} could not join the {backend} process group at "
            f"{env.master_addr}:{env.master_port} within {timeout_s:g} s ({first}); check that "
            "every rank started, that the port is free and reachable, or raise the timeout"
        ) from exc


def _check_existing(env: DistEnv, backend: str) -> str:
    import torch.distributed as dist

    found = (dist.get_rank(), dist.get_world_size())
    if found != (env.rank, env.world_size):
        raise DistInitError(
            f"a process group is already initialised as rank {found[0]}/{found[1]}, expected "
            f"{env.rank}/{env.world_size}; call destroy_process_group() before re-forming it"
        )
    return str(dist.get_backend())


def destroy_process_group() -> None:
    """Leave the default process group if one is initialised (safe to call twice)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rendezvous_over_mpi(env: DistEnv, *, comm: Any = None) -> DistEnv:
    """Fill in rank 0's host and a port by broadcasting them over ``MPI.COMM_WORLD``.

    Rank and world size are taken from the communicator (the MPI runtime is the authority when
    the program was started by ``mpirun``). mpi4py is imported here and nowhere else.

    Raises:
        EnvError: mpi4py is not installed, or the communicator disagrees with ``env``.
    """
    if comm is None:
        comm = _comm_world()
    rank, size = int(comm.Get_rank()), int(comm.Get_size())
    if size != env.world_size:
        raise EnvError(f"MPI.COMM_WORLD has {size} ranks but the environment says "
                       f"{env.world_size}; launch with a matching -n")
    hosts = tuple(comm.allgather(socket.gethostname()))
    addr, port = comm.bcast((hosts[0], env.master_port) if rank == 0 else None, root=0)
    local = [i for i, h in enumerate(hosts) if h == hosts[rank]]
    nodes = tuple(dict.fromkeys(hosts))
    return replace(env, rank=rank, world_size=size, master_addr=addr, master_port=int(port),
                   nodes=nodes, num_nodes=len(nodes), node_rank=nodes.index(hosts[rank]),
                   local_rank=local.index(rank), local_world_size=len(local))


def _comm_world() -> Any:
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EnvError("launched as an MPI program without MASTER_ADDR, and mpi4py is not "
                       "installed; `pip install hpcrun[mpi]` or export MASTER_ADDR and "
                       "MASTER_PORT") from exc
    return MPI.COMM_WORLD
