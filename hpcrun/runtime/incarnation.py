"""Who a process is within a run: the incarnation it belongs to and where its files go.

An incarnation is one start of the gang (a job start, a requeue, or an in-allocation restart).
It holds one fencing token, ``(generation, holder)``, claimed by the node-0 agent in the run log;
every agent and rank of that incarnation writes under that token. The token reaches ranks through
their environment (``HPCRUN_*``), read once by :meth:`Incarnation.from_environ`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.control.notes import NodeStatus
from hpcrun.errors import EnvError
from hpcrun.exits import EXIT_OK, EXIT_PREEMPTED, EXIT_STALE, EXIT_USER_ERROR

__all__ = ["EXIT_OK", "EXIT_PREEMPTED", "EXIT_STALE", "EXIT_USER_ERROR"]



Ending = NodeStatus
"""How a rank or a node's ranks ended: the ``node_exit`` notes' status, defined once in
:mod:`hpcrun.control.notes`."""

PROBE_ENV = "HPCRUN_PROBE"
"""Set to :data:`PROBE_REGISTRATION` by ``hpcrun preflight``: each rank runs the entrypoint
until ``ctx.restore`` has registered its state, then ends cleanly."""
PROBE_REGISTRATION = "registration"


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentExit:
    """How an agent leaves an incarnation: with an exit status, or into the next attempt."""

    status: int = EXIT_OK
    """Exit status of the agent when it stops here."""
    next_attempt: int | None = None
    """The in-allocation attempt to join next, or None to exit with ``status``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankExit:
    """How one rank ended."""

    rank: int
    """Global rank."""
    returncode: int
    """Exit status; negative when killed by a signal (-9 is SIGKILL)."""
    report: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The rank's own exit report (fault class, detail, step), when it left one."""

    @property
    def succeeded(self) -> bool:
        return self.returncode == EXIT_OK

    @property
    def preempted(self) -> bool:
        return self.returncode == EXIT_PREEMPTED

    @property
    def echo(self) -> bool:
        """Whether it failed only because a peer went away (the cause is elsewhere)."""
        return self.report.get("fault") == "peer_lost"

    @property
    def fault(self) -> str:
        """Fault class: from the report, or process_crash for a signal death."""
        if self.report.get("fault"):
            return str(self.report["fault"])
        return "process_crash" if self.returncode < 0 else "user_error"


_ENV_KEYS = {
    "run_dir": "HPCRUN_RUN_DIR", "run_id": "HPCRUN_RUN_ID", "generation": "HPCRUN_GENERATION",
    "holder": "HPCRUN_HOLDER", "fence_slot": "HPCRUN_FENCE_SLOT", "job_id": "HPCRUN_JOB_ID",
    "restart_count": "HPCRUN_RESTART_COUNT", "attempt": "HPCRUN_ATTEMPT",
    "node": "HPCRUN_NODE", "node_local_root": "HPCRUN_NODE_LOCAL",
}
"""Incarnation field → environment variable."""


def node_logs_dir(run_dir: Path, node: str) -> Path:
    """``<run_dir>/logs/<node>``: the output files of a node's agent, ranks and drainer."""
    return run_dir / "logs" / node


@dataclass(frozen=True, kw_only=True, slots=True)
class Incarnation:
    """The fencing token and file locations shared by every process of one gang start."""

    run_dir: Path
    """Run directory on the shared tier."""
    run_id: str
    """Run identifier (the run directory's name)."""
    generation: int
    """Generation claimed by this incarnation's fence."""
    holder: str
    """Holder id of this incarnation's fence."""
    fence_slot: int
    """Restore point: the log slot of this incarnation's STARTING entry. The restore is chosen
    from the entries before it: everything before the fence, plus what the supervisor committed
    under the new fence before starting the gang (tier-1 commits a dead supervisor left undone);
    every rank sees the same set."""
    job_id: str
    """Scheduler job id (Slurm id, or ``local-<pid>``)."""
    restart_count: int
    """Times the scheduler restarted the job (SLURM_RESTART_COUNT)."""
    attempt: int
    """In-allocation restart attempt (0 for the first gang start of an allocation)."""
    node: str
    """Name of this process's node."""
    node_local_root: Path | None
    """This node's node-local tier directory (tier 0), or None when the run has no tier 0."""
    gang: tuple[str, ...] = ()
    """The incarnation's nodes in node-rank order (its STARTING entry's ``nodes``); the other
    nodes of the allocation idle as hot spares. Agents only: ranks read the gang from their
    ``DistEnv``."""

    def to_environ(self) -> dict[str, str]:
        """The ``HPCRUN_*`` variables a rank of this incarnation receives."""
        out = {}
        for field, var in _ENV_KEYS.items():
            value = getattr(self, field)
            out[var] = "" if value is None else str(value)
        return out

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Incarnation:
        """Read the incarnation from an environment; raise EnvError naming a missing variable."""
        raw: dict[str, str] = {}
        for field, var in _ENV_KEYS.items():
            if var not in env:
                raise EnvError(
                    f"{var} is not set: this process was not started by an hpcrun agent; "
                    "start training with `hpcrun submit`, not by running the worker directly"
                )
            raw[field] = env[var]
        try:
            return cls(
                run_dir=Path(raw["run_dir"]), run_id=raw["run_id"],
                generation=int(raw["generation"]), holder=raw["holder"],
                fence_slot=int(raw["fence_slot"]), job_id=raw["job_id"],
                restart_count=int(raw["restart_count"]), attempt=int(raw["attempt"]),
                node=raw["node"],
                node_local_root=Path(raw["node_local_root"]) if raw["node_local_root"] else None,
            )
        except ValueError as exc:
            raise EnvError(f"malformed HPCRUN_* variable: {exc}; expected integers for "
                           "generation, fence slot, restart count and attempt") from exc

    def logs_dir(self) -> Path:
        """Where this node's rank stdout/stderr go."""
        return node_logs_dir(self.run_dir, self.node)

    def events_path(self, rank: int) -> Path:
        """This rank's event log (JSON Lines)."""
        return self.run_dir / "events" / self.node / f"rank-{rank:05d}.jsonl"

    def heartbeat_dir(self) -> Path:
        """Node-local directory where ranks leave heartbeats for their agent."""
        base = self.node_local_root if self.node_local_root is not None else self.run_dir / "tmp"
        return base / self.run_id / "hb" / self.node

    def log_copy(self) -> Path:
        """Node-local copy of the run log the agent read, for its ranks to start from."""
        return self.heartbeat_dir().parent.parent / "logcopy" / f"{self.node}.json"

    def exit_report(self, rank: int) -> Path:
        """Where a rank leaves a JSON note on how it ended, for its agent."""
        return self.heartbeat_dir().parent.parent / "exits" / f"rank-{rank:05d}.json"


RANK_EVENTS_NAME = "rank-{rank:05d}.jsonl"
"""A rank's node-local event file in :func:`rank_events_dir` (``format(rank=...)``)."""


def rank_events_dir(inc: Incarnation) -> Path:
    """Node-local directory where this incarnation's ranks on ``inc.node`` write events."""
    return inc.heartbeat_dir().parent.parent / "ev" / inc.node / f"g{inc.generation:04d}"


def rank_events_path(inc: Incarnation, rank: int) -> Path:
    """Where ``rank``'s event writer appends (node-local; its agent forwards the lines)."""
    return rank_events_dir(inc) / RANK_EVENTS_NAME.format(rank=rank)
