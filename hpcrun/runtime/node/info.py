"""Which node an agent runs on, read once from the environment (Slurm or the local backend)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hpcrun.errors import EnvError
from hpcrun.vocab import Backend


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeInfo:
    """This agent's place in the allocation."""

    node: str
    """This node's name."""
    node_rank: int
    """Index of this node in the allocation (0 supervises)."""
    nodes: tuple[str, ...]
    """Every node of the allocation, in order."""
    job_id: str
    """Scheduler job id."""
    restart_count: int
    """How many times the scheduler restarted the job."""
    node_local_root: Path | None
    """This node's tier-0 directory, None when the run has none."""
    backend: Backend
    """Where the gang runs: Slurm or the local backend."""
    job_started: float | None = None
    """When the scheduler granted the allocation, by its clock (Slurm's
    ``SLURM_JOB_START_TIME``); None when it does not say."""

    @property
    def is_supervisor(self) -> bool:
        return self.node_rank == 0

    @property
    def master_addr(self) -> str:
        # Local nodes are emulated on this host: their names do not resolve.
        return "127.0.0.1" if self.backend == Backend.LOCAL else self.nodes[0]

    @classmethod
    def from_environ(cls, env: Mapping[str, str], *, node_local_template: str | None) -> NodeInfo:
        """Local-backend variables first (``HPCRUN_AGENT_*``), then Slurm's."""
        if "HPCRUN_AGENT_NODE" in env:
            return cls._from_local(env)
        return cls._from_slurm(env, node_local_template)

    @classmethod
    def _from_local(cls, env: Mapping[str, str]) -> NodeInfo:
        local = env.get("HPCRUN_AGENT_NODE_LOCAL", "")
        return cls(node=env["HPCRUN_AGENT_NODE"], node_rank=int(env["HPCRUN_AGENT_NODE_RANK"]),
                   nodes=tuple(env["HPCRUN_AGENT_NODES"].split(",")),
                   job_id=env["HPCRUN_AGENT_JOB_ID"],
                   restart_count=int(env.get("HPCRUN_AGENT_RESTART_COUNT", "0")),
                   node_local_root=Path(local) if local else None,
                   backend=Backend.LOCAL)

    @classmethod
    def _from_slurm(cls, env: Mapping[str, str], template: str | None) -> NodeInfo:
        for var in ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_JOB_NODELIST"):
            if var not in env:
                raise EnvError(f"{var} is not set: `hpcrun agent` runs inside a Slurm job step "
                               "(srun) or under the local backend; submit with `hpcrun submit`")
        from hpcrun.launch.site import expand_path
        from hpcrun.scheduler.slurm import parse_nodelist

        nodes = tuple(parse_nodelist(env["SLURM_JOB_NODELIST"]))
        node_rank = int(env["SLURM_NODEID"])
        return cls(
            node=socket.gethostname().split(".")[0] or nodes[node_rank], node_rank=node_rank,
            nodes=nodes, job_id=env["SLURM_JOB_ID"],
            restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
            node_local_root=expand_path(template, env) if template else None,
            backend=Backend.SLURM, job_started=_epoch(env.get("SLURM_JOB_START_TIME")),
        )

    @property
    def job_start_key(self) -> str:
        """Prefix of every fence holder of this job start (all its attempts)."""
        return f"job{self.job_id}.r{self.restart_count}."

    def placed(self, gang: tuple[str, ...] | None) -> NodeInfo:
        """This node as a member of ``gang`` (an incarnation's; empty or None: the whole
        allocation): its node rank there, the gang's nodes."""
        nodes = gang or tuple(self.nodes)
        return replace(self, nodes=nodes, node_rank=nodes.index(self.node))

    def incarnation_key(self, attempt: int) -> str:
        """Prefix of the fence holder for ``attempt`` of this job start: every agent derives it."""
        return f"{self.job_start_key}a{attempt}."


def _epoch(text: str | None) -> float | None:
    """Seconds since the epoch from a variable Slurm sets, None when unset or not a number."""
    try:
        return float(text) if text else None
    except ValueError:
        return None
