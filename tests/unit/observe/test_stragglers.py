"""Per-rank step-time distributions and straggler scores with exact numbers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.observe.stragglers import (
    Straggler,
    find_stragglers,
    quantile,
    quarantine_candidates,
    step_times_from_events,
    straggler_scores,
)
from tests.unit.observe.builders import step


def test_one_slow_rank_is_named_with_its_node_and_score() -> None:
    times = {r: [1.0] * 10 for r in range(8)}
    times[5] = [1.0] * 5 + [2.0] * 5  # slowed for the last 5 steps
    nodes = {r: f"n{r // 4}" for r in range(8)}
    assert find_stragglers(times, 1.5, 5, nodes=nodes) == [Straggler(rank=5, node="n1",
                                                                     score=2.0)]
    assert find_stragglers(times, 1.5, 10, nodes=nodes) == []  # not slow for a whole window


def test_ranks_with_fewer_steps_than_the_window_are_not_scored() -> None:
    assert straggler_scores({0: [1.0], 1: [1.0, 1.0]}, window=2) == {1: 1.0}
    with pytest.raises(ValueError):
        find_stragglers({0: [1.0]}, 1.0, 1)


def test_repeated_straggler_nodes_become_quarantine_candidates() -> None:
    history = [Straggler(rank=5, node="n1", score=2.0), Straggler(rank=4, node="n1", score=1.7),
               Straggler(rank=1, node="n0", score=1.6), Straggler(rank=5, node="n1", score=2.1)]
    assert quarantine_candidates(history, min_count=2) == ["n1"]
    assert quarantine_candidates(history, min_count=1) == ["n1", "n0"]


def test_step_times_come_from_step_events_of_one_generation() -> None:
    events = [step(1, 0.0, 1.0, rank=0, node="a"), step(1, 0.0, 3.0, rank=1, node="b"),
              step(2, 1.0, 2.0, rank=0, node="a", gen=2)]
    times, nodes = step_times_from_events(events, generation=1)
    assert times == {0: [1.0], 1: [3.0]} and nodes == {0: "a", 1: "b"}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 100), min_size=4, max_size=4), st.floats(0.1, 10))
def test_scores_do_not_depend_on_the_unit_of_time(base: list[float], scale: float) -> None:
    times = {r: [t] * 3 for r, t in enumerate(base)}
    scaled = {r: [t * scale for t in ts] for r, ts in times.items()}
    a, b = straggler_scores(times, window=3), straggler_scores(scaled, window=3)
    assert a.keys() == b.keys()
    assert all(a[r] == pytest.approx(b[r]) for r in a)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 16), st.floats(0.01, 10))
def test_a_uniform_gang_has_no_straggler(n: int, t: float) -> None:
    assert find_stragglers({r: [t] * 5 for r in range(n)}, 1.1, 5) == []


def test_quantile_nearest_rank() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
