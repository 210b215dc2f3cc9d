"""The closed sets a run's record uses, each defined once.

These names are shared by every plane (the control plane's spec, record and log; the checkpoint,
data and observe planes; the runtime), so they live below all of them: this module imports
nothing from hpcrun. The run state machine (legal transitions) stays in
:mod:`hpcrun.control.states`; the fault taxonomy's retry rules in :mod:`hpcrun.control.retry`.

Values are what the log, the spec and ``record.snapshot.json`` hold on disk: renaming a member
is a schema change.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TERMINAL", "AsyncPolicy", "Backend", "CadenceKind", "CheckpointFormat",
           "ChecksumAlgorithm", "DistBackend", "FaultClass", "MetaOp", "RankLauncher",
           "ResumeContract", "RunState", "SdcAction", "Tier"]


class RunState(StrEnum):
    """Where a run is in its life."""

    PENDING = "PENDING"          # created or submitted, no incarnation yet
    STARTING = "STARTING"        # an incarnation fenced its generation and is bootstrapping
    RUNNING = "RUNNING"          # membership, heartbeat and progress hold; a step validated
    PREEMPTED = "PREEMPTED"      # told to stop by the scheduler; final commit under way or done
    RECOVERING = "RECOVERING"    # a fault is being repaired inside the allocation
    REQUEUED = "REQUEUED"        # waiting for a new or requeued allocation
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
"""States that end a run; a terminal state is never left."""


class FaultClass(StrEnum):
    """Why an incarnation failed; each class has its own retry budget."""

    PREEMPTION = "preemption"
    TIMEOUT = "timeout"
    NODE_FAILURE = "node_failure"
    PROCESS_CRASH = "process_crash"
    HANG = "hang"
    NONFINITE = "nonfinite"
    DATA_ERROR = "data_error"
    STORAGE_ERROR = "storage_error"
    STORAGE_TIMEOUT = "storage_timeout"  # a shared-tier operation outlived its deadline
    USER_ERROR = "user_error"
    UNKNOWN = "unknown"
    SDC = "sdc"  # silent data corruption: a device computed a wrong answer without failing


class Tier(StrEnum):
    """Checkpoint storage tiers, fastest first."""

    NODE_LOCAL = "node_local"
    SHARED = "shared"
    PEER = "peer"
    """Read only, by a restore: another gang node's tier-0 copy (its own shards, or those it holds
    for its ring partner), reached through that node's partner server. No save writes it."""


WRITTEN_TIERS = (Tier.NODE_LOCAL, Tier.SHARED)
"""The tiers a save writes and a commit names (the peer tier is only read)."""


class ResumeContract(StrEnum):
    """What a resume promises (the spec's ``data.contract``); strongest first.

    - ``bitwise``: the same trajectory bit for bit, on the same layout (also needs RNG state,
      deterministic kernels and a reduction order a resume reproduces: DDP through
      ``hpcrun.integrations.ddp``, which are not the data plane's to give).
    - ``exact-order``: the same global sample sequence, on any world size with G divisible by R.
    - ``exact-coverage``: every sample exactly once per epoch, on any world size.
    - ``distributional``: only the same distribution (e.g. the iterable shuffle-buffer mode);
      the weakest.

    The data plane's random-access pipeline gives ``exact-order`` (hence ``exact-coverage``)
    across world-size changes, and is the data half of ``bitwise`` on the same layout.
    """

    BITWISE = "bitwise"
    EXACT_ORDER = "exact-order"
    EXACT_COVERAGE = "exact-coverage"
    DISTRIBUTIONAL = "distributional"


class CadenceKind(StrEnum):
    """How the checkpoint interval is chosen (the spec's ``checkpoint.cadence``)."""

    EVERY_STEPS = "every_steps"
    EVERY_SECONDS = "every_seconds"
    YOUNG = "young"


class ChecksumAlgorithm(StrEnum):
    """How checkpoint shards are checksummed (the spec's ``checkpoint.checksum``); a manifest
    records the one its shards were written with, and every reader verifies with that one."""

    XXH3 = "xxh3"
    SHA256 = "sha256"


class CheckpointFormat(StrEnum):
    """A checkpoint format outside hpcrun's own: what ``hpcrun ckpt export`` writes and what
    ``ctx.restore(init_from=...)`` (the spec's ``checkpoint.init_from``) reads."""

    DCP = "dcp"                  # a torch.distributed.checkpoint directory
    SAFETENSORS = "safetensors"  # Hugging Face safetensors: one file, or shards and an index


class AsyncPolicy(StrEnum):
    """What a save does while the previous one is still being written."""

    BLOCK = "block"
    SKIP = "skip"


class Backend(StrEnum):
    """Where a run's gang runs: a site's ``backend``, and the backend of each job in a record."""

    SLURM = "slurm"
    LOCAL = "local"  # the embedded backend: local processes, no scheduler


class DistBackend(StrEnum):
    """The process group backend a run asks for (the spec's ``dist.backend``, a site default)."""

    AUTO = "auto"    # NCCL when the run has GPUs, else gloo
    NCCL = "nccl"    # GPU collectives; hpcrun's own small collectives still use a gloo group
    GLOO = "gloo"    # CPU collectives


class RankLauncher(StrEnum):
    """What starts a run's ranks (a site's ``rank_launcher``, the spec's ``dist.rank_launcher``)."""

    AGENT = "agent"  # each node's agent forks its ranks and gives them their HPCRUN_* places
    PMIX = "pmix"    # one `srun --mpi=pmix` step per incarnation; ranks learn their place from MPI


class SdcAction(StrEnum):
    """What a suspect step that replays to the same result (the data or the model, not the
    hardware) does to the run (the spec's ``sdc.policy``)."""

    FAIL = "fail"              # the run fails, naming the step and its batch
    SKIP_BATCH = "skip_batch"  # the step's update is dropped; the skip is logged


class Tracker(StrEnum):
    """The experiment tracker rank 0 logs step metrics to (the spec's ``observe.tracker``)."""

    TENSORBOARD = "tensorboard"  # one log dir under the run directory
    WANDB = "wandb"              # Weights & Biases; WANDB_MODE=offline keeps it local
    MLFLOW = "mlflow"            # $MLFLOW_TRACKING_URI, else a file store in the run directory


class MetaOp(StrEnum):
    """A metadata operation on a shared filesystem: what its metadata server serves.

    Parallel filesystems (Lustre, GPFS) are bound by these, not by bytes; the storage seam's
    :class:`~hpcrun.storage.CountingStorage` counts them (``docs/performance.md``).
    """

    OPEN = "open"        # open(2) of a file or a directory (a create is an open)
    STAT = "stat"        # stat(2) or an existence check
    LISTDIR = "listdir"  # one directory listing
    MKDIR = "mkdir"      # mkdir(2), exist_ok included
    RENAME = "rename"    # rename(2) or link(2): a name moved or added over an existing file
    UNLINK = "unlink"    # unlink(2)
    FSYNC = "fsync"      # fsync(2) of a file or a directory
