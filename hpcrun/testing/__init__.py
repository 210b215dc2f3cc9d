"""Fakes for fast unit tests of pure logic, for hpcrun's own tests and for users' tests.

Integration tests use the real thing (the Slurm testbed, real files, real processes).
"""

from __future__ import annotations

from hpcrun.testing.fakes import FakeClock, FakeRunner

__all__ = ["FakeClock", "FakeRunner"]
