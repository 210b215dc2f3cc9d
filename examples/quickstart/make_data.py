"""Write the quickstart's training data: token documents, one ``.npy`` file each. No downloads.

    python make_data.py data/docs

Each document is a run of tokens ``start, start + stride, ...`` modulo the vocabulary, so a small
model can learn to predict the next token. The bytes depend only on the document's index.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VOCAB = 256


def write_documents(directory: Path, count: int = 300) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        rng = np.random.default_rng(i)
        length = int(rng.integers(16, 97))
        start, stride = (int(v) for v in rng.integers(0, VOCAB, size=2))
        tokens = (start + stride * np.arange(length)) % VOCAB
        np.save(directory / f"doc_{i:05d}.npy", tokens.astype(np.int32), allow_pickle=False)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "data/docs")
    write_documents(out)
    print(f"wrote 300 documents to {out}")
