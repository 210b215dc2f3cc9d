"""Small on-disk datasets shared by the data-plane tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.data.build import build_manifest
from hpcrun.data.synthetic import write_token_shards


@pytest.fixture(scope="session")
def two_source_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sources ``web`` (23 docs, 8–60 tokens) and ``code`` (11 docs, 4–30 tokens)."""
    root = tmp_path_factory.mktemp("ds")
    write_token_shards(root / "web", 23, vocab=500, seed=1, min_len=8, max_len=60)
    write_token_shards(root / "code", 11, vocab=500, seed=2, min_len=4, max_len=30)
    out = root / "manifest.json"
    build_manifest([f"web={root / 'web'}", f"code={root / 'code'}"], out, progress=False)
    return out
