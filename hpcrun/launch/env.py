"""A rank's distributed environment, read once from the environment it was started with.

:meth:`DistEnv.from_environ` understands four launcher families, in this order:

1. ``hpcrun`` — ``HPCRUN_RANK``, ``HPCRUN_WORLD_SIZE``, ... set by the node agent for each rank;
2. ``slurm`` — ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``, ... in an ``srun`` step;
3. ``torchrun`` — ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
4. ``mpi`` — ``OMPI_COMM_WORLD_*`` (Open MPI), ``PMI_RANK``/``PMI_SIZE`` (MPICH, Intel MPI),
   ``PMIX_RANK`` (PMIx; the size then comes from ``mpi4py``).

Two exceptions to the order: a process started by ``torchrun`` inside a Slurm step inherits the
step's ``SLURM_PROCID`` (one per node, not per rank); ``TORCHELASTIC_RUN_ID`` marks such a process
and makes the torchrun variables win. A task of ``srun --mpi=pmix`` (or ``pmi2``) carries both
``SLURM_PROCID`` and ``PMIX_RANK`` (``PMI_RANK``): it is an MPI program, and the MPI runtime wins
(its size, when PMIx does not export one, is the step's ``SLURM_NTASKS`` until ``MPI.COMM_WORLD``
confirms it).

The master port is derived, not negotiated: :func:`derive_master_port` maps (job id, restart
count, in-allocation attempt) to a port, so every rank computes the same one without talking, and
a restart never meets a listener lingering from the attempt before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from hpcrun.errors import ArgumentError, EnvError, HpcrunError


class Launcher(StrEnum):
    """Which launcher family an environment came from."""

    HPCRUN = "hpcrun"
    SLURM = "slurm"
    TORCHRUN = "torchrun"
    MPI = "mpi"
    SINGLE = "single"


PORT_BASE = 20000
PORT_SPAN = 12000  # 20000..31999: below Linux's ephemeral range (32768+), where clients bind


def derive_master_port(job_id: str, restart_count: int, attempt: int, *, base: int = PORT_BASE,
                       span: int = PORT_SPAN) -> int:
    """The rendezvous port of one incarnation, in ``[base, base + span)``.

    The job id picks an offset (a stable hash, so jobs sharing a host rarely meet); the pair
    (restart count, attempt) is numbered by the Cantor pairing and added to it. Distinct pairs
    therefore get distinct ports whenever ``restart_count + attempt <= m``, the largest ``m``
    with ``m·(m+3)/2 < span`` (153 for the default span): a requeue or an in-allocation restart
    never reuses the port of an earlier incarnation of the same job.

    Raises:
        ValueError: negative counts, or a range outside 1..65535.
    """
    if restart_count < 0 or attempt < 0:
        raise ArgumentError(f"restart_count and attempt must be >= 0, found restart_count "
                            f"{restart_count}, attempt {attempt}")
    if not (base >= 1 and span >= 1 and base + span - 1 <= 65535):
        raise ArgumentError(f"port range [{base}, {base + span}) is not within 1..65535; "
                            "choose a base and span that fit below the ephemeral range")
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "big") % span
    diagonal = restart_count + attempt
    sequence = diagonal * (diagonal + 1) // 2 + attempt
    return base + (offset + sequence) % span


@dataclass(frozen=True, kw_only=True, slots=True)
class DistEnv:
    """Where this process sits in the gang, and how to reach rank 0."""

    rank: int
    """Global rank, 0..world_size-1."""
    local_rank: int
    """Rank within this node, 0..local_world_size-1 (also the CUDA device index)."""
    node_rank: int
    """Index of this node in ``nodes``."""
    world_size: int
    """Number of ranks in the gang."""
    local_world_size: int
    """Ranks on this node."""
    num_nodes: int
    """Nodes in the gang."""
    nodes: tuple[str, ...]
    """Host names of the gang's nodes in node-rank order (empty when the launcher hides them)."""
    master_addr: str
    """Host of rank 0's rendezvous store (the first node)."""
    master_port: int
    """Port of rank 0's rendezvous store."""
    job_id: str
    """Scheduler job id (or a local run id)."""
    restart_count: int
    """How many times the scheduler requeued this job (``SLURM_RESTART_COUNT``)."""
    attempt: int
    """In-allocation restart attempt of the gang (0 for the first start in an allocation)."""
    launcher: Launcher = Launcher.HPCRUN
    """The launcher family the values came from."""

    def __post_init__(self) -> None:
        _require(self.world_size >= 1, "world_size", ">= 1", self.world_size)
        _require(0 <= self.rank < self.world_size, "rank", f"in 0..{self.world_size - 1}",
                 self.rank)
        _require(self.local_world_size >= 1, "local_world_size", ">= 1", self.local_world_size)
        _require(0 <= self.local_rank < self.local_world_size, "local_rank",
                 f"in 0..{self.local_world_size - 1}", self.local_rank)
        _require(self.num_nodes >= 1, "num_nodes", ">= 1", self.num_nodes)
        _require(0 <= self.node_rank < self.num_nodes, "node_rank",
                 f"in 0..{self.num_nodes - 1}", self.node_rank)
        _require(not self.nodes or len(self.nodes) == self.num_nodes, "nodes",
                 f"{self.num_nodes} host names", self.nodes)
        _require(1 <= self.master_port <= 65535, "master_port", "in 1..65535", self.master_port)
        _require(self.restart_count >= 0 and self.attempt >= 0, "restart_count/attempt", ">= 0",
                 (self.restart_count, self.attempt))

    @classmethod
    def single(cls, *, job_id: str = "local", master_port: int | None = None) -> DistEnv:
        """A one-process gang on this host (no launcher)."""
        port = master_port if master_port is not None else derive_master_port(job_id, 0, 0)
        return cls(rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1,
                   num_nodes=1, nodes=("127.0.0.1",), master_addr="127.0.0.1", master_port=port,
                   job_id=job_id, restart_count=0, attempt=0, launcher=Launcher.SINGLE)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> DistEnv:
        """Build from a process environment (a value: pass ``dict(os.environ)``).

        Raises:
            EnvError: no launcher detected, or the detected one left a variable unset or
                malformed (the message names the variable and the launcher family).
        """
        family = detect_launcher(env)
        if family is None:
            raise EnvError(
                "no distributed launcher detected: none of HPCRUN_RANK, SLURM_PROCID, RANK, "
                "OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK is set; start the program with "
                "`hpcrun submit`, srun, torchrun or mpirun, or use DistEnv.single()"
            )
        return _READERS[family](_Vars(env, family))

    def to_environ(self) -> dict[str, str]:
        """The variables the agent gives a rank: ``HPCRUN_*`` plus the torch-style names."""
        out = {
            "HPCRUN_RANK": str(self.rank), "HPCRUN_LOCAL_RANK": str(self.local_rank),
            "HPCRUN_NODE_RANK": str(self.node_rank), "HPCRUN_WORLD_SIZE": str(self.world_size),
            "HPCRUN_LOCAL_WORLD_SIZE": str(self.local_world_size),
            "HPCRUN_NUM_NODES": str(self.num_nodes), "HPCRUN_NODES": ",".join(self.nodes),
            "HPCRUN_MASTER_ADDR": self.master_addr, "HPCRUN_MASTER_PORT": str(self.master_port),
            "HPCRUN_JOB_ID": self.job_id, "HPCRUN_RESTART_COUNT": str(self.restart_count),
            "HPCRUN_ATTEMPT": str(self.attempt),
        }
        out.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port),
                   RANK=str(self.rank), WORLD_SIZE=str(self.world_size),
                   LOCAL_RANK=str(self.local_rank), LOCAL_WORLD_SIZE=str(self.local_world_size))
        return out

    def torchrun_environ(self, *, run_id: str, max_restarts: int) -> dict[str, str]:
        """The rest of what torchrun gives a worker, for a script-mode rank (beside
        :meth:`to_environ`'s ``MASTER_*``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_*``).

        ``TORCHELASTIC_RESTART_COUNT`` counts this run's restarts of the gang in this job
        start and before it (requeues plus in-allocation attempts), as torchrun counts its own
        restarts of the worker group; ``TORCHELASTIC_RUN_ID`` is the run id, the same across
        requeues.
        """
        return {
            "GROUP_RANK": str(self.node_rank), "GROUP_WORLD_SIZE": str(self.num_nodes),
            "ROLE_NAME": "default", "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count + self.attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts), "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
        }

    def with_attempt(self, attempt: int) -> DistEnv:
        """The same gang position for in-allocation attempt ``attempt`` (a fresh port)."""
        return replace(self, attempt=attempt,
                       master_port=derive_master_port(self.job_id, self.restart_count, attempt))


def _require(ok: bool, name: str, expected: str, found: object) -> None:
    if not ok:
        raise EnvError(f"inconsistent distributed environment: {name} must be {expected}, "
                       f"found {found!r}; check the launcher's variables")


# -- detection and per-family readers -----------------------------------------------------------

_MARKERS: tuple[tuple[Launcher, tuple[str, ...]], ...] = (
    (Launcher.HPCRUN, ("HPCRUN_RANK", "HPCRUN_WORLD_SIZE", "HPCRUN_LOCAL_RANK")),
    (Launcher.SLURM, ("SLURM_PROCID",)),
    (Launcher.TORCHRUN, ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
    (Launcher.MPI, ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")),
)


def detect_launcher(env: Mapping[str, str]) -> Launcher | None:
    """The launcher family whose variables are present, by precedence (see module doc)."""
    if "HPCRUN_RANK" not in env and "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        return Launcher.TORCHRUN
    if "HPCRUN_RANK" not in env and "SLURM_PROCID" in env and (
            "PMIX_RANK" in env or "PMI_RANK" in env):
        return Launcher.MPI
    for family, markers in _MARKERS:
        if any(m in env for m in markers):
            return family
    return None


class _Vars:
    """Typed reads of one launcher family's variables, with errors that name them."""

    def __init__(self, env: Mapping[str, str], family: Launcher) -> None:
        self.env = env
        self.family = family

    def text(self, name: str, default: str | None = None) -> str:
        value = self.env.get(name)
        if value is None or value.strip() == "":
            if default is not None:
                return default
            raise EnvError(f"{name} is not set (detected launcher: {self.family.value}); the "
                           f"{self.family.value} launcher sets it for every rank, so this process "
                           "was started outside it or its environment was cleared")
        return value.strip()

    def integer(self, name: str, default: int | None = None) -> int:
        raw = self.text(name, None if default is None else str(default))
        try:
            return int(raw)
        except ValueError:
            raise EnvError(f"{name}={raw!r} is not an integer (detected launcher: "
                           f"{self.family.value}); fix the launcher's environment") from None

    def first(self, *names: str) -> str:
        for name in names:
            if self.env.get(name, "").strip():
                return name
        return names[0]


def _read_hpcrun(v: _Vars) -> DistEnv:
    nodes = tuple(h for h in v.text("HPCRUN_NODES").split(",") if h)
    job_id = v.text("HPCRUN_JOB_ID")
    restart, attempt = v.integer("HPCRUN_RESTART_COUNT", 0), v.integer("HPCRUN_ATTEMPT", 0)
    port = v.integer("HPCRUN_MASTER_PORT", derive_master_port(job_id, restart, attempt))
    return DistEnv(rank=v.integer("HPCRUN_RANK"), local_rank=v.integer("HPCRUN_LOCAL_RANK"),
                   node_rank=v.integer("HPCRUN_NODE_RANK"),
                   world_size=v.integer("HPCRUN_WORLD_SIZE"),
                   local_world_size=v.integer("HPCRUN_LOCAL_WORLD_SIZE"),
                   num_nodes=v.integer("HPCRUN_NUM_NODES", len(nodes)), nodes=nodes,
                   master_addr=v.text("HPCRUN_MASTER_ADDR", nodes[0] if nodes else None),
                   master_port=port, job_id=job_id, restart_count=restart, attempt=attempt,
                   launcher=Launcher.HPCRUN)


def _read_slurm(v: _Vars) -> DistEnv:
    rank, world = v.integer("SLURM_PROCID"), v.integer("SLURM_NTASKS")
    list_var = v.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    nodes = tuple(_expand_nodelist(v.text(list_var), list_var))
    node_rank = v.integer("SLURM_NODEID")
    per_node_var = v.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    local_size = _tasks_on_node(v.text(per_node_var), node_rank, per_node_var)
    job_id = v.text("SLURM_JOB_ID")
    restart, attempt = v.integer("SLURM_RESTART_COUNT", 0), v.integer("HPCRUN_ATTEMPT", 0)
    return DistEnv(rank=rank, local_rank=v.integer("SLURM_LOCALID"), node_rank=node_rank,
                   world_size=world, local_world_size=local_size, num_nodes=len(nodes),
                   nodes=nodes, master_addr=v.text("MASTER_ADDR", nodes[0]),
                   master_port=v.integer("MASTER_PORT",
                                         derive_master_port(job_id, restart, attempt)),
                   job_id=job_id, restart_count=restart, attempt=attempt,
                   launcher=Launcher.SLURM)


def _read_torchrun(v: _Vars) -> DistEnv:
    world = v.integer("WORLD_SIZE")
    local_size = v.integer("LOCAL_WORLD_SIZE", world)
    num_nodes = v.integer("GROUP_WORLD_SIZE", max(1, world // local_size))
    addr = v.text("MASTER_ADDR")
    return DistEnv(rank=v.integer("RANK"), local_rank=v.integer("LOCAL_RANK"),
                   node_rank=v.integer("GROUP_RANK", v.integer("RANK") // local_size),
                   world_size=world, local_world_size=local_size, num_nodes=num_nodes,
                   nodes=(addr,) if num_nodes == 1 else (), master_addr=addr,
                   master_port=v.integer("MASTER_PORT"),
                   job_id=v.text("TORCHELASTIC_RUN_ID", v.env.get("SLURM_JOB_ID", "local")),
                   restart_count=v.integer("TORCHELASTIC_RESTART_COUNT", 0), attempt=0,
                   launcher=Launcher.TORCHRUN)


_MPI_NAMES = {
    "OMPI_COMM_WORLD_RANK": ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "PMI_RANK": ("PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "PMIX_RANK": ("PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
}


def _read_mpi(v: _Vars) -> DistEnv:
    """Rank and size from the MPI runtime's variables; the rendezvous may come from mpi4py.

    ``master_addr`` is ``MASTER_ADDR`` when set, else empty: :func:`hpcrun.launch.dist.
    init_process_group` then learns rank 0's host and port over ``MPI.COMM_WORLD``.
    """
    rank_var = v.first(*_MPI_NAMES)
    size_var, local_var, local_size_var = _MPI_NAMES[rank_var]
    in_step = "SLURM_PROCID" in v.env  # srun --mpi=pmix: the step's own counts stand in
    world = v.integer(size_var, v.integer("SLURM_NTASKS") if in_step else None)
    local_size = v.integer(local_size_var, 1 if world == 1 else (
        _step_local_size(v) if in_step else None))
    job_id = v.text("SLURM_JOB_ID", "mpi")
    port = derive_master_port(job_id, v.integer("SLURM_RESTART_COUNT", 0), 0)
    local = v.integer(local_var, v.integer("SLURM_LOCALID", 0) if in_step else 0)
    return DistEnv(rank=v.integer(rank_var), local_rank=local,
                   node_rank=v.integer(rank_var) // local_size, world_size=world,
                   local_world_size=local_size, num_nodes=max(1, -(-world // local_size)),
                   nodes=(), master_addr=v.env.get("MASTER_ADDR", ""),
                   master_port=v.integer("MASTER_PORT", port), job_id=job_id,
                   restart_count=v.integer("SLURM_RESTART_COUNT", 0), attempt=0,
                   launcher=Launcher.MPI)


def _step_local_size(v: _Vars) -> int:
    per_node_var = v.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    return _tasks_on_node(v.text(per_node_var), v.integer("SLURM_NODEID"), per_node_var)


_READERS: dict[Launcher, Callable[[_Vars], DistEnv]] = {
    Launcher.HPCRUN: _read_hpcrun, Launcher.SLURM: _read_slurm,
    Launcher.TORCHRUN: _read_torchrun, Launcher.MPI: _read_mpi,
}


# -- Slurm value syntax -------------------------------------------------------------------------

def _expand_nodelist(text: str, var: str) -> list[str]:
    """Expand a Slurm hostlist (``node[1-3,07],gpu1``) with the Slurm client's parser."""
    from hpcrun.scheduler.slurm import parse_nodelist

    try:
        hosts = list(parse_nodelist(text))
    except (HpcrunError, ValueError) as exc:
        raise EnvError(f"{var} (detected launcher: slurm): {exc}") from None
    if not hosts:
        raise EnvError(f"{var} is empty (detected launcher: slurm); it should list the nodes")
    return hosts


_TPN_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _tasks_on_node(text: str, node_rank: int, var: str) -> int:
    """Tasks on node ``node_rank`` from Slurm's compressed ``2(x3),1`` form."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TPN_RE.match(item.strip())
        if match is None:
            raise EnvError(f"{var}={text!r} is not in Slurm's tasks-per-node form (e.g. 2(x3),1)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if node_rank >= len(counts):
        raise EnvError(f"{var}={text!r} lists {len(counts)} nodes but SLURM_NODEID={node_rank}")
    return counts[node_rank]
