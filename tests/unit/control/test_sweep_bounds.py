"""A sweep's own settings are bounded: max_parallel an integer >= 1, at most MAX_POINTS points
(counted before a single one is built), each refused in one line."""

from __future__ import annotations

import pytest

from hpcrun.control.sweep import MAX_POINTS, SweepPlan, expand_points
from hpcrun.errors import SpecError


@pytest.mark.parametrize("bad", [0, -1, 2.5, "2", True])
def test_max_parallel_must_be_an_integer_of_at_least_one(bad: object) -> None:
    with pytest.raises(SpecError, match=r"^max_parallel: expected an integer >= 1, found"):
        SweepPlan(max_parallel=bad)  # type: ignore[arg-type]


def test_a_grid_over_the_point_cap_is_refused_before_it_is_expanded() -> None:
    huge = SweepPlan(grid=(("config.a", tuple(range(100))), ("config.b", tuple(range(100))),
                           ("config.c", tuple(range(100)))))  # 10^6 points: never built
    with pytest.raises(SpecError, match=r"the sweep has 1000000 points, more than the cap of "
                                        rf"{MAX_POINTS}"):
        expand_points(huge)


def test_a_sweep_at_the_cap_expands() -> None:
    plan = SweepPlan(grid=(("config.a", tuple(range(10))), ("config.b", tuple(range(100)))))
    assert len(expand_points(plan)) == MAX_POINTS
    with pytest.raises(SpecError, match="1000 points, more than the cap of 999"):
        expand_points(plan, max_points=999)
