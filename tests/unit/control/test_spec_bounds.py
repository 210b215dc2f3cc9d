"""Every number of a spec is finite, and every duration fits what its consumers accept.

Walks every numeric key of the spec (from the spec's own dataclasses, so a new key is covered
without a list to keep): ``nan``, ``inf`` and ``-inf`` are refused at load with the key named; a
duration (a key ending in ``_s``) above a C int of milliseconds is refused too, so a value that
would overflow a timeout in the allocation is caught at submit.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.control.spec import RunSpec
from hpcrun.control.specload import MAX_DURATION_S
from hpcrun.control.specref import reference_rows
from hpcrun.errors import SpecError

BASE = {"name": "t", "entrypoint": "examples.tiny_lm.train:main"}
NUMERIC = [r.key for r in reference_rows(RunSpec) if not r.section
           and r.type.split(" or ")[0] in ("number", "integer") and "." in r.key]
DURATIONS = [k for k in NUMERIC if k.endswith("_s")]


def _spec_with(key: str, value: object) -> dict[str, object]:
    section, name = key.split(".", 1)
    return {**BASE, section: {name: value}}


def test_the_walk_finds_the_known_numbers_and_durations() -> None:
    assert {"dist.step_timeout_s", "retry.backoff_cap_s", "checkpoint.rpo_s"} <= set(DURATIONS)
    assert {"budgets.max_wall_hours", "resources.nodes"} <= set(NUMERIC)


@pytest.mark.parametrize("key", NUMERIC)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_naming_the_key(key: str, value: float) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(_spec_with(key, value))
    assert key in str(info.value), str(info.value)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(DURATIONS),
       value=st.floats(min_value=MAX_DURATION_S + 1, max_value=1e300))
def test_a_duration_past_a_c_int_of_milliseconds_is_refused(key: str, value: float) -> None:
    with pytest.raises(SpecError, match=rf"{key}: expected at most {MAX_DURATION_S} s"):
        RunSpec.from_dict(_spec_with(key, value))
