"""Every drain of a node goes through one shared-tier storage: the supervisor's tier-1 wait
meets the same deadline and the same drill storage fault as the node's drainer."""

from __future__ import annotations

from pathlib import Path

from hpcrun.checkpoint.commit import commit_entry
from hpcrun.control.entries import DrainErrorNote
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.launch.site import SiteConfig
from hpcrun.runtime.agent import Agent
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.logview import decoded
from hpcrun.runtime.node.requeue import LocalRequeuer
from hpcrun.runtime.supervise.decisions import Succeed
from hpcrun.runtime.supervise.supervisor import TIER1_WAIT_S
from hpcrun.testing import FakeClock
from hpcrun.vocab import Tier

SPEC = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                          "resources": {"nodes": 2}})


def _agent(tmp_path: Path, run_dir: Path, inject: str, clock: FakeClock) -> Agent:
    node = NodeInfo(node="n0", node_rank=0, nodes=("n0", "n1"), job_id="local-1",
                    restart_count=0, node_local_root=tmp_path / "local" / "n0", backend="local")
    site = SiteConfig(name="testsite", node_local_path=str(tmp_path / "local"),
                      shared_path=str(tmp_path))
    return Agent(run_dir=run_dir, node=node, spec=SPEC, site=site, log=RunLog(run_dir),
                 requeuer=LocalRequeuer(), clock=clock,
                 environ={"HPCRUN_INJECT": inject, "HPCRUN_WARM": "0"})


def test_the_tier1_wait_drains_through_the_drills_storage_fault(tmp_path: Path) -> None:
    """With the shared tier down (the drill's ``storage@mode=fail``), the supervisor's wait
    for the tier-1 commit notes each failed retry instead of draining around the fault."""
    run_dir = create_run(tmp_path, SPEC, run_id="r1")
    down = tmp_path / "shared-tier-down"
    down.touch()
    clock = FakeClock()
    agent = _agent(tmp_path, run_dir, f"storage@mode=fail,while={down}", clock)
    log = RunLog(run_dir)
    fence = log.claim("joblocal-1.r0.a0.x")
    inc = Incarnation(run_dir=run_dir, run_id="r1", generation=fence.generation,
                      holder=fence.holder, fence_slot=fence.slot, job_id="local-1",
                      restart_count=0, attempt=0, node="n0",
                      node_local_root=tmp_path / "local" / "n0")
    log.publish_entry(commit_entry(run_id="r1", ckpt_id="c10", generation=fence.generation,
                                   step=10, tier=Tier.NODE_LOCAL, digest="0" * 64,
                                   total_bytes=1, nodes=("n0", "n1")),
                      generation=fence.generation, holder=fence.holder)

    agent.supervisor.carry_out(inc, Succeed(reason="all ranks finished"))

    errors = decoded([e for e in log.read() if e.kind == EntryKind.NOTE], DrainErrorNote)
    assert len(errors) > 1 and all(e.node == "n0" and e.ckpt_id == "c10" for e in errors)
    assert all(f"injected while {down} exists" in (e.detail or "") for e in errors)
    # retried for the whole wait its one byte sets at the prior rate: the 10 s floor
    assert 10.0 <= clock.monotonic() < TIER1_WAIT_S
    assert not [e for e in log.read()
                if e.kind == EntryKind.COMMIT and e.payload.get("tier") == "shared"]
