"""The global packer: concatenate-then-split, exact rows, residual carried between calls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.data.packing import SEGMENT_DTYPE, PackingPolicy, PackState, pack
from hpcrun.errors import DataError

DOC = np.dtype([("length", np.int64)])


def fetcher(lengths: list[int]):  # type: ignore[no-untyped-def]
    def fetch(start: int, count: int) -> np.ndarray:
        out = np.zeros(max(0, min(count, len(lengths) - start)), dtype=DOC)
        out["length"] = lengths[start:start + out.size]
        return out
    return fetch


def stream_tokens(lengths: list[int]) -> list[tuple[int, int]]:
    return [(d, o) for d, n in enumerate(lengths) for o in range(n)]


def rows_tokens(seg: np.ndarray, draw0: int, seq_len: int, rows: int) -> list[tuple[int, int]]:
    out = []
    for r in range(rows):
        mine = seg[seg["row"] == r]
        row = [(draw0 + int(s["doc"]), int(s["offset"]) + j) for s in mine
               for j in range(int(s["length"]))]
        assert len(row) == seq_len  # every row is exactly full
        out.extend(row)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.integers(1, 16),
       st.integers(1, 4), st.integers(1, 4))
def test_concat_split_is_the_stream_cut_every_seq_len(lengths: list[int], seq_len: int,
                                                       rows: int, calls: int) -> None:
    state, got = PackState(draw=0, offset=0), []
    for _ in range(calls):
        out = pack(fetcher(lengths), state, rows, seq_len)
        if out is None:
            break
        seg, _, nxt = out
        assert seg.dtype == SEGMENT_DTYPE
        got.extend(rows_tokens(seg, state.draw, seq_len, rows))
        state = nxt
    want = stream_tokens(lengths)
    assert got == want[:len(got)]
    assert len(got) == min(calls, len(want) // (rows * seq_len)) * rows * seq_len


def test_residual_document_continues_in_the_next_call() -> None:
    fetch = fetcher([10, 3, 7])
    _, _, state = pack(fetch, PackState(draw=0, offset=0), 1, 4)  # type: ignore[misc]
    assert state == PackState(draw=0, offset=4)
    assert pack(fetch, state, 1, 6)[2] == PackState(draw=1, offset=0)  # type: ignore[index]
    assert pack(fetch, PackState(draw=0, offset=0), 3, 4)[2] == PackState(draw=1, offset=2)  # type: ignore[index]


def test_none_policy_truncates_one_document_per_row() -> None:
    seg, docs, state = pack(fetcher([10, 3, 7]), PackState(draw=0, offset=0), 3, 5,  # type: ignore[misc]
                            PackingPolicy.NONE)
    assert seg["length"].tolist() == [5, 3, 5] and state.draw == 3 and docs.size == 3


def test_end_of_stream_and_bad_residual() -> None:
    assert pack(fetcher([3, 3]), PackState(draw=0, offset=0), 1, 7) is None
    with pytest.raises(DataError, match="not inside"):
        pack(fetcher([3, 3]), PackState(draw=0, offset=3), 1, 2)
    with pytest.raises(DataError):
        PackState.from_dict({"draw": -1, "offset": 0})
