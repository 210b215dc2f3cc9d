"""Hypothesis without per-example deadlines: the suite runs beside the Slurm testbed on a loaded
2-core machine, where one example's wall time says nothing about the code under test (every
property still runs its examples; a slow one is not a failure)."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("hpcrun", deadline=None)
settings.load_profile("hpcrun")
