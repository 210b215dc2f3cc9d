"""Bad inputs a user submits by mistake: broken manifests, changed objects, a typo'd entrypoint."""

from __future__ import annotations

import json
from pathlib import Path

from hpcrun.data.build import build_manifest
from hpcrun.data.synthetic import write_token_shards

REPO_ROOT = Path(__file__).resolve().parents[3]


def small_dataset(root: Path, n: int = 5) -> Path:
    """A manifest of ``n`` small ``.npy`` objects under ``root``; returns the manifest path."""
    write_token_shards(root / "src", n, vocab=100, seed=3, min_len=4, max_len=20)
    out = root / "manifest.json"
    build_manifest([f"toy={root / 'src'}"], out, progress=False)
    return out


def broken_manifest(good: Path, kind: str) -> Path:
    """A copy of ``good`` broken as ``kind`` (``json-list``, ``truncated``, ``empty-object``,
    ``edited``: an object's size changed by hand, so the seal no longer matches)."""
    text = good.read_text()
    out = good.with_name(f"{kind}.json")
    if kind == "json-list":
        out.write_text(json.dumps([json.loads(text)]))
    elif kind == "truncated":
        out.write_text(text[: len(text) // 2])
    elif kind == "empty-object":
        out.write_text("{}\n")
    elif kind == "edited":
        raw = json.loads(text)
        raw["sources"][0]["objects"][0]["nbytes"] += 1
        out.write_text(json.dumps(raw))
    else:
        raise ValueError(kind)
    return out


BROKEN = {"json-list": "holds a list", "truncated": "not valid JSON",
          "empty-object": "found an empty object", "edited": "does not match its content"}
"""Each broken manifest and what its one line says."""


def change_object(manifest: Path) -> Path:
    """Flip one byte of the manifest's first object (same size, new digest); return its path."""
    obj = Path(json.loads(manifest.read_text())["sources"][0]["objects"][0]["path"])
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    obj.write_bytes(bytes(data))
    return obj
