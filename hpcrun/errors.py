"""The hpcrun error taxonomy.

Every error hpcrun raises derives from :class:`HpcrunError`; each also derives from the builtin it
resembles so callers may catch either. Messages say what failed, what was expected, what was
found, and how to fix it; the CLI prints them as one line and exits non-zero.

"We lost ownership" (:class:`StaleGenerationError`) is kept apart from "the world broke"
(:class:`SchedulerError`, :class:`StorageError`, which carry the underlying error as ``__cause__``).
"""

from __future__ import annotations


class HpcrunError(Exception):
    """Root of every error hpcrun raises on purpose."""

    exit_code: int = 2


class SpecError(HpcrunError, ValueError):
    """A run spec (run.yaml) is invalid: unknown key, wrong type, impossible value."""


class ConfigError(HpcrunError, ValueError):
    """A site config or other configuration file is invalid."""


class ArgumentError(HpcrunError, ValueError):
    """A value passed to an hpcrun function or class is outside what it accepts (a negative
    count, empty weights, an unknown option): the caller's code needs fixing."""


class FormatError(HpcrunError, ValueError):
    """Something read back or received (an event line, a ledger line, a node's manifest
    summary) does not have the shape its format requires."""


class OutOfRangeError(HpcrunError, IndexError):
    """A position (record, sample ID, global batch, permutation index) lies outside what the
    data holds."""


class WaitTimeoutError(HpcrunError, TimeoutError):
    """A wait for a run to reach a state ran out of time."""


class StaleGenerationError(HpcrunError, RuntimeError):
    """This incarnation no longer owns the run: a newer generation fenced it out."""

    exit_code = 3


class SchedulerError(HpcrunError, RuntimeError):
    """Slurm (or the local backend) refused or failed a request."""


class StorageError(HpcrunError, OSError):
    """A tier (node-local or shared filesystem) failed a read or write."""


class StorageTimeoutError(StorageError):
    """A storage operation did not finish within its deadline (a stuck OST, an NFS server gone);
    the operation may still be blocked in the kernel."""


class DeliveryError(HpcrunError, OSError):
    """An alert did not reach its sink (a webhook refused it, sendmail failed)."""


class CheckpointError(HpcrunError, RuntimeError):
    """A checkpoint could not be written, committed or restored."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint failed verification (checksum, size, missing shard or key)."""


class NonFiniteError(CheckpointError):
    """State about to be committed holds NaN or Inf."""


class ReshardError(CheckpointError):
    """A checkpoint cannot be loaded onto the requested layout."""


class SdcError(HpcrunError, RuntimeError):
    """A device computed a wrong answer without failing (silent data corruption, class ``sdc``)."""


class SdcEchoError(HpcrunError, RuntimeError):
    """This rank stops because a silent-data-corruption verdict named another rank (an echo of
    that rank's fault, not a fault of its own)."""


class DataError(HpcrunError, RuntimeError):
    """A dataset object is missing or differs from its manifest, or a cursor does not match."""


class TestbedError(HpcrunError, RuntimeError):
    """The local Slurm testbed could not be brought up, inspected or torn down."""

    __test__ = False  # not a pytest test class


class EnvError(HpcrunError, KeyError):
    """The process environment lacks what a distributed worker needs."""

    def __str__(self) -> str:  # KeyError quotes its message; keep the one clean line
        return str(self.args[0]) if self.args else ""


class AdmissionError(HpcrunError, ValueError):
    """``hpcrun submit`` refused a run before creating anything: one line per problem found."""


class RecordError(HpcrunError, RuntimeError):
    """A run record or run directory is missing, unreadable or inconsistent."""


class RunReferenceError(RecordError, LookupError):
    """A run reference (a run id, a prefix of one, or a path) names no run, or more than one."""


class RunNotFinishedError(RecordError):
    """A run's result was asked for before the run ended."""


class PayloadError(RecordError, ValueError):
    """A log entry's payload does not have the shape its kind requires."""


class MalformedEntryError(RecordError, ValueError):
    """A log slot's bytes are not a log entry of a known schema version."""


class TransitionError(HpcrunError, ValueError):
    """A run state change that the state machine does not allow (e.g. leaving a terminal state)."""


class PermissionDeniedError(HpcrunError, PermissionError):
    """The caller lacks authority for an operation on a run (e.g. cancel by a non-owner)."""


class UnsafeDirectoryError(HpcrunError, PermissionError):
    """A directory hpcrun would write into is owned by another user, writable by others without
    the sticky bit, or reached through a symlink where none is allowed."""


class DistInitError(HpcrunError, RuntimeError):
    """The process group could not be formed (rendezvous unreachable, timeout, bad backend)."""


class MembershipError(HpcrunError, RuntimeError):
    """The allocation has too few usable nodes for the gang (lost nodes, no spare left)."""
