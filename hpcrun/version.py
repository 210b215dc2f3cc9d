"""hpcrun's version, in a module with no imports, so any layer may read it."""

from __future__ import annotations

__version__ = "0.1.0"
