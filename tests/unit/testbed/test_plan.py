"""Pure decisions: command lines, sinfo parsing, namespace safety, status values."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.scheduler.slurm import parse_sinfo_nodes
from hpcrun.testbed.config import TestbedConfig
from hpcrun.testbed.plan import (
    Daemon,
    DaemonStatus,
    TestbedStatus,
    daemon_plan,
    detached_argv,
    is_node_namespace,
    node_argv,
    node_ready,
)

CONFIG = TestbedConfig(state_dir=Path("/srv/tb"), nodes=2)


def test_sinfo_nodes_listed_once_per_partition_are_folded_and_judged() -> None:
    text = "node1|idle\nnode2|down*\nnode1|idle\nnode2|down*\nnode3|MIXED\n\n"
    states = parse_sinfo_nodes(text)
    assert states == {"node1": "idle", "node2": "down*", "node3": "MIXED"}
    assert sorted(n for n, s in states.items() if node_ready(s)) == ["node1", "node3"]


def test_only_answering_usable_nodes_are_ready() -> None:
    assert all(node_ready(s) for s in ("idle", "mixed", "allocated", "completing", "idle+"))
    assert not any(node_ready(s) for s in ("idle*", "down", "down*", "drained", "unknown", ""))


def test_a_node_namespace_is_never_a_host_namespace() -> None:
    hosts = ("uts:[1]", "uts:[2]")
    assert is_node_namespace("uts:[3]", hosts)
    assert not is_node_namespace("uts:[1]", hosts)
    assert not is_node_namespace("uts:[2]", hosts)
    assert not is_node_namespace(None, hosts)
    assert not is_node_namespace("", hosts)
    assert is_node_namespace("uts:[3]", (None, "uts:[2]"))  # pid 1 unreadable: self still checked


@settings(max_examples=50, deadline=None)
@given(ns=st.integers(1, 10**6), host=st.lists(st.integers(1, 10**6), min_size=1, max_size=3))
def test_namespace_rule_property(ns: int, host: list[int]) -> None:
    names = [f"uts:[{h}]" for h in host]
    assert is_node_namespace(f"uts:[{ns}]", names) == (ns not in host)


def test_start_order_puts_auth_and_database_before_slurm() -> None:
    order = [(d.value, n) for d, n in daemon_plan(CONFIG)]
    assert order == [("munged", None), ("mariadbd", None), ("slurmdbd", None),
                     ("slurmctld", None), ("slurmd", "node1"), ("slurmd", "node2")]
    no_acct = TestbedConfig(state_dir=Path("/srv/tb"), nodes=1, accounting=False)
    assert [d for d, _ in daemon_plan(no_acct)] == [Daemon.MUNGED, Daemon.SLURMCTLD,
                                                     Daemon.SLURMD]


def test_node_starts_in_private_uts_and_mount_namespace() -> None:
    argv = node_argv(CONFIG, "node2", pid_file=Path("/p/pid"), log_file=Path("/p/log"))
    assert argv[:7] == ["setsid", "-f", "unshare", "--uts", "--mount", "--propagation",
                        "private"]
    script = argv[argv.index("-c") + 1]
    assert "hostname node2" in script
    assert "mount --bind /srv/tb/nodes/node2/hosts /etc/hosts" in script
    assert "mount --bind /srv/tb/nodes/node2/local /scratch/local" in script
    assert argv[-6:] == ["slurmd", "-D", "-N", "node2", "-f", "/srv/tb/etc/slurm.conf"]


def test_detached_command_records_its_own_pid_and_logs(tmp_path: Path) -> None:
    pid_file, log = tmp_path / "x.pid", tmp_path / "x.log"
    argv = detached_argv(["sh", "-c", "echo hello; echo $$ > " + str(tmp_path / "self")],
                         pid_file=pid_file, log_file=log)
    argv = argv[2:]  # run in the foreground here, without setsid -f, to wait for it
    subprocess.run(argv, check=True, timeout=10)
    assert log.read_text() == "hello\n"
    assert pid_file.read_text() == (tmp_path / "self").read_text()  # exec kept the pid


def test_status_is_up_only_with_every_daemon_and_node_ready() -> None:
    daemons = (DaemonStatus(name="slurmctld", pid=10, running=True),
               DaemonStatus(name="slurmd@node1", pid=11, running=True))
    up = TestbedStatus(state_dir="/s", slurm_conf="/s/etc/slurm.conf", daemons=daemons,
                       nodes={"node1": "idle"})
    assert up.up
    assert json.loads(up.to_json())["daemons"][1] == {"name": "slurmd@node1", "pid": 11,
                                                      "running": True}
    assert "slurmd@node1" in up.to_text() and "pid 11" in up.to_text()
    assert not TestbedStatus(state_dir="/s", slurm_conf="/c", daemons=daemons,
                             nodes={"node1": "down*"}).up
    stopped = (daemons[0], DaemonStatus(name="slurmd@node1", pid=None, running=False))
    assert not TestbedStatus(state_dir="/s", slurm_conf="/c", daemons=stopped,
                             nodes={"node1": "idle"}).up
