"""RunSpec: canonical digest, strict validation with key paths, alias resolution."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.control.spec import CodeVersion, RunSpec, freeze_spec, load_spec
from hpcrun.errors import SpecError

MINIMAL = {"name": "tiny", "entrypoint": "examples.tiny_lm.train:main"}
# Pinned: the digest of MINIMAL with every default filled. A change here means every existing
# run's spec_id changes; only accept it together with a schema_version bump.
MINIMAL_SPEC_ID = "sha256:5416d70cdcfd3c5c9f15be8fa7bb4fc6ffbca12cdaaaaa8187882b2d4dc3e71d"


def test_minimal_spec_digest_is_pinned() -> None:
    spec = RunSpec.from_dict(MINIMAL)
    assert spec.spec_id == MINIMAL_SPEC_ID, (
        f"spec_id changed to {spec.spec_id}; if intended, update MINIMAL_SPEC_ID and bump "
        "SPEC_SCHEMA_VERSION")


def test_checksum_is_chosen_in_the_spec_and_only_a_non_default_changes_the_digest() -> None:
    assert RunSpec.from_dict({**MINIMAL, "checkpoint": {"checksum": "xxh3"}}).spec_id \
        == MINIMAL_SPEC_ID
    sha = RunSpec.from_dict({**MINIMAL, "checkpoint": {"checksum": "sha256"}})
    assert sha.checkpoint.checksum == "sha256" and sha.spec_id != MINIMAL_SPEC_ID
    assert RunSpec.from_dict(sha.to_dict()) == sha  # round-trips
    with pytest.raises(SpecError, match=r"checkpoint.checksum: expected one of \['xxh3', "
                       r"'sha256'\], found 'md5'"):
        RunSpec.from_dict({**MINIMAL, "checkpoint": {"checksum": "md5"}})


def test_defaults_are_filled_into_the_digest() -> None:
    explicit = {**MINIMAL, "resources": {"nodes": 1, "tasks_per_node": 1},
                "retry": {"backoff_base_s": 10, "max_attempts": {"hang": 3}},
                "checkpoint": {"keep_last": 2, "tiers": ["node_local", "shared"]}}
    assert RunSpec.from_dict(explicit).spec_id == RunSpec.from_dict(MINIMAL).spec_id
    body = json.loads(RunSpec.from_dict(MINIMAL).canonical_json())
    assert body["retry"]["max_attempts"]["preemption"] == 100
    assert body["resources"]["nodes"] == 1 and body["schema_version"] == 1


def test_integral_floats_and_ints_hash_alike() -> None:
    a = RunSpec.from_dict({**MINIMAL, "retry": {"backoff_cap_s": 600}, "config": {"lr": 1}})
    b = RunSpec.from_dict({**MINIMAL, "retry": {"backoff_cap_s": 600.0}, "config": {"lr": 1.0}})
    assert a.spec_id == b.spec_id
    c = RunSpec.from_dict({**MINIMAL, "config": {"lr": 1.5}})
    assert c.spec_id != a.spec_id


@settings(max_examples=30, deadline=None)
@given(st.permutations(["name", "entrypoint", "resources", "config", "data"]),
       st.dictionaries(st.text("abcxyz", min_size=1, max_size=4),
                       st.integers(-5, 5) | st.text(max_size=5), max_size=5))
def test_digest_is_independent_of_key_order(order: list[str], config: dict) -> None:
    raw = {"name": "t", "entrypoint": "m:f", "resources": {"nodes": 2, "gpus_per_node": 4},
           "config": config, "data": {"seed": 3, "contract": "bitwise"}}
    shuffled = {k: raw[k] for k in order}
    shuffled["config"] = dict(reversed(list(config.items())))
    assert RunSpec.from_dict(shuffled).spec_id == RunSpec.from_dict(raw).spec_id


def test_round_trip_through_dict() -> None:
    spec = RunSpec.from_dict({**MINIMAL, "resources": {"nodes": 4, "exclude": ["n1"]},
                              "membership": {"mode": "elastic", "min_nodes": 2, "max_nodes": 8},
                              "cancel_authority": ["alice"]})
    again = RunSpec.from_dict(spec.to_dict())
    assert again == spec and again.spec_id == spec.spec_id
    assert again.resources.exclude == ("n1",)


@pytest.mark.parametrize(("raw", "key", "found"), [
    ({**MINIMAL, "resorces": {}}, "resorces", "resorces"),
    ({**MINIMAL, "resources": {"nodez": 2}}, "resources.nodez", "nodez"),
    ({**MINIMAL, "resources": {"nodes": 0}}, "resources.nodes", "0"),
    ({**MINIMAL, "resources": {"nodes": "2"}}, "resources.nodes", "'2'"),
    ({**MINIMAL, "resources": {"nodes": True}}, "resources.nodes", "True"),
    ({**MINIMAL, "membership": {"mode": "elastic", "min_nodes": 4, "max_nodes": 2}},
     "membership.min_nodes", "4"),
    ({**MINIMAL, "data": {"contract": "exactish"}}, "data.contract", "exactish"),
    ({"name": "tiny"}, "entrypoint", "None"),
    ({**MINIMAL, "entrypoint": "train.py"}, "entrypoint", "train.py"),
    ({**MINIMAL, "checkpoint": {"keep_last": 1}}, "checkpoint.keep_last", "1"),
    ({**MINIMAL, "retry": {"max_attempts": {"hangs": 2}}}, "retry.max_attempts.hangs", "hangs"),
    ({**MINIMAL, "config": {"x": {1, 2}}}, "config.x", "set"),
    ({**MINIMAL, "checkpoint": {"tiers": ["nvme"]}}, "checkpoint.tiers", "nvme"),
])
def test_bad_input_names_key_path_expected_and_found(raw: dict, key: str, found: str) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(raw)
    msg = str(info.value)
    assert f"{key}: expected" in msg, msg
    assert found in msg, msg
    assert "\n" not in msg and ";" in msg  # one line, with a fix after the semicolon


def test_load_spec_resolves_latest_alias_before_digest(tmp_path: Path) -> None:
    (tmp_path / "data" / "v1").mkdir(parents=True)
    (tmp_path / "data" / "v2").mkdir()
    for v in ("v1", "v2"):
        (tmp_path / "data" / v / "manifest.json").write_text("{}")
    os.symlink("v1", tmp_path / "data" / "latest")
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump({**MINIMAL,
                                        "data": {"manifest": "data/latest/manifest.json"}}))
    first = load_spec(run_yaml)
    assert first.data.manifest == str((tmp_path / "data/v1/manifest.json").resolve())
    (tmp_path / "data" / "latest").unlink()
    os.symlink("v2", tmp_path / "data" / "latest")
    second = load_spec(run_yaml)
    assert second.data.manifest.endswith("v2/manifest.json")
    assert first.spec_id != second.spec_id


def test_load_spec_errors_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    missing_manifest = tmp_path / "m.yaml"
    missing_manifest.write_text(yaml.safe_dump({**MINIMAL, "data": {"manifest": "nope.json"}}))
    with pytest.raises(SpecError, match=r"data\.manifest: expected an existing file"):
        load_spec(missing_manifest)


def test_freeze_fills_code_and_versions_and_changes_digest() -> None:
    spec = RunSpec.from_dict(MINIMAL)
    frozen = freeze_spec(spec, code=CodeVersion(commit="abc1234", dirty=True, snapshot="code"),
                         versions={"python": "3.11.7", "torch": "2.13.0"})
    assert frozen.code is not None and frozen.code.snapshot == "code"
    assert frozen.versions["torch"] == "2.13.0" and frozen.spec_id != spec.spec_id
    with pytest.raises(SpecError, match="snapshot"):
        CodeVersion(commit="abc1234", dirty=True, snapshot=None)


def test_sdc_checks_are_on_by_default_and_a_default_section_keeps_old_spec_ids() -> None:
    spec = RunSpec.from_dict(MINIMAL)
    assert spec.sdc.enabled and spec.sdc.every_steps == 100 and spec.sdc.policy == "fail"
    assert "sdc" not in spec.to_dict()  # written before the section existed: same spec_id
    tuned = RunSpec.from_dict({**MINIMAL, "sdc": {"every_steps": 10, "loss_spike": 4,
                                                  "policy": "skip_batch"}})
    assert tuned.to_dict()["sdc"]["policy"] == "skip_batch"
    assert tuned.spec_id != spec.spec_id


@pytest.mark.parametrize(("section", "says"), [
    ({"every_steps": 0}, "sdc.every_steps"),
    ({"loss_spike": 0.5}, "sdc.loss_spike"),
    ({"policy": "retry"}, "sdc.policy"),
    ({"canary_every_min": -1}, "sdc.canary_every_min"),
])
def test_a_bad_sdc_section_names_the_key(section: dict[str, object], says: str) -> None:
    with pytest.raises(SpecError, match=says.replace(".", r"\.")):
        RunSpec.from_dict({**MINIMAL, "sdc": section})
