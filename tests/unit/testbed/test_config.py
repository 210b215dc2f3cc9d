"""Rendering of the testbed's configuration files from a TestbedConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.errors import ConfigError
from hpcrun.testbed.config import (
    MAX_LANES,
    TestbedConfig,
    config_from_json,
    config_to_json,
    default_lane,
    default_state_dir,
    lane_config,
    node_range,
    render_db_init_sql,
    render_env_exports,
    render_hosts,
    render_slurm_conf,
    render_slurmdbd_conf,
    state_dir_of_slurm_conf,
)

STATE = Path("/srv/tb")


def _keys(text: str) -> dict[str, str]:
    """Single-valued ``Key=value`` lines of a Slurm config (Node/Partition lines excluded)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " in line or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key] = value
    return out


def _lines(text: str, prefix: str) -> list[dict[str, str]]:
    return [dict(w.split("=", 1) for w in line.split()) for line in text.splitlines()
            if line.startswith(prefix)]


def test_slurm_conf_carries_the_settings_the_testbed_relies_on() -> None:
    keys = _keys(render_slurm_conf(TestbedConfig(state_dir=STATE)))
    assert keys["AuthInfo"] == "cred_expire=5"  # requeue → running again in ~7 s
    assert keys["JobRequeue"] == "1"
    assert keys["ReturnToService"] == "1"
    assert keys["KillWait"] == "5"
    assert keys["MinJobAge"] == "300"
    assert keys["SlurmdTimeout"] == "10"
    assert keys["SchedulerParameters"] == "sched_interval=2,bf_interval=2"
    assert keys["ScronParameters"] == "enable"  # scrontab for `hpcrun watch --install`
    assert keys["ProctrackType"] == "proctrack/linuxproc"
    assert keys["TaskPlugin"] == "task/none"
    assert keys["SelectType"] == "select/cons_tres"
    assert keys["SlurmdParameters"] == "config_overrides"
    assert keys["PreemptType"] == "preempt/partition_prio"
    assert keys["PreemptMode"] == "REQUEUE"
    assert keys["SlurmctldParameters"] == "preempt_send_user_signal"
    assert keys["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert keys["SlurmctldHost"] == "head(127.0.0.1)"
    assert keys["StateSaveLocation"] == f"{STATE}/spool/ctld"
    assert keys["SlurmdSpoolDir"] == f"{STATE}/nodes/%n/spool"
    assert "PreemptParameters" not in keys  # a fatal parse error in Slurm 22.05


def test_each_node_is_on_loopback_with_its_own_port() -> None:
    nodes = _lines(render_slurm_conf(TestbedConfig(state_dir=STATE, nodes=3)), "NodeName=")
    assert [n["NodeName"] for n in nodes] == ["node1", "node2", "node3"]
    assert all(n["NodeAddr"] == "127.0.0.1" and n["NodeHostname"] == n["NodeName"]
               for n in nodes)
    assert [int(n["Port"]) for n in nodes] == [6821, 6822, 6823]


def test_partitions_preemptible_batch_and_high() -> None:
    config = TestbedConfig(state_dir=STATE, nodes=2, grace_time=7)
    parts = {p["PartitionName"]: p for p in _lines(render_slurm_conf(config), "PartitionName=")}
    assert parts["batch"]["Default"] == "YES" and parts["high"]["Default"] == "NO"
    assert parts["batch"]["PriorityTier"] == "1" and parts["high"]["PriorityTier"] == "2"
    assert parts["batch"]["GraceTime"] == "7"
    assert parts["batch"]["PreemptMode"] == "REQUEUE" and parts["high"]["PreemptMode"] == "off"
    assert parts["batch"]["Nodes"] == parts["high"]["Nodes"] == "node[1-2]"


def test_without_accounting_no_slurmdbd() -> None:
    keys = _keys(render_slurm_conf(TestbedConfig(state_dir=STATE, accounting=False)))
    assert keys["AccountingStorageType"] == "accounting_storage/none"
    assert "AccountingStorageHost" not in keys


def test_slurmdbd_conf_points_at_the_testbeds_own_mariadb() -> None:
    config = TestbedConfig(state_dir=STATE, mariadb_port=3399, slurmdbd_port=6900)
    keys = _keys(render_slurmdbd_conf(config))
    assert keys["StorageHost"] == "127.0.0.1" and keys["StoragePort"] == "3399"
    assert keys["DbdPort"] == "6900"
    assert _keys(render_slurm_conf(config))["AccountingStoragePort"] == "6900"
    sql = render_db_init_sql(config)
    assert f"'{keys['StorageUser']}'@'127.0.0.1'" in sql and keys["StoragePass"] in sql
    assert f"ON {keys['StorageLoc']}.*" in sql


def test_hosts_file_resolves_every_node_and_the_controller_to_loopback() -> None:
    text = render_hosts(TestbedConfig(state_dir=STATE, nodes=3), "node2")
    v4 = [line.split() for line in text.splitlines() if line.startswith("127.")]
    assert v4[1] == ["127.0.0.1", "node2"]  # its own name first after localhost
    assert {name for _, name in v4} == {"localhost", "node1", "node2", "node3", "head"}


def test_env_exports_are_eval_safe() -> None:
    text = render_env_exports(TestbedConfig(state_dir=Path("/srv/my tb")))
    assert "export SLURM_CONF='/srv/my tb/etc/slurm.conf'\n" in text
    assert "export HPCRUN_TESTBED_NODE_LOCAL=/scratch/local\n" in text


def test_node_range_and_dirs() -> None:
    assert node_range(TestbedConfig(state_dir=STATE, nodes=1)) == "node1"
    config = TestbedConfig(state_dir=STATE, nodes=4)
    assert node_range(config) == "node[1-4]"
    assert config.node_local_dir("node3") == STATE / "nodes" / "node3" / "local"
    with pytest.raises(ConfigError, match="unknown testbed node 'node5'"):
        config.node_local_dir("node5")


@pytest.mark.parametrize("kwargs, message", [
    ({"state_dir": Path("rel")}, "must be absolute"),
    ({"nodes": 0}, "nodes must be 1..64"),
    ({"grace_time": -1}, "grace_time"),
    ({"node_local_path": "scratch"}, "node_local_path"),
    ({"slurmd_base_port": 6816}, "distinct"),  # node1 would take slurmctld's 6817
    ({"mariadb_port": 80}, "1024..65535"),
])
def test_invalid_configs_are_refused(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"state_dir": STATE}
    with pytest.raises(ConfigError, match=message):
        TestbedConfig(**{**base, **kwargs})  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(nodes=st.integers(1, 64), accounting=st.booleans(), grace=st.integers(0, 3600),
       base=st.integers(7000, 60000))
def test_persisted_config_round_trips(nodes: int, accounting: bool, grace: int,
                                      base: int) -> None:
    config = TestbedConfig(state_dir=STATE, nodes=nodes, accounting=accounting,
                           grace_time=grace, slurmd_base_port=base)
    assert config_from_json(config_to_json(config)) == config


@pytest.mark.parametrize("text, message", [
    ("not json", "is not JSON"),
    ('{"schema_version": 99}', "schema_version"),
    (config_to_json(TestbedConfig(state_dir=STATE)).replace('"nodes": 4', '"nodes": "4"'),
     "'nodes' should be int"),
    (config_to_json(TestbedConfig(state_dir=STATE)).replace('"accounting": true',
                                                            '"accounting": 1'),
     "'accounting' should be bool"),
])
def test_malformed_persisted_config_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_json(text)


def test_state_dir_from_environment() -> None:
    assert default_state_dir({}) == Path("/var/lib/hpcrun-testbed")
    assert default_state_dir({"HPCRUN_TESTBED_DIR": "/x/y"}) == Path("/x/y")


def test_lanes_are_clusters_apart_that_share_nothing_keyed_by_port_name_or_job_id() -> None:
    lanes = [lane_config(STATE, k, nodes=4) for k in range(MAX_LANES)]
    assert lanes[0] == TestbedConfig(state_dir=STATE, nodes=4)
    assert [c.state_dir.name for c in lanes[1:]] == ["tb-lane1", "tb-lane2", "tb-lane3"]
    ports = [p for c in lanes for p in (c.slurmctld_port, c.slurmdbd_port, c.mariadb_port,
                                        *(c.slurmd_port(n) for n in c.node_names))]
    assert len(set(ports)) == len(ports)
    assert len({c.cluster_name for c in lanes}) == MAX_LANES
    assert [c.first_job_id for c in lanes] == [1, 1_000_001, 2_000_001, 3_000_001]
    assert "FirstJobId=1000001" in render_slurm_conf(lanes[1]).splitlines()
    assert config_from_json(config_to_json(lanes[2])) == lanes[2]
    with pytest.raises(ConfigError, match=r"lane must be 0\.\.3"):
        lane_config(STATE, MAX_LANES)


def test_lane_from_environment() -> None:
    assert default_lane({}) == 0
    assert default_lane({"HPCRUN_TESTBED_LANE": "2"}) == 2
    with pytest.raises(ConfigError, match="HPCRUN_TESTBED_LANE must be a lane number"):
        default_lane({"HPCRUN_TESTBED_LANE": "two"})


def test_the_testbed_a_slurm_conf_belongs_to_is_found_only_beside_its_testbed_json(
        tmp_path: Path) -> None:
    config = lane_config(tmp_path / "tb", 1)
    config.slurm_conf.parent.mkdir(parents=True)
    config.slurm_conf.write_text("")
    assert state_dir_of_slurm_conf(str(config.slurm_conf)) is None  # not (yet) a testbed
    config.testbed_json.write_text(config_to_json(config))
    assert state_dir_of_slurm_conf(str(config.slurm_conf)) == tmp_path / "tb-lane1"
    assert state_dir_of_slurm_conf("/etc/slurm/slurm.conf") is None
    assert state_dir_of_slurm_conf("") is None
