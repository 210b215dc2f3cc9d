"""Permutation: a keyed bijection on [0, n) for every n, pinned by golden values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.data.permutation import PERMUTATION_VERSION, Permutation, derive_round_keys

GOLDEN = {
    (10, 0, 0, ""): [9, 3, 2, 0, 1, 6, 5, 4],
    (2**16 + 1, 7, 3, "ds/web"): [26666, 53195, 54114, 61035, 6954, 47552, 48123, 18982],
    (1_000_003, 42, 0, "x"): [757645, 56327, 223047, 740473, 540702, 753542, 652094, 205607],
}


def _is_bijection(n: int, seed: int = 0, epoch: int = 0) -> bool:
    out = Permutation(n, seed=seed, epoch=epoch).take(np.arange(n))
    return bool(np.array_equal(np.sort(out), np.arange(n)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 2**16 + 1, 2**20 + 1])
def test_bijection_for_edge_sizes(n: int) -> None:
    # 2**k + 1 is where a bit width that rounds down loses one index and repeats another.
    assert _is_bijection(n)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**63 - 1), epoch=st.integers(0, 1000))
def test_bijection_property(n: int, seed: int, epoch: int) -> None:
    assert _is_bijection(n, seed, epoch)


@pytest.mark.parametrize("key,expected", list(GOLDEN.items()))
def test_golden_values_pin_the_algorithm(key: tuple[int, int, int, str],
                                         expected: list[int]) -> None:
    n, seed, epoch, salt = key
    got = Permutation(n, seed=seed, epoch=epoch, salt=salt).take(np.arange(8)).tolist()
    assert got == expected, (
        f"permutation v{PERMUTATION_VERSION} output changed for {key}: {got} != {expected}. "
        "If the change is intended, bump PERMUTATION_VERSION and DATA_ALGORITHM_VERSION and "
        "update GOLDEN")


def test_getitem_matches_take_and_chunking_is_invisible() -> None:
    p = Permutation(300_007, seed=5, epoch=1)
    full = p.take(np.arange(300_007))
    idx = np.array([0, 1, 131_071, 131_072, 131_073, 300_006])
    assert p.take(idx).tolist() == full[idx].tolist()
    assert [p[int(i)] for i in idx] == full[idx].tolist()
    assert p[-1] == full[-1] and len(p) == 300_007
    assert p.take(idx.reshape(2, 3)).shape == (2, 3)


def test_keys_do_not_alias_seed_and_epoch() -> None:
    n = 10_000
    a = Permutation(n, seed=1, epoch=2).take(np.arange(n))
    b = Permutation(n, seed=2, epoch=1).take(np.arange(n))
    c = Permutation(n, seed=1, epoch=2, salt="other").take(np.arange(n))
    assert np.mean(a == b) < 0.01 and np.mean(a == c) < 0.01
    assert not np.array_equal(derive_round_keys(n=n, seed=1, epoch=2),
                              derive_round_keys(n=n, seed=2, epoch=1))


def test_shuffle_looks_uniform_on_small_domain() -> None:
    # position 0 should land on each of 8 values about equally often across seeds
    hits = np.bincount([Permutation(8, seed=s, epoch=0)[0] for s in range(4000)], minlength=8)
    assert hits.min() > 380 and hits.max() < 620


@pytest.mark.parametrize("bad", [0, -1, 2**62 + 1])
def test_rejects_bad_sizes(bad: int) -> None:
    with pytest.raises(ValueError):
        Permutation(bad, seed=0, epoch=0)


def test_rejects_out_of_range_positions() -> None:
    p = Permutation(10, seed=0, epoch=0)
    with pytest.raises(IndexError):
        p.take(np.array([10]))
    with pytest.raises(IndexError):
        p[10]
