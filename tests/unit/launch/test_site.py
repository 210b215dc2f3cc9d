"""Site configs: the shipped files load, bad files fail naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.errors import ConfigError
from hpcrun.launch.site import (
    SITE_SNAPSHOT,
    Backend,
    PreemptMode,
    SiteConfig,
    default_search_dirs,
    expand_path,
    load_site,
    load_site_snapshot,
    save_site_snapshot,
    site_configs_dir,
    site_from_dict,
)

SHIPPED = sorted(site_configs_dir().glob("*.yaml"))
MINIMAL = {"name": "mini", "node_local_path": "/nvme/$SLURM_JOB_ID", "shared_path": "/lustre/r"}


def write_site(directory: Path, name: str, body: dict[str, object]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_the_four_required_sites_are_shipped() -> None:
    assert {p.stem for p in SHIPPED} >= {"generic-gpu", "preemptible", "testbed", "local"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_site_loads_by_name_and_round_trips(path: Path) -> None:
    site = load_site(path.stem)
    assert site.name == path.stem
    assert site_from_dict(json.loads(json.dumps(site.to_dict()))) == site
    if site.backend is Backend.SLURM:
        assert site.partition, "a Slurm site names its default partition"
        assert "SLURM_JOB_ID" in site.node_local_path, "node-local data is per job"


def test_shipped_sites_cover_the_documented_cases() -> None:
    assert load_site("preemptible").preempt_mode is PreemptMode.REQUEUE
    assert load_site("generic-gpu").gpus_per_node == 8
    testbed = load_site("testbed")
    assert (testbed.partition, testbed.high_partition) == ("batch", "high")
    assert testbed.preempt_lead_s >= 30, "Slurm checks time limits every 30 s"
    assert load_site("local").backend is Backend.LOCAL


def test_defaults_of_a_minimal_site(tmp_path: Path) -> None:
    site = load_site(str(write_site(tmp_path, "mini", MINIMAL)))
    assert site.preempt_signal == "USR1" and site.signal_name() == "USR1"
    assert site.preempt_lead_s == 120 and site.preempt_mode is PreemptMode.REQUEUE
    assert site.backend == "slurm" and site.requeue_allowed and site.python is None
    assert site.modules == () and dict(site.env) == {}


def test_unknown_key_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = write_site(tmp_path, "bad", {**MINIMAL, "partiton": "gpu"})
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert str(path) in str(info.value) and "'partiton'" in str(info.value)


@pytest.mark.parametrize("missing", ["name", "node_local_path", "shared_path"])
def test_missing_required_key_names_the_file_and_the_key(tmp_path: Path, missing: str) -> None:
    body = {k: v for k, v in MINIMAL.items() if k != missing}
    path = write_site(tmp_path, "bad", body)
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert str(path) in str(info.value) and f"'{missing}'" in str(info.value)


@pytest.mark.parametrize(("key", "value"), [
    ("gpus_per_node", "eight"), ("gpus_per_node", True), ("preempt_lead_s", 1.5),
    ("modules", "cuda/12"), ("env", ["A=1"]), ("requeue_allowed", "yes"), ("partition", 3),
    ("mtbf_prior_h", "long"),
])
def test_wrong_type_names_the_file_the_key_and_the_value(tmp_path: Path, key: str,
                                                         value: object) -> None:
    path = write_site(tmp_path, "bad", {**MINIMAL, key: value})
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert str(path) in str(info.value) and f"'{key}'" in str(info.value)


@pytest.mark.parametrize(("key", "value"), [
    ("backend", "kubernetes"), ("preempt_mode", "suspend"), ("preempt_signal", "USR9"),
    ("gres", "gpu:4"), ("gpus_per_node", -1), ("preempt_lead_s", 70000), ("name", "a b"),
    ("mtbf_prior_h", 0),
])
def test_bad_value_names_the_file_and_the_key(tmp_path: Path, key: str, value: object) -> None:
    path = write_site(tmp_path, "bad", {**MINIMAL, key: value})
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert str(path) in str(info.value) and key in str(info.value)


def test_bad_yaml_and_wrong_top_level_and_schema_version(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_site(str(broken))
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_site(str(listing))
    with pytest.raises(ConfigError, match="schema_version"):
        load_site(str(write_site(tmp_path, "v9", {**MINIMAL, "schema_version": 9})))


def test_names_are_searched_in_the_shipped_dir_then_the_env_dirs(tmp_path: Path) -> None:
    write_site(tmp_path, "mysite", {**MINIMAL, "name": "mysite", "partition": "p"})
    dirs = default_search_dirs({"HPCRUN_SITE_CONFIGS": str(tmp_path)})
    assert dirs[0] == site_configs_dir() and dirs[-1] == tmp_path
    assert load_site("mysite", search_dirs=dirs).partition == "p"
    with pytest.raises(ConfigError) as info:
        load_site("nosuch", search_dirs=dirs)
    assert "nosuch" in str(info.value) and "mysite" in str(info.value), "lists what exists"
    with pytest.raises(ConfigError, match="does not exist"):
        load_site(str(tmp_path / "missing.yaml"))


def test_gpu_request_syntax() -> None:
    plain = SiteConfig(**MINIMAL, gpus_per_node=8)
    gres = SiteConfig(**MINIMAL, gpus_per_node=8, gres="gpu:a100:{n}")
    assert plain.gpu_flag(4) == ("gpus-per-node", "4")
    assert gres.gpu_flag(4) == ("gres", "gpu:a100:4")
    assert plain.gpu_flag(0) is None and gres.gpu_flag(0) is None


def test_expand_path_reads_only_the_given_environment() -> None:
    env = {"SLURM_JOB_ID": "4242", "USER": "ada", "HOME": "/home/ada"}
    assert expand_path("/nvme/$USER/${SLURM_JOB_ID}/x", env) == Path("/nvme/ada/4242/x")
    assert expand_path("~/runs", env) == Path("/home/ada/runs")
    with pytest.raises(ConfigError, match=r"\$SLURM_JOB_ID"):
        expand_path("/nvme/$SLURM_JOB_ID", {"USER": "ada"})


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abcdefghij0123456789-_.", min_size=1, max_size=12),
       st.text(alphabet="abcdefghij0123456789", min_size=1, max_size=8))
def test_expand_path_substitutes_exactly(job: str, user: str) -> None:
    env = {"SLURM_JOB_ID": job, "USER": user}
    assert str(expand_path("/a/$USER/b/${SLURM_JOB_ID}c", env)) == f"/a/{user}/b/{job}c"


def test_snapshot_round_trips_and_rejects_tampering(tmp_path: Path) -> None:
    site = load_site("generic-gpu")
    path = save_site_snapshot(tmp_path, site)
    assert path == tmp_path / SITE_SNAPSHOT
    assert load_site_snapshot(tmp_path) == site
    raw = json.loads(path.read_text())
    raw["preempt_mode"] = "sometimes"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_site_snapshot(tmp_path)
    assert str(path) in str(info.value) and "preempt_mode" in str(info.value)
    with pytest.raises(ConfigError, match="site snapshot"):
        load_site_snapshot(tmp_path / "nowhere")
