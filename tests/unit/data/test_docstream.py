"""The document stream maps positions to records through each source's permutation, whether
it keeps the epoch as a table (small sources) or runs the Feistel network per lookup."""

from __future__ import annotations

import numpy as np
import pytest

from hpcrun.data import batches
from hpcrun.data.batches import _TABLE_MAX, DocStream, GlobalOrder
from hpcrun.data.dataset import SourceView
from hpcrun.data.mixture import Mixture
from hpcrun.data.permutation import Permutation
from hpcrun.errors import DataError


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


def _order(lengths: list[np.ndarray], policy: str, exhaustion: str) -> GlobalOrder:
    views = [SourceView(name=f"s{i}", size=n.size, base=1000 * i, lengths=n)
             for i, n in enumerate(lengths)]
    mix = Mixture([2.0, 1.0][:len(views)], mode="exact", seed=4, exhaustion=exhaustion,
                  sizes=[v.size for v in views])
    return GlobalOrder(DocStream(views, mix, seed=3, salt="ds"), global_batch=3, seq_len=16,
                       policy=policy)


@pytest.mark.parametrize(("policy", "exhaustion"), [("concat", "repeat"), ("none", "repeat"),
                                                     ("concat", "stop"), ("none", "stop"),
                                                     ("concat", "renormalize")])
def test_batches_packed_in_chunks_are_the_batches_packed_one_by_one(
        monkeypatch: pytest.MonkeyPatch, policy: str, exhaustion: str) -> None:
    rng = np.random.default_rng(5)
    lengths = [rng.integers(0, 40, 50), rng.integers(1, 9, 13)]  # empty documents too
    chunked = _order(lengths, policy, exhaustion)
    monkeypatch.setattr(batches, "_CHUNK", 1)
    single = _order(lengths, policy, exhaustion)
    ks = [*range(40), 75, 3, 60, 11, 120, 0]  # sequential, then jumps back and forth
    for k in ks:
        a, b = chunked.plan(k), single.plan(k)
        assert (a is None) == (b is None), k
        if a is not None and b is not None:
            assert np.array_equal(a.segments, b.segments) and np.array_equal(a.docs, b.docs), k
        assert chunked.state_at(k) == single.state_at(k), k


def test_a_fail_source_fails_at_the_same_batch_when_packed_in_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = [np.full(300, 10), np.full(120, 7)]

    def first_failure(order: GlobalOrder) -> int:
        for k in range(400):
            try:
                order.plan(k)
            except DataError:
                return k
        raise AssertionError("no source ran out")

    chunked = first_failure(_order(lengths, "concat", "fail"))
    monkeypatch.setattr(batches, "_CHUNK", 1)
    assert chunked == first_failure(_order(lengths, "concat", "fail")) > 0
