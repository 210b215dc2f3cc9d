"""A tiny, deterministic token dataset for examples and tests.

Each document is an arithmetic progression modulo the vocabulary (start ``a``, stride ``b``), so
a small language model can learn next-token prediction from it, and every byte depends only on
``(seed, document index)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hpcrun.errors import ArgumentError

__all__ = ["synthetic_document", "write_token_shards"]


def synthetic_document(index: int, *, vocab: int, seed: int, min_len: int = 8,
                       max_len: int = 256) -> np.ndarray:
    """Tokens of synthetic document ``index`` (``int32``), a pure function of its arguments."""
    if vocab < 2 or not 1 <= min_len <= max_len:
        raise ArgumentError(f"need vocab >= 2 and 1 <= min_len <= max_len, found vocab "
                            f"{vocab}, min_len {min_len}, max_len {max_len}")
    rng = np.random.default_rng([seed, index])
    length = int(rng.integers(min_len, max_len + 1))
    start, stride = (int(v) for v in rng.integers(0, vocab, size=2))
    return ((start + stride * np.arange(length, dtype=np.int64)) % vocab).astype(np.int32)


def write_token_shards(directory: str | os.PathLike[str], n_docs: int, vocab: int, seed: int, *,
                       min_len: int = 8, max_len: int = 256) -> list[Path]:
    """Write ``n_docs`` documents as ``doc_<index>.npy`` token arrays into ``directory``.

    Args:
        directory: Created if missing.
        n_docs: Number of documents (one ``.npy`` object each).
        vocab: Vocabulary size; tokens are in ``[0, vocab)``.
        seed: Same seed, same bytes.
        min_len: Shortest document in tokens.
        max_len: Longest document in tokens.

    Returns:
        The written paths, in document order.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_docs):
        path = root / f"doc_{i:06d}.npy"
        np.save(path, synthetic_document(i, vocab=vocab, seed=seed, min_len=min_len,
                                         max_len=max_len), allow_pickle=False)
        paths.append(path)
    return paths
