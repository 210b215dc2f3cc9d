"""hpcrun: operable, recoverable multi-node PyTorch training runs on Slurm clusters.

The curated public API. Names are imported on first use, so ``import hpcrun`` stays cheap on a
login node (no torch, no h5py until a name that needs them is touched).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrun.lazy import lazy_getattr
from hpcrun.version import __version__

_WHERE = {
    # errors
    "HpcrunError": "hpcrun.errors", "SpecError": "hpcrun.errors",
    "ConfigError": "hpcrun.errors", "StaleGenerationError": "hpcrun.errors",
    "SchedulerError": "hpcrun.errors", "StorageError": "hpcrun.errors",
    "CheckpointError": "hpcrun.errors", "DataError": "hpcrun.errors",
    # seams
    "Stateful": "hpcrun.protocols", "RunContext": "hpcrun.protocols",
    "Clock": "hpcrun.clock", "CommandRunner": "hpcrun.runner",
    # campaigns: submit runs and sweeps, drive them through handles
    "submit": "hpcrun.api", "sweep": "hpcrun.api", "RunHandle": "hpcrun.api",
    "SweepHandle": "hpcrun.api",
    # control plane
    "RunSpec": "hpcrun.control.spec", "load_spec": "hpcrun.control.spec",
    "RunState": "hpcrun.control.states", "read_record": "hpcrun.control.record",
    # data plane
    "DataPipeline": "hpcrun.data.pipeline", "Permutation": "hpcrun.data.permutation",
    "Mixture": "hpcrun.data.mixture",
    # checkpoint plane (for use outside a managed run)
    "Checkpointer": "hpcrun.checkpoint.checkpointer",
    # test doubles for users' own unit tests
    "FakeClock": "hpcrun.testing.fakes", "FakeRunner": "hpcrun.testing.fakes",
}

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Clock",
    "CommandRunner",
    "ConfigError",
    "DataError",
    "DataPipeline",
    "FakeClock",
    "FakeRunner",
    "HpcrunError",
    "Mixture",
    "Permutation",
    "RunContext",
    "RunHandle",
    "RunSpec",
    "RunState",
    "SchedulerError",
    "SpecError",
    "StaleGenerationError",
    "Stateful",
    "StorageError",
    "SweepHandle",
    "__version__",
    "load_spec",
    "read_record",
    "submit",
    "sweep",
]


__getattr__ = lazy_getattr(__name__, _WHERE, globals())


if TYPE_CHECKING:
    from hpcrun.api import RunHandle, SweepHandle, submit, sweep
    from hpcrun.checkpoint.checkpointer import Checkpointer
    from hpcrun.clock import Clock
    from hpcrun.control.record import read_record
    from hpcrun.control.spec import RunSpec, load_spec
    from hpcrun.control.states import RunState
    from hpcrun.data.mixture import Mixture
    from hpcrun.data.permutation import Permutation
    from hpcrun.data.pipeline import DataPipeline
    from hpcrun.errors import (
        CheckpointError,
        ConfigError,
        DataError,
        HpcrunError,
        SchedulerError,
        SpecError,
        StaleGenerationError,
        StorageError,
    )
    from hpcrun.protocols import RunContext, Stateful
    from hpcrun.runner import CommandRunner
    from hpcrun.testing.fakes import FakeClock, FakeRunner
