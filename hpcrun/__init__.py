"""hpcrun: operable, recoverable multi-node PyTorch training runs on Slurm clusters."""

from __future__ import annotations

__version__ = "0.1.0"

from hpcrun.errors import HpcrunError

__all__ = ["HpcrunError", "__version__"]
