"""A real multi-node Slurm cluster on one machine, for integration tests, CI and demos.

See ``README.md`` in this directory.
"""

from __future__ import annotations

from hpcrun.testbed.config import TestbedConfig
from hpcrun.testbed.jobs import JobClient, JobRecord
from hpcrun.testbed.plan import DaemonStatus, TestbedStatus
from hpcrun.testbed.testbed import Testbed, UpResult

__all__ = [
    "DaemonStatus",
    "JobClient",
    "JobRecord",
    "Testbed",
    "TestbedConfig",
    "TestbedStatus",
    "UpResult",
]
