"""The fault matrix: every fault a drill can inject, and what the run must do about it (pure).

Each row names the fault, where the drill can run it (``local``, ``slurm``), how it is injected
(an ``HPCRUN_INJECT`` schedule, or an action the drill takes from outside), and the expected
outcome: the terminal state, the fault class the supervisor must act on, and whether recovery is
a restart inside the allocation or a requeue.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hpcrun.errors import ArgumentError, SpecError
from hpcrun.vocab import Backend


class DrillFault(StrEnum):
    """Faults of the matrix (the ``--fault`` values)."""

    RANK_KILL = "rank-kill"
    KILL_STAGING = "kill-staging"
    KILL_SHARD_WRITE = "kill-shard-write"
    KILL_BEFORE_MANIFEST = "kill-before-manifest"
    PREEMPT_SIGNAL = "preempt-signal"
    PREEMPT_PRIORITY = "preempt-priority"
    PREEMPT_TIMELIMIT = "preempt-timelimit"
    NODE_LOSS = "node-loss"
    NODE_LOSS_SPARE = "node-loss-spare"
    NODE_LOSS_SUPERVISOR = "node-loss-supervisor"
    NODE_LOSS_PARTNER = "node-loss-partner"
    NODE_LOSS_SHRINK = "node-loss-shrink"
    HANG = "hang"
    STRAGGLER = "straggler"
    DRAIN_STORAGE_ERROR = "drain-storage-error"
    DRAIN_STORAGE_STALL = "drain-storage-stall"
    SHARED_FS_STALL = "shared-fs-stall"
    CORRUPT_SHARD = "corrupt-shard"
    STALE_WORKER = "stale-worker"
    DATA_CHANGED = "data-changed"
    WORLD_SIZE = "world-size"
    CANCEL = "cancel-during-checkpoint"
    CRASH_LOOP = "crash-loop"
    SDC = "sdc"


class Recovery(StrEnum):
    """How the run is expected to get going again."""

    RESTART = "restart"  # a new gang inside the same allocation, no requeue
    REQUEUE = "requeue"  # back to the queue (Slurm) or the launcher (local)
    EITHER = "either"    # restart or requeue, per the retry rules
    NONE = "none"        # the run must not recover (it fails or is cancelled)


@dataclass(frozen=True, kw_only=True, slots=True)
class MatrixRow:
    """One fault of the matrix and the contract it is held to."""

    fault: DrillFault
    """The fault."""
    what: str
    """One line for the table."""
    backends: frozenset[Backend]
    """Backends the drill can run it on."""
    expect_state: str = "SUCCEEDED"
    """Terminal state the run must reach."""
    expect_cause: str | None = None
    """Fault class the supervisor must have acted on (None: not checked)."""
    recovery: Recovery = Recovery.EITHER
    """Expected recovery path."""
    graceful: bool = False
    """The stop is announced: no step may be lost (RPO = 0 steps)."""
    ledger: bool = True
    """The sample ledger must show no skipped or duplicated samples."""
    names_culprit: bool = False
    """The cause's fault must name the injected rank as the one that did not arrive."""

    def __post_init__(self) -> None:
        if not self.backends <= set(Backend):
            raise ArgumentError(f"a drill row's backends must be among 'local' and 'slurm', "
                                f"found {sorted(self.backends)}")


_L, _S = Backend.LOCAL, Backend.SLURM
_BOTH = frozenset({_L, _S})
_SLURM = frozenset({_S})

MATRIX: tuple[MatrixRow, ...] = (
    MatrixRow(fault=DrillFault.RANK_KILL, what="SIGKILL one rank during compute",
              backends=_BOTH, expect_cause="process_crash", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.KILL_STAGING, what="SIGKILL one rank during checkpoint staging",
              backends=_BOTH, expect_cause="process_crash", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.KILL_SHARD_WRITE, what="SIGKILL one rank during its shard write",
              backends=_BOTH, expect_cause="process_crash", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.KILL_BEFORE_MANIFEST,
              what="SIGKILL rank 0 between shard write and manifest publish",
              backends=_BOTH, expect_cause="process_crash", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.PREEMPT_SIGNAL, what="preemption signal (scancel --signal)",
              backends=_BOTH, expect_cause="preemption", recovery=Recovery.REQUEUE,
              graceful=True),
    MatrixRow(fault=DrillFault.PREEMPT_PRIORITY, what="preempted by a high-priority job",
              backends=_SLURM, expect_cause="preemption", recovery=Recovery.REQUEUE,
              graceful=True),
    MatrixRow(fault=DrillFault.PREEMPT_TIMELIMIT, what="time limit reached",
              backends=_SLURM, expect_cause="preemption", recovery=Recovery.REQUEUE,
              graceful=True),
    MatrixRow(fault=DrillFault.NODE_LOSS, what="node power loss → requeue on remaining nodes",
              backends=_BOTH, expect_cause="node_failure", recovery=Recovery.REQUEUE),
    MatrixRow(fault=DrillFault.NODE_LOSS_SPARE,
              what="node power loss with a hot spare → spare swapped in, same job",
              backends=_SLURM, expect_cause="node_failure", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.NODE_LOSS_SUPERVISOR,
              what="the supervising node (node rank 0) lost, a hot spare → a survivor takes "
                   "over supervision, spare swapped in, same job",
              backends=_SLURM, expect_cause="node_failure", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.NODE_LOSS_PARTNER,
              what="node power loss with a hot spare, tier 1 unreadable → the lost node's "
                   "shards restored from its partner's copy, same job",
              backends=_SLURM, expect_cause="node_failure", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.NODE_LOSS_SHRINK,
              what="node power loss, no spare, elastic → gang shrinks to N-1 nodes, same job",
              backends=_SLURM, expect_cause="node_failure", recovery=Recovery.RESTART),
    MatrixRow(fault=DrillFault.HANG, what="a rank stops making progress without exiting: "
              "the rank that did not arrive is named", backends=_BOTH, expect_cause="hang",
              recovery=Recovery.EITHER, names_culprit=True),
    MatrixRow(fault=DrillFault.STRAGGLER, what="one rank slowed: reported",
              backends=_BOTH, recovery=Recovery.NONE),
    MatrixRow(fault=DrillFault.DRAIN_STORAGE_ERROR,
              what="shared tier fails during drain: training goes on, drain retried",
              backends=_SLURM, recovery=Recovery.NONE),
    MatrixRow(fault=DrillFault.DRAIN_STORAGE_STALL,
              what="shared tier hangs during drain (blocked FIFO): storage_timeout within the "
                   "deadline, training goes on",
              backends=_SLURM, recovery=Recovery.NONE),
    MatrixRow(fault=DrillFault.SHARED_FS_STALL,
              what="every shared-tier operation of the gang blocks for 10 s (a metadata-server "
                   "stall), with a hot spare: no node lost, no commit lost, training goes on, "
                   "the stall reported",
              backends=_BOTH, recovery=Recovery.NONE),
    MatrixRow(fault=DrillFault.CORRUPT_SHARD,
              what="truncated / bit-flipped shard → previous checkpoint restored",
              backends=_SLURM, recovery=Recovery.EITHER),
    MatrixRow(fault=DrillFault.STALE_WORKER,
              what="frozen slurmd: node declared down, its ranks' entries void",
              backends=_SLURM, expect_cause="node_failure", recovery=Recovery.REQUEUE),
    MatrixRow(fault=DrillFault.DATA_CHANGED,
              what="changed data object → data error, no substitution",
              backends=_BOTH, expect_state="FAILED", expect_cause="data_error",
              recovery=Recovery.NONE, ledger=False),
    MatrixRow(fault=DrillFault.WORLD_SIZE,
              what="restore on half / double the ranks (hpcrun drill --restore)",
              backends=_SLURM, recovery=Recovery.NONE),
    MatrixRow(fault=DrillFault.CANCEL, what="cancel during a checkpoint: fenced, evidence kept",
              backends=_BOTH, expect_state="CANCELLED", recovery=Recovery.NONE, ledger=False),
    MatrixRow(fault=DrillFault.CRASH_LOOP,
              what="a rank crashes every incarnation: FAILED with reason",
              backends=_BOTH, expect_state="FAILED", expect_cause="process_crash",
              recovery=Recovery.NONE, ledger=False),
    MatrixRow(fault=DrillFault.SDC,
              what="bit flip in one rank's parameters: node named, rolled back to known-good",
              backends=_BOTH, expect_cause="sdc", recovery=Recovery.REQUEUE),
)
"""The matrix, in table order."""


SHARED_FS_STALL_S = 10.0
"""How long the ``shared-fs-stall`` row stalls the shared tier: over three times the liveness
bound (``NODE_STALE_S``), so liveness read from files alone would lose every node."""


def row_for(fault: str) -> MatrixRow:
    """The row of ``fault``; SpecError listing the choices when unknown."""
    for row in MATRIX:
        if row.fault == fault:
            return row
    raise SpecError(f"unknown drill fault {fault!r}; expected one of "
                    f"{', '.join(r.fault.value for r in MATRIX)}")


def default_at(every_steps: int) -> int:
    """Default fault step: halfway between the first and second checkpoint, so RPO shows."""
    return max(3, every_steps + every_steps // 2)


def injection(row: MatrixRow, *, at: int, world_size: int, tasks_per_node: int) -> str:
    """The ``HPCRUN_INJECT`` schedule for ``row`` at step ``at`` ("" when injected from outside).

    The victim is the last rank (on the last node), so the supervising node survives a node
    crash; ``kill-before-manifest`` targets rank 0, the only rank that writes manifests.
    """
    last = world_size - 1
    kinds = {
        DrillFault.RANK_KILL: f"crash@step={at},rank={last}",
        DrillFault.KILL_STAGING: f"ckptcrash@step={at},rank={last},stage=staging",
        DrillFault.KILL_SHARD_WRITE: f"ckptcrash@step={at},rank={last},stage=shard_write",
        DrillFault.KILL_BEFORE_MANIFEST: f"ckptcrash@step={at},rank=0,stage=before_manifest",
        DrillFault.PREEMPT_SIGNAL: f"preempt@step={at}",
        DrillFault.HANG: f"hang@step={at},rank={last}",
        DrillFault.STRAGGLER: f"slow@step={at},rank={last},seconds=0.15,every=1",
        DrillFault.CRASH_LOOP: f"crash@step={at},rank={last},every=1",
        DrillFault.SDC: f"sdc@step={at},rank={last}",
        DrillFault.SHARED_FS_STALL: f"fsstall@step={at},seconds={SHARED_FS_STALL_S:g}",
    }
    if row.fault == DrillFault.NODE_LOSS:
        if world_size <= tasks_per_node:
            raise SpecError("node-loss needs at least 2 nodes (resources.nodes >= 2): the "
                            "node-0 agent supervises and must survive")
        return f"nodecrash@step={at},rank={last}"
    return kinds.get(row.fault, "")
