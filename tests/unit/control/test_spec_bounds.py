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


# -- the global batch splits over every world size the run may have -------------------------------

def _gang(nodes: int, tasks: int, batch: int, **extra: object) -> dict[str, object]:
    resources = {"nodes": nodes, "tasks_per_node": tasks, **extra}
    return {**BASE, "resources": resources, "data": {"global_batch": batch}}


@pytest.mark.parametrize(("nodes", "tasks", "spares", "batch"), [
    (2, 2, 0, 6), (3, 2, 0, 8), (3, 1, 1, 8), (1, 4, 0, 2)])
def test_a_fixed_gangs_batch_that_does_not_split_over_its_ranks_is_refused_in_one_line(
        nodes: int, tasks: int, spares: int, batch: int) -> None:
    world = nodes * tasks
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(_gang(nodes, tasks, batch, spare_nodes=spares))
    text = str(info.value)
    assert text == (f"run.yaml: data.global_batch: expected a multiple of the world size "
                    f"({world}: {nodes} nodes x {tasks} ranks), so each rank takes an equal "
                    f"share of every global batch, found {batch}; set data.global_batch to a "
                    f"multiple of {world}, or change resources.nodes or "
                    "resources.tasks_per_node"), text


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 6), tasks=st.integers(1, 8), spares=st.integers(0, 2),
       batch=st.integers(1, 200))
def test_a_fixed_gang_is_admitted_exactly_when_its_batch_splits_over_its_one_world_size(
        nodes: int, tasks: int, spares: int, batch: int) -> None:
    # a hot spare takes a lost node's place: the world size stays nodes x tasks_per_node
    raw = _gang(nodes, tasks, batch, spare_nodes=spares)
    if batch % (nodes * tasks) == 0:
        assert RunSpec.from_dict(raw).data.global_batch == batch
    else:
        with pytest.raises(SpecError, match=r"data\.global_batch: expected a multiple of the "
                                            rf"world size \({nodes * tasks}:"):
            RunSpec.from_dict(raw)


def test_a_spec_without_a_global_batch_or_with_the_shipped_examples_batches_is_valid() -> None:
    from pathlib import Path

    import yaml

    assert RunSpec.from_dict({**BASE, "resources": {"nodes": 3}}).data.global_batch is None
    examples = sorted(Path(__file__).resolve().parents[3].glob("examples/*/run.yaml"))
    assert len(examples) >= 3
    for path in examples:
        RunSpec.from_dict(yaml.safe_load(path.read_text()), source=str(path))  # no refusal


def test_submit_dry_run_refuses_a_batch_that_does_not_split_and_creates_nothing(
        tmp_path: object) -> None:
    from pathlib import Path

    from hpcrun.testing.runs import hpcrun, write_spec

    root = Path(str(tmp_path))
    spec = write_spec(root / "run.yaml", {**_gang(2, 2, 6), "site": "local"})
    runs = root / "runs"
    done = hpcrun("submit", str(spec), "--dry-run", "--backend", "local", "--runs-root",
                  str(runs), env={"HPCRUN_RUNS": str(root / "index")},
                  cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "data.global_batch: expected a multiple of the world size (4: 2 nodes x 2 ranks)" \
        in done.stderr and "Traceback" not in done.stderr
    assert not runs.exists() and not (root / "index").exists()
