"""Forming the process groups from a :class:`~hpcrun.launch.env.DistEnv`.

The rendezvous is a TCP store on ``master_addr:master_port``, both derived without talking (see
:func:`hpcrun.launch.env.derive_master_port`); the other ranks join as soon as rank 0's store
listens (:func:`await_listener`); it waits at most the init timeout, and the
groups' collectives at most their own timeouts (:class:`~hpcrun.launch.gpu.CollectiveTimeouts`).
:func:`form_groups` is what a rank of a run does: the default group on the run's backend (NCCL
with ``device_id`` on ``cuda:<local_rank>``, after ``torch.cuda.set_device``; gloo on CPU), a
gloo *host* group beside NCCL for hpcrun's own small collectives (the step agreement), and a gloo
checkpoint group with the checkpoint timeout, so host-side collectives never allocate GPU
memory, never share NCCL's streams, and a slow save is not mistaken for a hung step. gloo
groups connect lazily (:data:`GLOO_LAZY_ENV`): a rank connects to the peers it talks to.

When the program was launched by ``mpirun`` and no ``MASTER_ADDR`` is set, rank 0's host and port
travel over ``MPI.COMM_WORLD`` instead; mpi4py is imported only on that path.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import DistInitError, EnvError
from hpcrun.launch.env import DistEnv, Launcher
from hpcrun.launch.gpu import GpuSettings
from hpcrun.launch.hostsum import tree_sum

_BACKENDS = ("nccl", "gloo", "mpi")
GLOO_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"
"""gloo connects a pair of ranks when they first talk, not every pair when a group forms:
a whole-world gloo group at 16,384 ranks is otherwise 16,383 connections per rank (and as
many store reads). :func:`form_groups` turns it on for the rank's process; ``0`` in the
environment keeps gloo's eager full mesh."""


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


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessGroups:
    """The groups one rank of a run uses."""

    backend: str
    """Backend of the default (training) group: ``nccl`` or ``gloo``."""
    device: Any
    """The ``torch.device`` this rank computes on (``cuda:<local_rank>`` or ``cpu``)."""
    host_group: Any
    """gloo group for hpcrun's step agreement (None: the default group, already gloo)."""
    checkpoint_group: Any
    """gloo group for the checkpoint plane's collectives, with the checkpoint timeout."""


def form_groups(env: DistEnv, settings: GpuSettings) -> ProcessGroups:
    """Form the default group on ``settings.backend`` and the gloo groups beside it.

    Raises:
        DistInitError: the rendezvous failed or timed out.
        EnvError: NCCL was asked for without a GPU for this rank.
    """
    import torch
    import torch.distributed as dist

    t = settings.timeouts
    os.environ.setdefault(GLOO_LAZY_ENV, "1")
    backend = init_process_group(env, timeout_s=t.step_s, init_timeout_s=t.init_s,
                                 backend=str(settings.backend))
    nccl = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    host = dist.new_group(backend="gloo", timeout=timedelta(seconds=t.step_s)) if nccl else None
    ckpt = dist.new_group(backend="gloo", timeout=timedelta(seconds=t.checkpoint_s))
    for group in (host, ckpt):
        # connect each rank's agreement peers now, while every rank is known to be there: a
        # peer lost later then closes a connection (an echo, at once) instead of timing out
        # a first connect
        tree_sum([0], group=group)
    return ProcessGroups(backend=backend, device=device, host_group=host, checkpoint_group=ckpt)


def init_process_group(env: DistEnv, *, timeout_s: float = 300, backend: str | None = None,
                       init_timeout_s: float | None = None) -> str:
    """Join (or form) the gang's default process group; return the backend used.

    Args:
        env: this rank's place in the gang.
        timeout_s: how long one collective of the group may wait for peers.
        backend: ``nccl``, ``gloo`` or ``mpi``; default :func:`default_backend`.
        init_timeout_s: how long the rendezvous may wait for every rank; default ``timeout_s``.

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
    device = select_cuda_device(env) if chosen == "nccl" else None
    if env.launcher is Launcher.MPI and not env.master_addr:
        env = rendezvous_over_mpi(env)
    _init(env, chosen, timeout_s, init_timeout_s or timeout_s, device)
    return chosen


def select_cuda_device(env: DistEnv) -> Any:
    """``torch.cuda.set_device(cuda:<local_rank>)`` and return that device.

    Raises:
        EnvError: CUDA is not available, or this node has fewer GPUs than ranks.
    """
    import torch

    if not torch.cuda.is_available():
        raise EnvError("backend 'nccl' needs CUDA, which is not available in this process; "
                       "use backend='gloo' (the default without CUDA) or run on a GPU node")
    device = device_for(env)
    torch.cuda.set_device(device)
    return device


def _init(env: DistEnv, backend: str, timeout_s: float, init_timeout_s: float,
          device: Any) -> None:
    import torch.distributed as dist

    # device_id binds the NCCL communicator to this rank's GPU and creates it eagerly, so a
    # broken GPU or fabric fails here, within the init timeout, not in the first all-reduce.
    extra = {"device_id": device} if device is not None else {}
    if env.rank != 0:
        await_listener(env.master_addr, env.master_port, timeout_s=init_timeout_s)
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0,
                              timeout=timedelta(seconds=init_timeout_s))
        dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=timeout_s), **extra)
    except (RuntimeError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DistInitError(
            f"rank {env.rank}/{env.world_size} could not join the {backend} process group at "
            f"{env.master_addr}:{env.master_port} within {init_timeout_s:g} s ({first}); check "
            "that every rank started, that the port is free and reachable, or raise the init "
            "timeout (dist.init_timeout_s in the spec, pg_init_timeout_s in the site config)"
        ) from exc


STORE_PROBE_S = 0.02
"""How often a rank looks for rank 0's store to listen (see :func:`await_listener`)."""


def await_listener(host: str, port: int, *, timeout_s: float, poll_s: float = STORE_PROBE_S,
                   clock: Clock = SYSTEM_CLOCK) -> bool:
    """Wait until ``host:port`` accepts a TCP connection; whether it did within ``timeout_s``.

    A rank that reaches the rendezvous before rank 0's store listens would otherwise wait out
    c10d's own connect backoff (up to seconds after the store came up, measured); probing every
    ``poll_s`` joins within one probe of it. A store that never listens is left to the
    TCPStore's own timeout and error.
    """
    deadline = clock.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return True
        except OSError:
            if clock.monotonic() >= deadline:
                return False
            clock.sleep(poll_s)


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
        comm = comm_world()
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


def comm_world() -> Any:
    """``MPI.COMM_WORLD`` (importing mpi4py initialises MPI).

    Raises:
        EnvError: mpi4py is not installed.
    """
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EnvError("launched as an MPI program without MASTER_ADDR, and mpi4py is not "
                       "installed; `pip install hpcrun[mpi]` or export MASTER_ADDR and "
                       "MASTER_PORT") from exc
    return MPI.COMM_WORLD
