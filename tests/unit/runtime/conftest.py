"""Fixtures shared by the runtime plane's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """An empty run directory with its log."""
    d = tmp_path / "run"
    (d / "log").mkdir(parents=True)
    return d
