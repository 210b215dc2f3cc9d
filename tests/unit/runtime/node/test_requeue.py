"""The supervising agent's own requeue on Slurm: hold, update, release; an elastic run's job
asks for its node range again."""

from __future__ import annotations

from typing import Any

from hpcrun.control.spec import RunSpec
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.requeue import SlurmRequeuer, requeuer_for
from hpcrun.scheduler.slurm import Observation, SlurmJobState


class StubSlurm:
    """The calls a requeue makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def observe(self, job_id: str) -> Observation:
        return Observation(job_id=job_id, state=SlurmJobState.RUNNING)

    def scontrol_show_job(self, job_id: str) -> dict[str, str]:
        return {"PreemptTime": "None"}

    def requeuehold(self, job_id: str) -> None:
        self.calls.append(("requeuehold", job_id))

    def update_job(self, job_id: str, **fields: str) -> None:
        self.calls.append(("update", fields))

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id))


def test_an_elastic_requeue_asks_for_the_node_range_before_the_release() -> None:
    slurm = StubSlurm()
    resize = {"NumNodes": "2-3", "NumTasks": "2"}
    done = SlurmRequeuer(slurm, "7", resize=resize).requeue(  # type: ignore[arg-type]
        delay_s=0.0, exclude=("node2",))
    # NumTasks too: one agent per node, and 3 tasks would still need 3 nodes (measured:
    # BadConstraints with NumNodes alone)
    assert slurm.calls == [("requeuehold", "7"),
                           ("update", {"ExcNodeList": "node2", "NumNodes": "2-3",
                                       "NumTasks": "2"}),
                           ("release", "7")]
    assert done == "requeued job 7 (hold, begin +0 s, exclude node2, nodes 2-3, release)"


def test_a_fixed_gang_requeue_leaves_the_node_count_alone() -> None:
    slurm = StubSlurm()
    SlurmRequeuer(slurm, "7").requeue(delay_s=5.0, exclude=())  # type: ignore[arg-type]
    assert slurm.calls[1] == ("update", {"StartTime": "now+5"})


def test_the_agent_gives_an_elastic_run_a_requeuer_with_its_range() -> None:
    node = NodeInfo(node="n0", node_rank=0, nodes=("n0", "n1", "n2"), job_id="7",
                    restart_count=0, node_local_root=None, backend="slurm")
    base = {"name": "t", "entrypoint": "m:f", "resources": {"nodes": 3}}
    elastic = RunSpec.from_dict({**base, "membership": {"mode": "elastic", "min_nodes": 2}})
    assert requeuer_for(node, elastic)._resize == {  # type: ignore[union-attr]
        "NumNodes": "2-3", "NumTasks": "2"}
    assert requeuer_for(node, RunSpec.from_dict(base))._resize == {}  # type: ignore[union-attr]


def test_agents_inside_a_pyxis_image_reach_slurm_through_the_sites_wrapper() -> None:
    """Images ship no Slurm clients: every Slurm call of the agent runs as the site's
    ``HPCRUN_SLURM_WRAPPER`` followed by the command, and reads as the command itself."""
    from hpcrun.runner import SLURM_WRAPPER_ENV, slurm_runner
    from hpcrun.testing.fakes import FakeRunner

    host = FakeRunner({"ssh -o BatchMode=yes gw scontrol": "ok\n"})
    runner = slurm_runner({SLURM_WRAPPER_ENV: "ssh -o BatchMode=yes gw"}, host)
    result = runner.run(["scontrol", "requeuehold", "7"])
    assert host.calls == [("ssh", "-o", "BatchMode=yes", "gw", "scontrol", "requeuehold", "7")]
    assert (result.argv, result.stdout) == (("scontrol", "requeuehold", "7"), "ok\n")
    assert slurm_runner({}, host) is host
