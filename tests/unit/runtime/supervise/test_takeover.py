"""Supervision as a role: who claims when the supervisor is lost, which claim stands, and the
supervisor shell taking over on a real run log with a fake clock."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpcrun.control.entries import SupervisionClaimPayload
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.errors import StaleGenerationError
from hpcrun.launch.signals import StopFlag
from hpcrun.runtime.incarnation import EXIT_USER_ERROR, AgentExit, Incarnation
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.logview import LogView
from hpcrun.runtime.node.membership import NODE_STALE_S, LivenessWatch
from hpcrun.runtime.supervise.supervisor import Supervisor
from hpcrun.runtime.supervise.takeover import claim_due, standing_claims, successor, supervisor_of
from hpcrun.testing import FakeClock
from tests.unit.runtime.supervise.test_supervisor import SPARE_SPEC, BeatingClock, RecordingRequeuer

ALLOC = ("n0", "n1", "n2", "n3")


# -- who claims (pure) ---------------------------------------------------------------------------
def test_the_successor_is_the_surviving_gang_node_with_the_lowest_node_rank() -> None:
    assert successor(ALLOC, ("n0", "n1", "n2"), supervisor="n0", unusable=()) == "n1"
    assert successor(ALLOC, ("n0", "n1", "n2"), supervisor="n0", unusable=("n1",)) == "n2"
    # the gang's order, not the allocation's: a spare swapped into position 0 comes first
    assert successor(ALLOC, ("n3", "n1"), supervisor="n0", unusable=()) == "n3"


def test_spares_come_after_gang_nodes_and_nobody_is_left_when_all_are_gone() -> None:
    assert successor(ALLOC, ("n0", "n1"), supervisor="n0", unusable=("n1",)) == "n2"
    assert successor(ALLOC, ("n0", "n1"), supervisor="n0",
                     unusable=("n1", "n2", "n3")) is None


def test_only_the_successor_claims_and_only_once_the_supervisor_went_stale() -> None:
    clock = FakeClock()
    watch = LivenessWatch(["n0", "n2"], clock=clock)  # n1's own view of the others
    watch.observe_net({"n0": clock.monotonic(), "n2": clock.monotonic()})
    clock.advance(NODE_STALE_S - 0.5)
    watch.observe_net({"n2": clock.monotonic()})  # n0 stopped beating; n2 goes on
    args = {"allocation": ALLOC[:3], "gang": ("n0", "n1"), "supervisor": "n0",
            "quarantined": ()}
    assert not claim_due("n1", stale=watch.stale(), **args), "within the bound"
    clock.advance(1.0)
    watch.observe_net({"n2": clock.monotonic()})
    assert watch.stale() == ("n0",)
    assert claim_due("n1", stale=watch.stale(), **args)
    assert not claim_due("n2", stale=watch.stale(), **args), "the spare is not the successor"
    assert not claim_due("n0", stale=(), **args), "a live supervisor is never replaced"


# -- which claim stands (pure, over the fencing fold) ---------------------------------------------
def _claim(log: RunLog, node: str, fence: tuple[int, str], replaces: str = "n0") -> None:
    log.append_entry(SupervisionClaimPayload(node=node, replaces=replaces, attempt=0),
                     generation=fence[0], holder=fence[1])


def test_of_two_claims_under_one_fence_the_earlier_stands(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    (tmp_path / "log").mkdir()
    f = log.claim("job7.r0.a0.x")
    _claim(log, "n1", (f.generation, f.holder))
    _claim(log, "n2", (f.generation, f.holder))
    view = LogView(log)
    view.refresh()
    assert [c.node for c in standing_claims(view.valid)] == ["n1"]
    assert supervisor_of(view.valid, allocation=ALLOC, job_start="job7.r0.") == "n1"


def test_a_stale_claimants_publish_is_refused_and_claims_nothing(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    (tmp_path / "log").mkdir()
    old = log.claim("job7.r0.a0.x")
    log.claim("job7.r0.a1.y")  # a newer incarnation fenced the old one out
    with pytest.raises(StaleGenerationError, match="void"):
        log.publish_entry(SupervisionClaimPayload(node="n2", replaces="n0", attempt=0),
                          generation=old.generation, holder=old.holder)
    view = LogView(log)
    view.refresh()
    assert standing_claims(view.valid) == []
    assert supervisor_of(view.valid, allocation=ALLOC, job_start="job7.r0.") == "n0"


def test_a_claim_of_an_earlier_job_start_does_not_carry_over_a_requeue(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    (tmp_path / "log").mkdir()
    f = log.claim("job7.r0.a0.x")
    _claim(log, "n1", (f.generation, f.holder))
    log.claim("job7.r1.a0.z")  # Slurm requeued the job: node 0 of the new allocation leads
    view = LogView(log)
    view.refresh()
    assert supervisor_of(view.valid, allocation=("n5", "n6"), job_start="job7.r1.") == "n5"
    assert supervisor_of(view.valid, allocation=ALLOC, job_start="job7.r0.") == "n1"


# -- the shell: an agent other than node 0 takes over ---------------------------------------------
def _agent(tmp_path: Path, me: str, live: Sequence[str]) -> tuple[Supervisor, Incarnation,
                                                                   RecordingRequeuer, RunLog]:
    """Allocation n0 n1 n2, gang (n0, n1), spare n2; ``me`` runs the supervisor shell."""
    run_dir = create_run(tmp_path, SPARE_SPEC, run_id="r1")
    log, requeuer = RunLog(run_dir), RecordingRequeuer()
    nodes = ("n0", "n1", "n2")
    node = NodeInfo(node=me, node_rank=nodes.index(me), nodes=nodes, job_id="7",
                    restart_count=0, node_local_root=None, backend="slurm")
    fence = log.claim("job7.r0.a0.x")
    inc = Incarnation(run_dir=run_dir, run_id="r1", generation=fence.generation,
                      holder=fence.holder, fence_slot=fence.slot, job_id="7", restart_count=0,
                      attempt=0, node=me, node_local_root=None, gang=("n0", "n1"))
    sup = Supervisor(run_dir=run_dir, node=node, spec=SPARE_SPEC, log=log, view=LogView(log),
                     requeuer=requeuer, stop=StopFlag(), preempt_signal=int(signal.SIGUSR1),
                     clock=BeatingClock(run_dir, live))
    sup.watch_nodes(sup.clock.board)  # type: ignore[attr-defined]
    return sup, inc, requeuer, log


def _node_exit(log: RunLog, inc: Incarnation, node: str) -> None:
    log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
               payload={"event": "node_exit", "node": node, "status": "failed", "attempt": 0})


def test_the_successor_claims_and_swaps_the_spare_into_the_lost_supervisors_place(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _agent(tmp_path, "n1", live=("n2",))  # n0's agent vanished
    _node_exit(log, inc, "n1")  # n1's ranks lost their peers on n0
    assert not sup.supervising
    assert sup.follow(inc) == AgentExit(next_attempt=1)
    assert sup.supervising and sup.clock.monotonic() < 10
    claims = [e for e in log.read() if e.kind == EntryKind.SUPERVISE]
    assert [(c.payload["node"], c.payload["replaces"]) for c in claims] == [("n1", "n0")]
    assert (claims[0].generation, claims[0].holder) == (inc.generation, inc.holder)
    rec = read_record(inc.run_dir)
    assert rec.state == "RECOVERING" and requeuer.calls == [], "same job, no requeue"
    assert rec.membership == ("n2", "n1"), "the spare takes node rank 0's position"
    assert rec.quarantined == ("n0",)
    assert [f.fault for f in rec.faults] == ["node_failure"] and "n0" in rec.faults[0].detail


def test_an_agent_that_is_not_the_successor_keeps_following(tmp_path: Path) -> None:
    sup, inc, _, log = _agent(tmp_path, "n2", live=("n1",))  # n1 is alive and succeeds
    assert sup.follow(inc, wait_s=20) == AgentExit(status=EXIT_USER_ERROR)
    assert [e for e in log.read() if e.kind == EntryKind.SUPERVISE] == []
    assert not sup.supervising


def test_the_spare_claims_when_no_gang_node_is_left(tmp_path: Path) -> None:
    sup, inc, requeuer, _ = _agent(tmp_path, "n2", live=())  # n0 and n1 both gone
    ended = sup.follow(inc, wait_s=None)
    assert sup.supervising and ended.next_attempt is None
    # two lost nodes, one spare: the run requeues as before, decided by the spare's agent
    assert read_record(inc.run_dir).state == "REQUEUED" and len(requeuer.calls) == 1


def test_a_supervisor_that_another_agent_replaced_follows_instead_of_deciding(
        tmp_path: Path) -> None:
    sup, inc, _, log = _agent(tmp_path, "n0", live=("n1", "n2"))
    _claim(log, "n1", (inc.generation, inc.holder))  # n1 took over while n0 looked dead
    assert not sup.supervising
    log.claim("job7.r0.a1.y")  # the new supervisor's restart
    assert sup.conclude(inc) == AgentExit(next_attempt=1)
    assert [e for e in log.read() if e.kind == EntryKind.STATE] == [], "n0 decided nothing"


def _gang_of(inc: Incarnation, gang: tuple[str, ...]) -> Incarnation:
    return dataclasses.replace(inc, gang=gang)


def test_a_run_that_ends_under_a_taken_over_supervisor_gives_the_allocation_back(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _agent(tmp_path, "n1", live=())  # the others have exited
    _claim(log, "n1", (inc.generation, inc.holder))
    inc = _gang_of(inc, ("n2", "n1"))  # the spare in node rank 0's position
    for node in inc.gang:
        log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
                   payload={"event": "node_exit", "node": node, "status": "succeeded",
                            "attempt": 0})
    assert sup.conclude(inc) == AgentExit()
    assert read_record(inc.run_dir).state == "SUCCEEDED"
    # the batch script died with n0: nothing else would end the job before its time limit
    assert requeuer.released and sup.clock.monotonic() < 10


def test_node_0_supervising_as_always_leaves_the_job_to_its_batch_script(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _agent(tmp_path, "n0", live=("n1", "n2"))
    for node in inc.gang:
        log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
                   payload={"event": "node_exit", "node": node, "status": "succeeded",
                            "attempt": 0})
    assert sup.conclude(inc) == AgentExit()
    assert read_record(inc.run_dir).state == "SUCCEEDED" and not requeuer.released
