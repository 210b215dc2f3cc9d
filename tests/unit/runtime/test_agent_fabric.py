"""The agent chooses its node's fabric address before its partner server and its beats start,
and refuses to start them on a node without the configured interface."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.control.log import RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.errors import ConfigError
from hpcrun.launch.fabric import FabricSource, read_interfaces
from hpcrun.launch.site import SiteConfig
from hpcrun.runtime.agent import EXIT_USER_ERROR, Agent
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.membership import node_liveness
from hpcrun.runtime.node.netbeat import read_endpoint
from hpcrun.runtime.node.requeue import LocalRequeuer
from hpcrun.testing import FakeClock
from hpcrun.vocab import Backend, RunState


def _agent(tmp_path: Path, *, nodes: int, fabric_interface: str, node: str,
           node_rank: int = 0) -> Agent:
    spec = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                              "resources": {"nodes": nodes}})
    run_dir = create_run(tmp_path, spec, run_id="r1")
    names = [f"{node}-{i}" for i in range(nodes)]
    names[node_rank] = node
    info = NodeInfo(node=node, node_rank=node_rank, nodes=tuple(names), job_id="local-1",
                    restart_count=0, node_local_root=tmp_path / "local" / node,
                    backend=Backend.LOCAL)
    site = SiteConfig(name="testsite", node_local_path=str(tmp_path / "local"),
                      shared_path=str(tmp_path), fabric_interface=fabric_interface)
    return Agent(run_dir=run_dir, node=info, spec=spec, site=site, log=RunLog(run_dir),
                 requeuer=LocalRequeuer(), clock=FakeClock(), environ={"HPCRUN_WARM": "0"})


def _absent() -> str:
    names = {i.name for i in read_interfaces()}
    return next(f"nope{i}" for i in range(100) if f"nope{i}" not in names)


def test_the_supervising_agent_without_the_configured_interface_fails_the_run_at_once(
        tmp_path: Path) -> None:
    absent = _absent()
    agent = _agent(tmp_path, nodes=2, fabric_interface=absent, node="fab-a")
    assert agent.run() == EXIT_USER_ERROR
    record = read_record(agent.run_dir)
    reason = str((record.result or {}).get("reason", ""))
    assert record.state == RunState.FAILED and f"has no interface {absent}" in reason
    assert "lo 127.0.0.1" in reason
    assert not (agent.run_dir / "partner").exists(), "no secret, no published address"
    assert not (agent.run_dir / "alive").exists(), "no beat endpoint"


def test_another_agent_without_it_exits_with_the_error_and_writes_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    absent = _absent()
    agent = _agent(tmp_path, nodes=2, fabric_interface=absent, node="fab-d", node_rank=1)
    before = len(RunLog(agent.run_dir).read())
    assert agent.run() == ConfigError.exit_code
    assert len(RunLog(agent.run_dir).read()) == before
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hpcrun agent fab-d: error: site config key "
                                               f"'fabric_interface' is '{absent}'")


def test_the_configured_interface_is_chosen_and_said(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    agent = _agent(tmp_path, nodes=2, fabric_interface="lo", node="fab-b")
    choice = agent._fabric()
    assert choice is not None and choice.source is FabricSource.CONFIGURED
    assert (choice.address, choice.interface) == ("127.0.0.1", "lo")
    line = capfd.readouterr().err.strip()
    assert line == ("hpcrun agent fab-b: talks to the other agents on 127.0.0.1 on lo "
                    "(configured: fabric_interface lo)")


def test_the_beat_receiver_binds_to_the_address_the_agent_chose(tmp_path: Path) -> None:
    agent = _agent(tmp_path, nodes=2, fabric_interface="lo", node="fab-e")
    with node_liveness(agent.run_dir, agent.node, host="127.0.0.2") as (board, _):
        assert board is not None
        endpoint = read_endpoint(agent.run_dir, "fab-e", job_start=agent.node.job_start_key)
    assert endpoint is not None and endpoint[0] == "127.0.0.2"


def test_a_run_without_partner_copies_or_beats_never_looks_at_the_setting(
        tmp_path: Path) -> None:
    agent = _agent(tmp_path, nodes=1, fabric_interface="nope0", node="fab-c")
    assert agent._fabric() is None
