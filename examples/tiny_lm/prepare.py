"""Generate the tiny example's dataset (two token sources) and its manifest. No downloads.

    python -m examples.tiny_lm.prepare DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcrun.data.build import BuildOptions, build_manifest
from hpcrun.data.synthetic import write_token_shards


def prepare(directory: str | Path, *, docs: int = 400, vocab: int = 256) -> Path:
    """Write two sources of synthetic token documents and a manifest; return its path."""
    root = Path(directory)
    manifest = root / "manifest.json"
    if manifest.exists():
        return manifest
    write_token_shards(root / "web", docs, vocab, seed=1, min_len=16, max_len=96)
    write_token_shards(root / "code", docs // 2, vocab, seed=2, min_len=8, max_len=64)
    build_manifest([f"web={root / 'web'}", f"code={root / 'code'}"], manifest,
                   BuildOptions(workers=1), progress=False)
    return manifest


if __name__ == "__main__":
    print(prepare(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "data"))
