"""The supervisor's shell on a real run log with a fake clock: what it waits for, what it logs."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.entries import SalvageNote
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.errors import StaleGenerationError
from hpcrun.launch.signals import StopFlag
from hpcrun.observe.postrun import read_manifest
from hpcrun.runtime.incarnation import EXIT_OK, EXIT_PREEMPTED, AgentExit, Incarnation
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.logview import LogView
from hpcrun.runtime.node.membership import NODE_STALE_ECHO_S, NODE_STALE_S, alive_path
from hpcrun.runtime.node.netbeat import Beat, BeatBoard
from hpcrun.runtime.supervise.decisions import Fail
from hpcrun.runtime.supervise.supervisor import FAULT_SETTLE_S, NODE_EXIT_WAIT_S, POLL_S, Supervisor
from hpcrun.testing import FakeClock

SPEC = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                          "resources": {"nodes": 2},
                          "retry": {"jitter": False, "backoff_base_s": 10}})


class RecordingRequeuer:
    """A local-backend requeuer that remembers what it was asked."""

    slurm_requeues = False

    def __init__(self) -> None:
        self.calls: list[tuple[float, tuple[str, ...]]] = []
        self.released = False

    def requeue(self, *, delay_s: float, exclude: Sequence[str]) -> str:
        self.calls.append((delay_s, tuple(exclude)))
        return "recorded"

    def previous_run(self, *, tries: int = 5, wait_s: float = 1.0) -> None:
        return None

    def outlive(self, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> bool:
        return False

    def release(self) -> str:
        self.released = True
        return "released"


class Setup:
    def __init__(self, tmp_path: Path, node_local_root: Path | None = None) -> None:
        self.run_dir = create_run(tmp_path, SPEC, run_id="r1")
        self.log = RunLog(self.run_dir)
        self.clock = FakeClock()
        self.stop = StopFlag()
        self.requeuer = RecordingRequeuer()
        node = NodeInfo(node="n0", node_rank=0, nodes=("n0", "n1"), job_id="local-1",
                        restart_count=0, node_local_root=node_local_root, backend="local")
        fence = self.log.claim("joblocal-1.r0.a0.x")
        self.inc = Incarnation(run_dir=self.run_dir, run_id="r1", generation=fence.generation,
                               holder=fence.holder, fence_slot=fence.slot, job_id="local-1",
                               restart_count=0, attempt=0, node="n0", node_local_root=None)
        self.sup = Supervisor(run_dir=self.run_dir, node=node, spec=SPEC, log=self.log,
                              view=LogView(self.log), requeuer=self.requeuer, stop=self.stop,
                              preempt_signal=int(signal.SIGUSR1), clock=self.clock)

    def note(self, node: str, status: str) -> None:
        self.log.append(EntryKind.NOTE, generation=self.inc.generation, holder=self.inc.holder,
                        payload={"event": "node_exit", "node": node, "status": status,
                                 "attempt": 0})

    def fault(self, **payload: Any) -> None:
        self.log.append(EntryKind.FAULT, generation=self.inc.generation,
                        holder=self.inc.holder, payload=payload)

    def states(self) -> list[str]:
        return [str(e.payload["state"]) for e in self.log.read() if e.kind == EntryKind.STATE]


@pytest.fixture
def s(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def test_all_nodes_succeeded_ends_the_run_succeeded(s: Setup) -> None:
    s.note("n0", "succeeded")
    s.note("n1", "succeeded")
    assert s.sup.conclude(s.inc) == AgentExit(status=EXIT_OK)
    assert s.states() == ["SUCCEEDED"] and s.clock.sleeps == []
    result = read_record(s.run_dir).result
    assert result is not None and result["state"] == "SUCCEEDED"
    manifest = read_manifest(s.run_dir, result)  # published, fenced, digest-verified
    assert (manifest["terminal_state"], manifest["generation"]) == ("SUCCEEDED", 1)


def test_a_failed_run_publishes_its_post_run_manifest_with_the_reason(s: Setup) -> None:
    s.sup.carry_out(s.inc, Fail(reason="retry budget for process_crash spent"))
    record = read_record(s.run_dir)
    assert record.result is not None
    assert record.result["reason"] == "retry budget for process_crash spent"
    assert read_manifest(s.run_dir, record.result)["terminal_state"] == "FAILED"


def test_a_manifest_that_cannot_be_written_leaves_the_terminal_state(s: Setup) -> None:
    def broken(log: RunLog, generation: int, holder: str) -> None:
        raise OSError(28, "No space left on device")

    s.sup.on_end = broken
    s.sup.carry_out(s.inc, Fail(reason="boom"))
    record = read_record(s.run_dir)
    assert str(record.state) == "FAILED" and record.result is not None
    assert "manifest" not in record.result


def test_a_silent_node_is_waited_for_then_counted_lost(s: Setup) -> None:
    s.note("n0", "failed")
    ended = s.sup.conclude(s.inc)
    assert NODE_EXIT_WAIT_S <= s.clock.monotonic() < NODE_EXIT_WAIT_S + 1
    # a lost node without spares: RECOVERING, then one requeue without the silent node
    assert s.states() == ["RECOVERING", "REQUEUED"]
    record = read_record(s.run_dir)
    assert "node_failure" in record.state_info["reason"]  # type: ignore[index]
    assert record.quarantined == ("n1",)
    assert s.requeuer.calls == [(10.0, ("n1",))] and ended == AgentExit(status=EXIT_PREEMPTED)


def _salvage_asked(log: RunLog) -> list[list[str]]:
    return [e.payload["lost"] for e in log.read()
            if e.kind == EntryKind.NOTE and e.payload.get("event") == "salvage"]


def test_a_requeue_after_a_node_loss_asks_the_survivors_to_salvage_its_partner_copy(
        tmp_path: Path) -> None:
    """With a tier 0 the supervisor asks every survivor to drain the lost node's copy before
    the requeue, and a follower does so once before it follows the requeue."""
    s = Setup(tmp_path, node_local_root=tmp_path / "nvme")
    s.note("n0", "failed")
    s.sup.conclude(s.inc)
    assert _salvage_asked(s.log) == [["n1"]]
    faults = read_record(s.run_dir).faults  # the lost node logs nothing: the supervisor does
    assert [(f.fault, f.node) for f in faults] == [("node_failure", "n1")]
    assert s.states() == ["RECOVERING", "REQUEUED"] and len(s.requeuer.calls) == 1
    follower = Setup(tmp_path / "f", node_local_root=tmp_path / "nvme")
    drained: list[tuple[str, ...]] = []
    follower.sup._await_tier1 = (  # type: ignore[method-assign]
        lambda inc, *, lost=(), commit_tier1=True: drained.append((tuple(lost), commit_tier1)))
    follower.log.append_entry(SalvageNote(lost=("n1",)), generation=follower.inc.generation,
                              holder=follower.inc.holder)
    follower.log.publish(EntryKind.STATE, generation=follower.inc.generation,
                         holder=follower.inc.holder, payload={"state": "REQUEUED", "reason": "x"})
    assert follower.sup.follow(follower.inc) == AgentExit(status=EXIT_PREEMPTED)
    assert drained == [(("n1",), False)], "once, draining without committing"


def test_without_a_tier_0_a_requeue_after_a_node_loss_salvages_nothing(s: Setup) -> None:
    s.note("n0", "failed")
    s.sup.conclude(s.inc)
    assert _salvage_asked(s.log) == [] and s.states() == ["RECOVERING", "REQUEUED"]


def test_after_a_fault_silent_nodes_get_a_short_settle_time(s: Setup) -> None:
    s.fault(fault="process_crash", node="n0", rank=0, step=3, signature="process_crash:rank0:-9",
            detail="killed")
    assert s.sup.conclude(s.inc) == AgentExit(next_attempt=1)
    assert FAULT_SETTLE_S <= s.clock.monotonic() < FAULT_SETTLE_S + 1
    assert s.states() == ["RECOVERING"]


def test_a_stopped_gang_records_preempted_and_its_fault_then_requeues(s: Setup) -> None:
    s.stop.set(int(signal.SIGUSR1))
    s.note("n0", "preempted")
    s.note("n1", "preempted")
    assert s.sup.conclude(s.inc) == AgentExit(status=EXIT_PREEMPTED)
    assert s.states() == ["PREEMPTED", "REQUEUED"]
    faults = read_record(s.run_dir).faults
    assert [f.fault for f in faults] == ["preemption"] and s.requeuer.calls == [(0.0, ())]


def test_a_newer_fence_stops_the_gather(s: Setup) -> None:
    s.log.claim("joblocal-1.r0.a1.y")
    with pytest.raises(StaleGenerationError, match="fenced out"):
        s.sup.gather(s.inc)


def test_followers_exit_on_requeued_and_join_a_restart(s: Setup) -> None:
    s.log.publish(EntryKind.STATE, generation=s.inc.generation, holder=s.inc.holder,
                  payload={"state": "REQUEUED", "reason": "x"})
    assert s.sup.follow(s.inc) == AgentExit(status=EXIT_PREEMPTED)
    s.log.claim("joblocal-1.r0.a1.z")
    assert s.sup.follow(s.inc) == AgentExit(next_attempt=1)


def test_the_relay_repeats_a_pending_stop_every_two_seconds() -> None:
    from hpcrun.runtime.preemption import RELAY_EVERY_S, Relay

    clock, flag, sent = FakeClock(), StopFlag(), []
    relay = Relay(flag, int(signal.SIGUSR1), clock=clock)
    assert not relay.tick(sent.append)  # nothing to relay yet
    flag.set(int(signal.SIGUSR1))
    assert relay.tick(sent.append) and not relay.tick(sent.append)
    clock.advance(RELAY_EVERY_S + 0.1)
    assert relay.tick(sent.append)
    assert sent == [signal.SIGUSR1, signal.SIGUSR1]


def test_a_rank_fault_outside_the_classes_still_ends_the_gang_read_as_unknown(s: Setup) -> None:
    s.fault(fault="stale", node="n1", rank=1, step=4, signature="stale:rank1:3", detail="fenced")
    s.fault(fault="storage_error", node="n0", rank=None, step=None, signature="drain",
            detail="retried", background=True)
    obs = s.sup.gather(s.inc)
    assert [(f.fault, f.node, f.rank, f.signature) for f in obs.faults] == [
        ("unknown", "n1", 1, "stale:rank1:3")]


def test_a_requeue_logs_the_same_bytes_as_before(s: Setup) -> None:
    s.note("n0", "failed")
    s.sup.conclude(s.inc)
    payloads = {e.kind: dict(e.payload) for e in s.log.read()
                if e.kind in (EntryKind.OP, EntryKind.FAULT)}
    op_id = f"r1.g{s.inc.generation}.requeue"
    assert payloads[EntryKind.OP] == {"op_id": op_id, "action": "requeue", "delay_s": 10.0,
                                      "exclude": ["n1"], "reason": payloads[EntryKind.OP]["reason"]}
    states = [dict(e.payload) for e in s.log.read() if e.kind == EntryKind.STATE]
    assert states[-1] == {"state": "REQUEUED", "reason": states[-1]["reason"], "op_id": op_id,
                          "delay_s": 10.0}
    notes = [dict(e.payload) for e in s.log.read() if e.kind == EntryKind.NOTE]
    assert notes[-1] == {"event": "requeue_sent", "op_id": op_id, "detail": "recorded"}


SPARE_SPEC = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                                "resources": {"nodes": 2, "spare_nodes": 1},
                                "retry": {"jitter": False, "backoff_base_s": 10}})


class BeatingClock(FakeClock):
    """A fake clock whose sleeps let the live agents beat: a network beat heard on the board
    the supervisor watches, and every tenth sleep their liveness file too (the fallback)."""

    def __init__(self, run_dir: Path, live: Sequence[str],
                 nodes: Sequence[str] = ("n0", "n1", "n2")) -> None:
        super().__init__()
        self.run_dir, self.live, self.beat = run_dir, list(live), 0
        self.board = BeatBoard(clock=self)
        for node in nodes:  # every agent beat once at its start; the dead ones stopped since
            self.board.record(Beat(run_id="r1", job_start="job7.r0.", node=node, counter=0))

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.beat += 1
        for node in self.live:
            self.board.record(Beat(run_id="r1", job_start="job7.r0.", node=node,
                                   counter=self.beat))
            if self.beat % 10 == 0:
                path = alive_path(self.run_dir, node)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"node": node, "beat": self.beat}))


def _spare_setup(tmp_path: Path, live: Sequence[str]) -> tuple[Supervisor, Incarnation,
                                                                 RecordingRequeuer, RunLog]:
    run_dir = create_run(tmp_path, SPARE_SPEC, run_id="r1")
    log, requeuer = RunLog(run_dir), RecordingRequeuer()
    clock = BeatingClock(run_dir, live)
    node = NodeInfo(node="n0", node_rank=0, nodes=("n0", "n1", "n2"), job_id="7",
                    restart_count=0, node_local_root=None, backend="slurm")
    fence = log.claim("job7.r0.a0.x")
    inc = Incarnation(run_dir=run_dir, run_id="r1", generation=fence.generation,
                      holder=fence.holder, fence_slot=fence.slot, job_id="7", restart_count=0,
                      attempt=0, node="n0", node_local_root=None, gang=("n0", "n1"))
    sup = Supervisor(run_dir=run_dir, node=node, spec=SPARE_SPEC, log=log, view=LogView(log),
                     requeuer=requeuer, stop=StopFlag(), preempt_signal=int(signal.SIGUSR1),
                     clock=clock)
    sup.watch_nodes(sup.clock.board)  # type: ignore[attr-defined]
    return sup, inc, requeuer, log


def test_a_vanished_gang_node_is_replaced_by_the_live_spare_in_the_same_job(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _spare_setup(tmp_path, live=("n2",))  # n1's agent is gone
    log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
               payload={"event": "node_exit", "node": "n0", "status": "failed", "attempt": 0})
    assert sup.conclude(inc) == AgentExit(next_attempt=1)
    assert sup.clock.monotonic() < NODE_EXIT_WAIT_S / 5, "no wait for the silent node's note"
    rec = read_record(inc.run_dir)
    assert rec.state == "RECOVERING"
    assert rec.membership == ("n0", "n2"), "the spare takes n1's node rank"
    assert rec.quarantined == ("n1",) and requeuer.calls == [], "same job, no requeue"
    assert [f.fault for f in rec.faults] == ["node_failure"] and "n1" in rec.faults[0].detail


def test_a_vanished_node_with_a_dead_spare_requeues_as_before(tmp_path: Path) -> None:
    sup, inc, requeuer, _ = _spare_setup(tmp_path, live=())
    sup.conclude(inc)
    assert read_record(inc.run_dir).state == "REQUEUED" and len(requeuer.calls) == 1


def test_a_spare_follows_the_run_for_as_long_as_it_goes_on(s: Setup) -> None:
    s.clock.advance(10_000)  # far beyond any wait a gang member has for a decision
    s.log.claim("joblocal-1.r0.a1.y")
    assert s.sup.follow(s.inc, wait_s=None) == AgentExit(next_attempt=1)


def test_with_spares_a_peer_error_waits_for_the_silent_node_to_go_stale_then_swaps(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _spare_setup(tmp_path, live=("n2",))
    log.append(EntryKind.FAULT, generation=inc.generation, holder=inc.holder,
               payload={"fault": "process_crash", "node": "n0", "rank": 0, "step": 9,
                        "signature": "process_crash:rank0:1", "detail": "peer closed"})
    assert sup.conclude(inc) == AgentExit(next_attempt=1)
    rec = read_record(inc.run_dir)
    assert rec.membership == ("n0", "n2") and rec.quarantined == ("n1",)
    assert requeuer.calls == [] and FAULT_SETTLE_S < sup.clock.monotonic() < 10


def _peer_lost(log: RunLog, inc: Incarnation, node: str) -> None:
    log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
               payload={"event": "peer_lost", "node": node, "ranks": [0, 1]})
    log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
               payload={"event": "node_exit", "node": node, "status": "failed", "attempt": 0})


def test_a_silent_node_whose_peers_lost_a_peer_is_lost_after_the_short_bound(
        tmp_path: Path) -> None:
    sup, inc, requeuer, log = _spare_setup(tmp_path, live=("n2",))  # n1's agent is gone
    _peer_lost(log, inc, "n0")
    assert sup.conclude(inc) == AgentExit(next_attempt=1)
    assert NODE_STALE_ECHO_S < sup.clock.monotonic() < NODE_STALE_S, \
        "the collective's lost peer corroborates the silence: no full staleness bound"
    assert read_record(inc.run_dir).quarantined == ("n1",) and requeuer.calls == []


def test_without_a_lost_peer_a_silent_node_gets_the_full_staleness_bound(
        tmp_path: Path) -> None:
    sup, inc, _, _ = _spare_setup(tmp_path, live=("n2",))
    sup.clock.advance(NODE_STALE_ECHO_S + 0.5)
    assert sup.vanished(inc) == (), "silent for less than NODE_STALE_S: not lost yet"
    sup.clock.advance(NODE_STALE_S)
    sup._liveness_read = float("-inf")
    assert sup.vanished(inc) == ("n1",)


def test_a_node_that_keeps_beating_is_never_lost_even_after_a_lost_peer(
        tmp_path: Path) -> None:
    sup, inc, _, log = _spare_setup(tmp_path, live=("n1", "n2"))
    _peer_lost(log, inc, "n0")
    for _ in range(int(4 * NODE_STALE_S / POLL_S)):
        sup.clock.sleep(POLL_S)  # n1 beats on every sleep: slow, not gone
        assert sup.vanished(inc) == ()


ELASTIC_SPEC = RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny:main",
                                  "resources": {"nodes": 3},
                                  "membership": {"mode": "elastic", "min_nodes": 2},
                                  "retry": {"jitter": False, "backoff_base_s": 10}})


def _elastic_setup(tmp_path: Path, live: Sequence[str], gang: tuple[str, ...] = (
        "n0", "n1", "n2")) -> tuple[Supervisor, Incarnation, RecordingRequeuer, RunLog]:
    run_dir = create_run(tmp_path, ELASTIC_SPEC, run_id="r1")
    log, requeuer = RunLog(run_dir), RecordingRequeuer()
    node = NodeInfo(node="n0", node_rank=0, nodes=("n0", "n1", "n2"), job_id="7",
                    restart_count=0, node_local_root=None, backend="slurm")
    fence = log.claim("job7.r0.a0.x")
    inc = Incarnation(run_dir=run_dir, run_id="r1", generation=fence.generation,
                      holder=fence.holder, fence_slot=fence.slot, job_id="7", restart_count=0,
                      attempt=0, node="n0", node_local_root=None, gang=gang)
    sup = Supervisor(run_dir=run_dir, node=node, spec=ELASTIC_SPEC, log=log,
                     view=LogView(log), requeuer=requeuer, stop=StopFlag(),
                     preempt_signal=int(signal.SIGUSR1), clock=BeatingClock(run_dir, live))
    sup.watch_nodes(sup.clock.board)  # type: ignore[attr-defined]
    return sup, inc, requeuer, log


def test_an_elastic_gang_watches_liveness_without_spares(tmp_path: Path) -> None:
    sup, *_ = _elastic_setup(tmp_path, live=("n1", "n2"))
    assert sup.liveness is not None, "an elastic run survives a node loss: agents beat"


def test_a_vanished_node_of_an_elastic_gang_shrinks_it_in_the_same_job(tmp_path: Path) -> None:
    sup, inc, requeuer, log = _elastic_setup(tmp_path, live=("n2",))  # n1's agent is gone
    log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
               payload={"event": "node_exit", "node": "n0", "status": "failed", "attempt": 0})
    assert sup.conclude(inc) == AgentExit(next_attempt=1)
    rec = read_record(inc.run_dir)
    assert rec.state == "RECOVERING" and requeuer.calls == [], "same job, no requeue"
    assert rec.membership == ("n0", "n2"), "the survivors, node ranks dense"
    assert rec.quarantined == ("n1",)
    assert [f.fault for f in rec.faults] == ["node_failure"] and "n1" in rec.faults[0].detail
    recovering = [e for e in log.read() if e.kind == EntryKind.STATE][-1]
    assert recovering.payload["nodes"] == ["n0", "n2"]
    assert "shrinks from 3 to 2 nodes" in str(recovering.payload["reason"])


def test_an_elastic_gang_at_min_nodes_requeues_on_a_node_loss(tmp_path: Path) -> None:
    sup, inc, requeuer, _ = _elastic_setup(tmp_path, live=(), gang=("n0", "n2"))
    sup.conclude(inc)
    assert read_record(inc.run_dir).state == "REQUEUED" and len(requeuer.calls) == 1


def test_a_supervisor_blocked_on_a_stalled_filesystem_loses_no_node_it_heard_meanwhile(
        tmp_path: Path) -> None:
    """The liveness files froze for 10 s and the supervisor's loop was blocked as long; the
    receiver heard every live agent meanwhile, on its own clock: nobody is lost."""
    sup, inc, _, _ = _spare_setup(tmp_path, live=("n1", "n2"))
    board: BeatBoard = sup.clock.board  # type: ignore[attr-defined]
    sup.clock.live = []  # type: ignore[attr-defined]  # nothing written or heard during...
    FakeClock.advance(sup.clock, 9.5)
    for node in ("n1", "n2"):  # ...except the beats the receiver heard just before looking
        board.record(Beat(run_id="r1", job_start="job7.r0.", node=node, counter=10_000))
    FakeClock.advance(sup.clock, 0.5)
    assert sup.vanished(inc) == () and sup.live_spares(inc) == ("n2",)


def test_a_slow_shared_tier_operation_is_reported_once_as_a_background_stall(
        tmp_path: Path) -> None:
    from hpcrun.storage import SHARED_TIER_SLOW

    sup, inc, _, log = _spare_setup(tmp_path, live=("n1", "n2"))
    SHARED_TIER_SLOW.take()
    SHARED_TIER_SLOW.note("listdir", tmp_path / "log", 9.8)
    assert sup.moved_on(inc, peer_faulted=lambda _: False) is None, "the run goes on"
    SHARED_TIER_SLOW.note("read_bytes", tmp_path / "x", 5.0)  # the same stall, seen later
    assert sup.moved_on(inc, peer_faulted=lambda _: False) is None
    stalls = [e.payload for e in log.read() if e.kind == EntryKind.FAULT]
    assert len(stalls) == 1 and stalls[0]["signature"] == "storage:stall"
    assert stalls[0]["background"] is True and "listdir" in stalls[0]["detail"]
    assert "9.8 s" in stalls[0]["detail"] and read_record(inc.run_dir).quarantined == ()


def test_an_agent_watches_its_beat_peers_only(tmp_path: Path) -> None:
    from hpcrun.runtime.node.netbeat import beat_peers

    sup, *_ = _spare_setup(tmp_path, live=())  # n0, a watcher: it hears every node
    sup.liveness = None
    sup.watch_nodes(BeatBoard(), beat_peers("n0", ("n0", "n1", "n2", "n3", "n4")))
    assert sup.liveness is not None and sup.liveness.nodes == ("n1", "n2", "n3", "n4")
    sup.liveness = None  # as if n0 were the fifth node: it would watch the three watchers
    sup.watch_nodes(BeatBoard(), beat_peers("n0", ("n5", "n6", "n7", "n8", "n0")))
    assert sup.liveness is not None and sup.liveness.nodes == ("n5", "n6", "n7")


def test_a_drain_after_a_stop_signal_keeps_within_the_preemptions_grace(tmp_path: Path) -> None:
    """The end of an incarnation may drain for TIER1_WAIT_S; once a stop signal came, only
    for what is left of the site's grace (its preemption lead) less the requeue's margin."""
    from hpcrun.runtime.supervise.supervisor import REQUEUE_MARGIN_S, TIER1_WAIT_S

    s = Setup(tmp_path)
    clock = s.clock
    stop = StopFlag(clock=clock)
    sup = Supervisor(run_dir=s.run_dir, node=s.sup.node, spec=SPEC, log=s.log,
                     view=LogView(s.log), requeuer=s.requeuer, stop=stop,
                     preempt_signal=int(signal.SIGUSR1), clock=clock, grace_s=60.0)
    assert sup.time_left() == TIER1_WAIT_S
    stop.set(int(signal.SIGUSR1))
    clock.advance(20.0)
    assert sup.time_left() == pytest.approx(60.0 - 20.0 - REQUEUE_MARGIN_S)
    clock.advance(45.0)
    assert sup.time_left() == 0.0
