"""The incarnation's identity travels to ranks through the environment, and back."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.errors import EnvError
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.info import NodeInfo


def _inc(**over: object) -> Incarnation:
    base = dict(run_dir=Path("/runs/r1"), run_id="r1", generation=3, holder="job7.r1.a0.abc",
                fence_slot=12, job_id="7", restart_count=1, attempt=0, node="node2",
                node_local_root=Path("/scratch/local"))
    base.update(over)
    return Incarnation(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("local", [Path("/scratch/local"), None])
def test_environ_round_trip(local: Path | None) -> None:
    inc = _inc(node_local_root=local)
    assert Incarnation.from_environ(inc.to_environ()) == inc


def test_missing_variable_is_named_with_the_fix() -> None:
    env = _inc().to_environ()
    del env["HPCRUN_HOLDER"]
    with pytest.raises(EnvError, match=r"HPCRUN_HOLDER is not set.*hpcrun submit"):
        Incarnation.from_environ(env)


def test_incarnation_key_distinguishes_restart_and_attempt() -> None:
    node = NodeInfo(node="local0", node_rank=0, nodes=("local0", "local1"), job_id="9",
                    restart_count=2, node_local_root=None, backend="local")
    keys = {node.incarnation_key(a) for a in range(3)}
    assert len(keys) == 3 and all(k.startswith("job9.r2.") for k in keys)
    assert node.master_addr == "127.0.0.1"


def test_local_node_info_from_agent_environment() -> None:
    env = {"HPCRUN_AGENT_NODE": "local1", "HPCRUN_AGENT_NODE_RANK": "1",
           "HPCRUN_AGENT_NODES": "local0,local1", "HPCRUN_AGENT_JOB_ID": "local-5",
           "HPCRUN_AGENT_RESTART_COUNT": "2", "HPCRUN_AGENT_NODE_LOCAL": "/tmp/n1"}
    node = NodeInfo.from_environ(env, node_local_template=None)
    assert (node.node, node.node_rank, node.nodes, node.restart_count) == (
        "local1", 1, ("local0", "local1"), 2)
    assert node.node_local_root == Path("/tmp/n1") and not node.is_supervisor


def test_slurm_node_info_needs_the_job_variables() -> None:
    with pytest.raises(EnvError, match="SLURM_JOB_ID"):
        NodeInfo.from_environ({}, node_local_template=None)
