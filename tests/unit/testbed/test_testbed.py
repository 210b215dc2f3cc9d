"""The Testbed shell's refusals and its idempotent, scoped teardown, without real daemons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.errors import ConfigError, TestbedError
from hpcrun.runner import CommandResult
from hpcrun.testbed import Testbed, TestbedConfig
from hpcrun.testbed.config import config_to_json
from hpcrun.testing.fakes import FakeClock, FakeRunner


def _testbed(tmp_path: Path, *, runner: FakeRunner | None = None, uid: int = 0,
             search_path: str | None = None, nodes: int = 2) -> Testbed:
    config = TestbedConfig(state_dir=tmp_path / "tb", nodes=nodes)
    return Testbed(config, runner=runner or FakeRunner(), clock=FakeClock(),
                   proc=tmp_path / "no-proc", euid=lambda: uid, search_path=search_path)


@pytest.mark.parametrize("action", ["up", "down", "crash", "boot"])
def test_every_change_needs_root(tmp_path: Path, action: str) -> None:
    tb = _testbed(tmp_path, uid=1000)
    call = {"up": tb.up, "down": tb.down, "crash": lambda: tb.crash("node1"),
            "boot": lambda: tb.boot("node1")}[action]
    with pytest.raises(TestbedError, match=f"`hpcrun testbed {action}` needs root.*uid 1000"):
        call()


def test_missing_packages_that_apt_cannot_install_fail_clearly(tmp_path: Path) -> None:
    failed = CommandResult(argv=("apt-get",), returncode=100, stdout="",
                           stderr="E: Unable to locate package slurm-wlm\n")
    runner = FakeRunner({"apt-get update": "ok\n", "apt-get install": failed})
    empty = tmp_path / "bin"
    empty.mkdir()
    tb = _testbed(tmp_path, runner=runner, search_path=str(empty))
    with pytest.raises(TestbedError) as err:
        tb.up()
    message = str(err.value)
    assert "\n" not in message
    assert "needs slurmctld, slurmd, munged, slurmdbd, mariadbd, ch-run, mpiexec" in message
    assert "exited 100: E: Unable to locate package slurm-wlm" in message
    install = runner.calls[1]
    assert install[:5] == ("apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm")
    assert set(install[5:]) == {"munge", "slurmdbd", "mariadb-server",
                                "charliecloud-runtime", "openmpi-bin", "libopenmpi-dev"}


def test_down_is_idempotent_and_wipes_only_what_the_testbed_owns(tmp_path: Path) -> None:
    tb = _testbed(tmp_path)
    state = tb.config.state_dir
    for sub in ("spool/ctld", "nodes/node1/local", "shared/x", "pids", "logs", "mariadb/mysql"):
        (state / sub).mkdir(parents=True)
    (state / "testbed.json").write_text(config_to_json(tb.config))
    (state / "pids" / "slurmd-node1.pid").write_text("999999999\n")  # stale: no such process
    (state / "logs" / "slurmctld.log").write_text("kept for post-mortems\n")
    (state / "notes.txt").write_text("not ours\n")
    assert tb.down() == []
    assert tb.down() == []
    assert sorted(p.name for p in state.iterdir()) == ["logs", "notes.txt"]
    assert (state / "logs" / "slurmctld.log").exists()


def test_crash_of_unknown_node_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown testbed node 'node7'"):
        _testbed(tmp_path).crash("node7")


def test_boot_needs_a_running_controller(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match="testbed is not up"):
        _testbed(tmp_path).boot("node1")


def test_status_of_a_stopped_testbed(tmp_path: Path) -> None:
    st = _testbed(tmp_path).status()
    assert not st.up and st.nodes == {}
    assert [d.name for d in st.daemons if not d.running][-2:] == ["slurmd@node1", "slurmd@node2"]


def test_from_state_dir_reads_the_persisted_config(tmp_path: Path) -> None:
    config = TestbedConfig(state_dir=tmp_path, nodes=3, grace_time=5)
    (tmp_path / "testbed.json").write_text(config_to_json(config))
    tb = Testbed.from_state_dir(tmp_path)
    assert tb.config == config and tb.nodes == ("node1", "node2", "node3")
    assert tb.env == {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf"}
    assert tb.node_local_dir("node2") == tmp_path / "nodes" / "node2" / "local"


def test_cli_env_and_status_json(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["testbed", "env", "--state-dir", str(tmp_path)])
    assert out.exit_code == 0
    assert f"export SLURM_CONF={tmp_path}/etc/slurm.conf\n" in out.output
    status = runner.invoke(cli, ["testbed", "status", "--json", "--state-dir", str(tmp_path)])
    assert status.exit_code == 1  # not up
    assert json.loads(status.output)["up"] is False


def test_cli_refuses_bad_node_count() -> None:
    out = CliRunner().invoke(cli, ["testbed", "up", "--nodes", "0"])
    assert out.exit_code == 2 and "--nodes" in out.output


def _alive(proc: Path, pid: int, name: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) S 1 1\n")
    (proc / str(pid) / "comm").write_text(f"{name}\n")


def test_a_lane_down_while_another_lane_runs_leaves_munged_to_it(tmp_path: Path) -> None:
    """Lanes share the machine's munged: the first lane up started it; a lane going down
    while another lane's controller runs hands the munged pid file to that lane, whose down
    (or the last lane's) stops it, instead of pulling authentication from under its jobs."""
    from hpcrun.testbed.config import lane_config
    from hpcrun.testbed.plan import Daemon, pid_file_name

    proc = tmp_path / "proc"
    first = lane_config(tmp_path / "tb", 0)
    second = lane_config(tmp_path / "tb", 1)
    munged_pid, ctld_pid = 999_999_990, 999_999_991  # above pid_max: never a real process
    for config in (first, second):
        config.pid_dir.mkdir(parents=True)
        config.testbed_json.write_text(config_to_json(config))
    (first.pid_dir / pid_file_name(Daemon.MUNGED, None)).write_text(f"{munged_pid}\n")
    (second.pid_dir / pid_file_name(Daemon.SLURMCTLD, None)).write_text(f"{ctld_pid}\n")
    _alive(proc, munged_pid, "munged")
    _alive(proc, ctld_pid, "slurmctld")
    tb = Testbed(first, runner=FakeRunner(), clock=FakeClock(), proc=proc, euid=lambda: 0)
    assert tb.down() == []  # munged runs on, for the other lane
    handed = second.pid_dir / pid_file_name(Daemon.MUNGED, None)
    assert handed.read_text().strip() == str(munged_pid)
    assert not first.pid_dir.exists()


def test_a_lanes_own_state_dir_names_that_lane_whatever_the_lane_variable_says(
        tmp_path: Path) -> None:
    """``--state-dir`` of a testbed that is up (a lane's own directory) is that testbed even
    with ``$HPCRUN_TESTBED_LANE`` set, which would otherwise add its suffix a second time and
    crash nothing; a crash of a testbed never brought up is refused, naming the directory."""
    lane2 = tmp_path / "tb-lane2"
    lane2.mkdir()
    (lane2 / "testbed.json").write_text(config_to_json(TestbedConfig(state_dir=lane2, nodes=2)))
    runner = CliRunner(env={"HPCRUN_TESTBED_LANE": "2"})
    out = runner.invoke(cli, ["testbed", "env", "--state-dir", str(lane2)])
    assert out.exit_code == 0 and f"export SLURM_CONF={lane2}/etc/slurm.conf\n" in out.output
    missing = tmp_path / "never-up"
    crash = runner.invoke(cli, ["testbed", "crash", "node1", "--state-dir", str(missing)])
    assert crash.exit_code != 0 and not missing.exists()
    assert f"no testbed at {missing}-lane2" in str(crash.output) + str(crash.exception)
