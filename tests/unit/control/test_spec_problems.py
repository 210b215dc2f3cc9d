"""Every problem of a spec at once: one line per invalid key, in one InvalidSpecError."""

from __future__ import annotations

from typing import Any

import pytest

from hpcrun.control.spec import CodeVersion, Resources, RunSpec
from hpcrun.control.specload import InvalidSpecError
from hpcrun.errors import SpecError

MINIMAL = {"name": "tiny", "entrypoint": "examples.tiny_lm.train:main"}


def _problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpecError) as info:
        RunSpec.from_dict(raw, source="run.yaml")
    assert str(info.value) == "\n".join(info.value.lines)
    return list(info.value.lines)


def test_four_problems_in_three_sections_are_four_lines() -> None:
    lines = _problems({**MINIMAL,
                       "resources": {"nodes": 0, "nodez": 2},
                       "checkpoint": {"keep_last": 1},
                       "retry": {"backoff_factor": "fast"}})
    assert lines == [
        "run.yaml: resources.nodez: expected one of ['account', 'constraint', 'cpus_per_task', "
        "'exclude', 'gpus_per_node', 'nodes', 'partition', 'qos', 'sbatch_extra', "
        "'spare_nodes', 'tasks_per_node', 'time_limit_min'], found 'nodez'; remove the key or "
        "fix its spelling (did you mean 'nodes'?)",
        "run.yaml: resources.nodes: expected an integer >= 1, found 0; set nodes to 1 or more",
        "run.yaml: checkpoint.keep_last: expected an integer >= 2, found 1; keep at least 2 so "
        "the newest good checkpoint survives an async save",
        "run.yaml: retry.backoff_factor: expected a number, found 'fast'; write a number",
    ]


def test_problems_of_the_top_level_and_of_sections_are_reported_together() -> None:
    lines = _problems({"name": "bad name!", "entrypoint": "train.py", "schema_version": 9,
                       "resorces": {}, "data": {"seed": -1, "contract": "exactish"},
                       "config": {"x": {1, 2}}})
    keys = [line.split(": ")[1] for line in lines]
    assert sorted(keys) == sorted(["schema_version", "resorces", "data.seed", "data.contract",
                                   "name", "entrypoint", "config.x"]), lines
    assert any("did you mean 'resources'" in line for line in lines)


def test_every_bound_of_one_section_is_checked_not_only_the_first() -> None:
    lines = _problems({**MINIMAL, "resources": {"nodes": 0, "tasks_per_node": 0,
                                                "gpus_per_node": -1}})
    assert [line.split(": ")[1] for line in lines] == [
        "resources.nodes", "resources.tasks_per_node", "resources.gpus_per_node"]


def test_each_bad_list_item_is_its_own_line() -> None:
    lines = _problems({**MINIMAL, "resources": {"exclude": ["n1", 2, 3]}})
    assert [line.split(": ")[1] for line in lines] == ["resources.exclude[1]",
                                                       "resources.exclude[2]"]


def test_a_cross_field_rule_is_not_judged_against_a_key_that_is_itself_wrong() -> None:
    # resources.nodes is wrong; the elastic rule "min_nodes <= resources.nodes" would compare
    # against the stand-in default (1) and is left out rather than reported falsely.
    lines = _problems({**MINIMAL, "resources": {"nodes": "four"},
                       "membership": {"mode": "elastic", "min_nodes": 2}})
    assert [line.split(": ")[1] for line in lines] == ["resources.nodes"]
    # mode is wrong: "min_nodes must be null for mode fixed" is not reported either.
    lines = _problems({**MINIMAL, "membership": {"mode": "elastik", "min_nodes": 2}})
    assert [line.split(": ")[1] for line in lines] == ["membership.mode"]


def test_a_cross_field_rule_between_valid_keys_is_reported_with_the_other_problems() -> None:
    lines = _problems({**MINIMAL, "resources": {"nodes": 2},
                       "membership": {"mode": "elastic", "min_nodes": 4, "max_nodes": 8},
                       "retry": {"backoff_base_s": 10, "backoff_cap_s": 5}, "sdc": {
                           "every_steps": 0}})
    assert sorted(line.split(": ")[1] for line in lines) == [
        "membership.min_nodes", "retry.backoff_cap_s", "sdc.every_steps"]
    assert any("expected <= resources.nodes (2), found 4" in line for line in lines)


def test_a_missing_required_key_does_not_hide_the_rest() -> None:
    lines = _problems({"entrypoint": "m:f", "budgets": {"max_requeues": -1}})
    assert [line.split(": ")[1] for line in lines] == ["budgets.max_requeues", "name"]
    assert lines[1] == "run.yaml: name: expected a value, found None; add the key"


def test_one_problem_is_one_line_and_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**MINIMAL, "budgets": {"max_segments": 0}})
    assert str(info.value) == ("run.yaml: budgets.max_segments: expected an integer >= 1 or "
                               "null, found 0; use null for no limit")


def test_a_section_built_in_code_reports_all_its_problems_too() -> None:
    with pytest.raises(InvalidSpecError) as info:
        Resources(nodes=0, cpus_per_task=0)
    assert info.value.lines == (
        "nodes: expected an integer >= 1, found 0; set nodes to 1 or more",
        "cpus_per_task: expected an integer >= 1, found 0; set cpus_per_task to 1 or more")
    with pytest.raises(SpecError, match="snapshot: expected a snapshot path when dirty"):
        CodeVersion(commit="abc1234", dirty=True, snapshot=None)


def test_a_valid_spec_still_builds_to_the_same_digest() -> None:
    spec = RunSpec.from_dict({**MINIMAL, "resources": {"nodes": 2, "exclude": ["n1"]}})
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert spec.resources.nodes == 2 and spec.resources.exclude == ("n1",)
