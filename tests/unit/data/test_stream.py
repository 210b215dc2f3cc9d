"""Iterable mode: every record once per epoch, exact resume, and visibly not uniform."""

from __future__ import annotations

import json
from collections.abc import Iterator

from hpcrun.data.stream import ShuffleBufferStream

SHARDS, PER = 6, 10


def open_shard(i: int) -> Iterator[int]:
    return iter(range(i * PER, (i + 1) * PER))


def make(seed: int = 0) -> ShuffleBufferStream[int]:
    return ShuffleBufferStream(open_shard, SHARDS, buffer_size=8, seed=seed)


def test_every_record_once_and_seed_dependent() -> None:
    out = list(make())
    assert sorted(out) == list(range(SHARDS * PER)) and out != sorted(out)
    assert list(make(seed=1)) != out


def test_resume_from_any_point_matches_uninterrupted() -> None:
    full = list(make())
    for cut in (0, 1, 7, 8, 23, 59):
        s = make()
        head = [next(s) for _ in range(cut)]
        state = json.loads(json.dumps(s.state_dict()))
        r = make()
        r.load_state_dict(state)
        assert head + list(r) == full


def test_not_a_uniform_permutation() -> None:
    # The first output can only come from the first shard's first buffer_size records.
    firsts = {next(iter(make(seed))) for seed in range(200)}
    first_shards = {x // PER for x in firsts}
    assert all(x % PER < 8 for x in firsts)
    assert len(firsts) <= 8 * len(first_shards)
