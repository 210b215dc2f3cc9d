"""The document stream maps positions to records through each source's permutation, whether
it keeps the epoch as a table (small sources) or runs the Feistel network per lookup."""

from __future__ import annotations

import numpy as np

from hpcrun.data.batches import _TABLE_MAX, DocStream
from hpcrun.data.dataset import SourceView
from hpcrun.data.mixture import Mixture
from hpcrun.data.permutation import Permutation


def test_records_are_the_permutation_of_each_epoch_for_small_and_large_sources() -> None:
    for size in (7, _TABLE_MAX, _TABLE_MAX + 3):
        view = SourceView(name="s", size=size, base=100, lengths=np.ones(size, dtype=np.int64))
        stream = DocStream([view], Mixture([1.0], mode="exact", seed=0), seed=9, salt="ds")
        start = size - 5  # the last draws of epoch 0 and the first of epoch 1
        docs = stream.docs(start, 10)
        pos = np.arange(start, start + 10)
        expected = np.concatenate([
            Permutation(size, seed=9, epoch=e, salt="ds/s").take(pos[pos // size == e] % size)
            for e in (0, 1)])
        assert docs["record"].tolist() == expected.tolist()
        assert docs["epoch"].tolist() == (pos // size).tolist()
        assert docs["sample_id"].tolist() == (100 + expected).tolist()
