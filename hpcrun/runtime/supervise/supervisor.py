"""The supervisor's effectful shell: gather what happened, ask
:mod:`hpcrun.runtime.supervise.decide`, carry the decision out.

The node-0 agent's :class:`Supervisor` waits for every node's ``node_exit`` note (or the first
fault), folds what it saw into :class:`~hpcrun.runtime.supervise.decisions.Observations`, calls
:func:`~hpcrun.runtime.supervise.decide.decide`, and acts on the :data:`Decision`: publish states
and results, wait for the tier-1 commit, requeue, and return the agent's exit. The other agents
:meth:`Supervisor.follow` the log: a newer fence for this job start means "restart with it", a
terminal or REQUEUED state means "exit".

A rank crashes, or a node of a fixed gang dies, in this order:

1. **The rank ends.** A rank whose ``main`` raised leaves a JSON exit report with its fault
   class (``rank/worker.py``'s ``classify``: a lost peer is an echo, ``peer_lost``; a collective
   timeout is a ``hang``) and exits non-zero; a rank killed by a signal leaves none.
2. **Its agent reports.** The rank watch (``node/rankwatch.py``, step 2) sees the exit
   (``node/gang.py``'s ``Gang.poll``), logs the rank's fault under the fence (an echo only as a
   ``peer_lost`` note), stops the node's other ranks with the short fault grace, terminates its
   drain without a final round and notes ``node_exit`` failed. A node that dies with its agent
   reports nothing: the others' ranks fail as echoes of the lost peer.
3. **The other agents stop theirs.** Each sees the fault on the log (:meth:`Supervisor.moved_on`,
   the rank watch's step 7), stops its ranks and notes its own ``node_exit``.
4. **Gather.** :meth:`Supervisor.gather` waits for every gang node's note, or after the first
   fault :data:`FAULT_SETTLE_S` more; a node silent for :data:`NODE_EXIT_WAIT_S` is lost (a
   ``node_failure``). Runs that survive a node loss see a dead agent sooner, from its silence
   on the network (``node/membership.py``, ``node/netbeat.py``).
5. **Decide.** :func:`~hpcrun.runtime.supervise.decide.decide` picks the root cause (echoes
   never count) and sends it through the retry rules: restart in the allocation (a new fence,
   attempt+1: the ranks restore the newest commit), requeue with backoff, excluding a lost or
   quarantined node, or FAILED with the reason.
6. **Carry out.** :meth:`Supervisor.carry_out` publishes the state, requeues
   (``node/requeue.py``) or fences the restart, which every agent joins
   (:func:`rejoin`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.elastic import usable_spares
from hpcrun.control.ending import EndPublisher, publish_ending
from hpcrun.control.entries import (
    ActionKind,
    CommitPayload,
    EntryPayload,
    FaultPayload,
    OpPayload,
    PeerLostNote,
    QuarantinePayload,
    RequeueLeftToSlurmNote,
    RequeueSentNote,
    ResultPayload,
    SalvageNote,
    SegmentNote,
    StatePayload,
    SupervisionClaimPayload,
)
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import read_record
from hpcrun.control.states import RunState
from hpcrun.errors import HpcrunError, StaleGenerationError, StorageError
from hpcrun.launch.sbatch import job_exit_path
from hpcrun.launch.signals import StopFlag
from hpcrun.observe.postrun import post_run_publisher
from hpcrun.runtime import preemption
from hpcrun.runtime.incarnation import EXIT_OK, EXIT_STALE, EXIT_USER_ERROR, AgentExit, Ending
from hpcrun.runtime.node.drainer import DrainTarget, drain_target
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.logview import TERMINAL_STATES, LogView, decoded, gang_faults, node_exits
from hpcrun.runtime.node.membership import (
    ALIVE_EVERY_S,
    FILE_EVERY_S,
    NODE_STALE_ECHO_S,
    NODE_STALE_S,
    LivenessWatch,
    read_liveness,
    watches_liveness,
)
from hpcrun.runtime.node.rankwatch import Watched
from hpcrun.runtime.supervise.decide import (
    account_for_requeue,
    decide,
    enough_to_decide,
    requeue_unrecorded,
    vanished_node_fault,
)
from hpcrun.runtime.supervise.decisions import (
    Decision,
    DecisionPolicy,
    Fail,
    GangFault,
    LeaveToSlurm,
    Observations,
    Requeue,
    RestartInAllocation,
    Shrink,
    Succeed,
    SwapSpare,
)
from hpcrun.runtime.supervise.takeover import claim_due, supervisor_of
from hpcrun.storage import LOCAL_STORAGE, SHARED_TIER_SLOW
from hpcrun.vocab import Backend, FaultClass, Tier

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.runtime.incarnation import Incarnation
    from hpcrun.runtime.node.netbeat import BeatBoard
    from hpcrun.runtime.node.requeue import Requeuer

NODE_EXIT_WAIT_S = 60.0
FAULT_SETTLE_S = 2.0
TIER1_WAIT_S = 120.0
"""Most a tier-1 wait takes (the wait follows the remaining bytes at the measured drain rate)."""
REQUEUE_MARGIN_S = 10.0
"""Kept of a preemption's grace for what follows the tier-1 wait (PREEMPTED, the requeue)."""
FOLLOW_WAIT_S = 900.0
RELEASE_WAIT_S = 30.0
POLL_S = 0.2
STALL_REPORT_GAP_S = 30.0
"""At most one stall report per this long (one stall blocks many operations)."""
STALL_SIGNATURE = "storage:stall"


def rejoin(view: LogView, node: NodeInfo, inc: Incarnation) -> AgentExit:
    """A newer incarnation fenced ``inc``: join it if it is this job's restart, exit when the
    run ended, else this agent is stale."""
    for attempt in range(inc.attempt + 1, inc.attempt + 64):
        if view.fence_with_prefix(node.incarnation_key(attempt)) is not None:
            return AgentExit(next_attempt=attempt)
    if view.terminal():
        return AgentExit(status=EXIT_OK)
    return AgentExit(status=EXIT_STALE)


class Supervisor:
    """One agent's supervision role: decide where the log says this node supervises (node 0 until a
    surviving agent takes over, :mod:`hpcrun.runtime.supervise.takeover`), follow elsewhere."""

    def __init__(self, *, run_dir: Path, node: NodeInfo, spec: RunSpec, log: RunLog,
                 view: LogView, requeuer: Requeuer, stop: StopFlag, preempt_signal: int,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None,
                 on_end: EndPublisher | None = None,
                 drain: Callable[[Incarnation], DrainTarget] | None = None,
                 grace_s: float = TIER1_WAIT_S) -> None:
        """``drain`` is this node's drain target for an incarnation (the agent's: the
        shared-tier deadline and the drill's storage fault its drainer uses); the tier-1 wait
        drains through it. Default: the site's deadline, no injected fault."""
        self.run_dir = run_dir
        self.node = node
        self.policy = DecisionPolicy.of(spec)
        self.log = log
        self.view = view
        self.requeuer = requeuer
        self.stop = stop
        self.preempt_signal = preempt_signal
        self.clock = clock
        self.rng = rng or random.Random()
        self.on_end = on_end if on_end is not None else post_run_publisher(clock=clock)
        self.watches_liveness = watches_liveness(spec, node.backend)
        self.liveness: LivenessWatch | None = None
        self._board: BeatBoard | None = None
        self._stall_reported = float("-inf")
        self._liveness_read = float("-inf")
        self._drain = drain or (lambda inc: drain_target(run_dir, node, inc))
        self.grace_s = grace_s

    # -- node liveness (runs with hot spares) --------------------------------------------------
    def watch_nodes(self, board: BeatBoard | None = None,
                    watched: Sequence[str] | None = None) -> None:
        """Watch the other agents' liveness (runs that survive a node loss: hot spares or an
        elastic gang), once per allocation: agents beat from their start, whatever their
        incarnation does.

        Args:
            board: the beats this agent's receiver hears (None: the liveness files alone).
            watched: the nodes this agent watches (:func:`~hpcrun.runtime.node.netbeat.
                beat_peers`); default every other node.
        """
        if self.watches_liveness and self.liveness is None:
            others = [n for n in (watched if watched is not None else self.node.nodes)
                      if n != self.node.node]
            self.liveness = LivenessWatch(others, clock=self.clock)
            self._board = board

    def vanished(self, inc: Incarnation) -> tuple[str, ...]:
        """Gang nodes whose agent stopped beating (empty without hot spares)."""
        # the gang's collectives already lost a peer: a silent node is the one that is gone
        echoed = bool(decoded(self.view.valid_of(inc.generation, inc.holder, EntryKind.NOTE),
                              PeerLostNote))
        stale = set(self._stale(NODE_STALE_ECHO_S if echoed else None))
        return tuple(n for n in self._gang(inc) if n in stale)

    def moved_on(self, inc: Incarnation, *, peer_faulted: Callable[[Incarnation], bool]
                 ) -> Watched | AgentExit | None:
        """Whether the run moved on from ``inc`` while this node's ranks run, and how this node
        ends then: a newer fence, a terminal state, another node's fault (``peer_faulted``) or a
        vanished gang node (the rank watch's step 7, :mod:`hpcrun.runtime.node.rankwatch`)."""
        self.view.follow()  # backs off while the log is quiet: one listing per 6.4 s at most
        self._report_stall(inc)
        if self.view.fence.generation != inc.generation:
            return rejoin(self.view, self.node, inc)
        if self.view.terminal():
            return AgentExit(status=EXIT_OK)
        if not self.supervising:
            # the supervisor lost while this gang still runs (its peers may block in a
            # collective): its successor takes over and ends the incarnation as it would
            taken = self.take_over_if_lost(self._gang(inc), generation=inc.generation,
                                           holder=inc.holder, attempt=inc.attempt)
            return Watched.PEER_FAILED if taken and self._record_vanished(inc) else None
        if peer_faulted(inc):
            return Watched.PEER_FAILED
        if self._record_vanished(inc):
            return Watched.PEER_FAILED
        return None

    def _report_stall(self, inc: Incarnation) -> None:
        """Report a shared-filesystem stall this agent's process saw (an operation at the
        storage seam slower than :data:`~hpcrun.storage.SLOW_OP_S`) as a background
        ``storage_timeout`` fault, once per :data:`STALL_REPORT_GAP_S`, when it supervises:
        the run goes on; liveness went over the network meanwhile."""
        slow = SHARED_TIER_SLOW.take()
        now = self.clock.monotonic()
        if slow is None or not self.supervising or now - self._stall_reported < STALL_REPORT_GAP_S:
            return
        self._stall_reported = now
        op, path, took = slow
        detail = (f"shared filesystem stalled: {op} {path!r} on {self.node.node} took "
                  f"{took:.1f} s; node liveness went on over the network, no node was declared "
                  "lost for it; check the metadata server (`lfs check servers`)")
        with contextlib.suppress(HpcrunError):  # the report is best effort
            self._append(inc, FaultPayload(fault=FaultClass.STORAGE_TIMEOUT, node=self.node.node,
                                           signature=STALL_SIGNATURE, detail=detail[:2000],
                                           background=True))
        print(f"hpcrun agent {self.node.node}: {detail}", file=sys.stderr)

    def _record_vanished(self, inc: Incarnation) -> bool:
        """Log a ``node_failure`` for gang nodes whose agent vanished; whether there were any.

        Their ranks may never fail here (a peer lost without a reset connection blocks a
        collective): the supervisor ends the incarnation itself.
        """
        lost = self.vanished(inc)
        if lost:
            self.log.append_entry(vanished_node_fault(lost).to_entry(),
                                  generation=inc.generation, holder=inc.holder)
        return bool(lost)

    def _stale(self, bound: float | None = None) -> tuple[str, ...]:
        """Watched nodes neither heard nor seen changing their liveness file for ``bound`` s
        (default ``NODE_STALE_S``; empty without hot spares)."""
        if self.liveness is None:
            return ()
        now = self.clock.monotonic()
        if self._board is not None:
            self.liveness.observe_net(self._board.heard())
        if now - self._liveness_read >= FILE_EVERY_S:
            # the fallback, one read per file beat, of the files of the nodes the network has
            # not heard from lately only: at 2,048 nodes every file was 409 reads a second
            quiet = self.liveness.unheard(NODE_STALE_S)
            if quiet:
                self.liveness.observe(read_liveness(self.run_dir, quiet))
            self._liveness_read = self.clock.monotonic()
        if self._board is not None:
            # after the file read, which may have blocked on a slow shared tier: the board
            # kept hearing meanwhile, on its own clock
            self.liveness.observe_net(self._board.heard())
        return self.liveness.stale(bound)

    # -- who supervises (runs with hot spares: any surviving agent can take over) ---------------
    @property
    def supervising(self) -> bool:
        """Whether this agent supervises the job start now: node 0 until a supervision claim
        in the log names another node (runs without hot spares: node 0, always)."""
        if self.liveness is None:
            return self.node.is_supervisor
        # asked every watch tick: at the follower's pace, not a listing each
        return self.supervisor_node(fresh=False) == self.node.node

    def supervisor_node(self, *, fresh: bool = True) -> str:
        """The node supervising this job start, as the log says (``fresh``: listed now, else
        as the view's follow pace last listed it)."""
        if fresh:
            self.view.refresh()
        else:
            self.view.follow()
        return supervisor_of(self.view.valid, allocation=self.node.nodes,
                             job_start=self.node.job_start_key)

    def take_over_if_lost(self, gang: Sequence[str], *, generation: int, holder: str,
                          attempt: int) -> bool:
        """Claim supervision when the supervising node's agent vanished and this agent is its
        successor; whether this agent supervises now (its claim stands).

        The claim is published under the fence in force, ``(generation, holder)``: when a newer
        fence came first the claim is void and this agent follows that fence instead.
        """
        if self.liveness is None:
            return False
        # asked every watch tick on every node: the view at the follow pace decides whether a
        # claim may be due, and only then is the log listed to confirm it
        if not self._claim_due(gang, fresh=False) or not self._claim_due(gang, fresh=True):
            return False
        lost = self.supervisor_node(fresh=False)
        claim = SupervisionClaimPayload(
            node=self.node.node, replaces=lost, attempt=attempt,
            reason=f"supervisor {lost} vanished: no liveness beat for {NODE_STALE_S:g} s")
        try:
            self.log.publish_entry(claim, generation=generation, holder=holder)
        except StaleGenerationError:
            return False
        self.view.refresh()  # this agent's own claim: its view knows it supervises now
        print(f"hpcrun agent {self.node.node}: supervisor {lost} lost; claimed supervision",
              file=sys.stderr)
        return self.supervising

    def _claim_due(self, gang: Sequence[str], *, fresh: bool) -> bool:
        supervisor = self.supervisor_node(fresh=fresh)  # lists the log first when fresh
        quarantined = {q.node for q in decoded(self.view.valid, QuarantinePayload)}
        return claim_due(self.node.node, allocation=self.node.nodes, gang=gang,
                         supervisor=supervisor, stale=self._stale(), quarantined=quarantined)

    def live_spares(self, inc: Incarnation) -> tuple[str, ...]:
        """Spare nodes still beating and never quarantined, in allocation order."""
        if self.liveness is None:
            return ()
        quarantined = {q.node for q in decoded(self.view.valid, QuarantinePayload)}
        return usable_spares(self.node.nodes, self._gang(inc), quarantined,
                             stale=self.liveness.stale())

    def _gang(self, inc: Incarnation) -> tuple[str, ...]:
        return inc.gang or self.node.nodes

    # -- node 0 -------------------------------------------------------------------------------
    def conclude(self, inc: Incarnation) -> AgentExit:
        """Decide how ``inc`` ended and act on it (follow, when another agent took over)."""
        if not self.supervising:
            return self.follow(inc)
        obs = self.gather(inc)
        decision = decide(obs, read_record(self.run_dir), self.policy, now=self.clock.now(),
                          rng=self.rng)
        return self.carry_out(inc, decision)

    def gather(self, inc: Incarnation) -> Observations:
        """Wait for every node's exit note or the first fault (bounded by NODE_EXIT_WAIT_S).

        After the first fault, nodes still silent get ``FAULT_SETTLE_S`` to report (with hot
        spares, until a vanished one goes stale): a lost node's ``node_failure`` may land just
        after its peers' collective errors, and it is the cause.

        Raises:
            StaleGenerationError: a newer fence (a cancel, another incarnation) took over.
        """
        deadline = self.clock.monotonic() + NODE_EXIT_WAIT_S
        settle_until: float | None = None
        while True:
            obs = self._observe(inc, timed_out=False)
            if obs.faults and settle_until is None:
                settle_until = self.clock.monotonic() + self._settle_s()
            settled = settle_until is not None and self.clock.monotonic() >= settle_until
            if enough_to_decide(obs, settled=settled):
                return obs
            if self.clock.monotonic() > deadline:
                return self._observe(inc, timed_out=True)
            self.clock.sleep(POLL_S)

    def _settle_s(self) -> float:
        """How long silent nodes get to report after the first fault. With hot spares, long
        enough for a vanished node to go stale: deciding on its peers' collective errors alone
        would restart the gang on the dead node instead of swapping a spare in."""
        if self.liveness is None:
            return FAULT_SETTLE_S
        return max(FAULT_SETTLE_S, NODE_STALE_S + 2 * ALIVE_EVERY_S)

    def _observe(self, inc: Incarnation, *, timed_out: bool) -> Observations:
        self.view.refresh()
        if self.view.fence.generation != inc.generation:
            # Cancelled or superseded: no note of this generation can count any more.
            raise StaleGenerationError(
                f"generation {inc.generation} was fenced out by generation "
                f"{self.view.fence.generation} while its supervisor gathered node exits; "
                "this incarnation stops")
        exits = node_exits(self.view.valid_of(inc.generation, inc.holder, EntryKind.NOTE))
        faults = tuple(GangFault.from_entry(f) for f in gang_faults(
            self.view.valid_of(inc.generation, inc.holder, EntryKind.FAULT)))
        lost = self.vanished(inc)
        return Observations(
            generation=inc.generation, attempt=inc.attempt, nodes=self._gang(inc),
            lost=lost, spares=self.live_spares(inc),
            exits={n: Ending.read(s) for n, s in exits.items()}, faults=faults,
            timed_out=timed_out, waited_s=NODE_EXIT_WAIT_S, stop_requested=self.stop.is_set,
            stop_signum=self.stop.signum, preempt_signal=self.preempt_signal,
            backend=self.node.backend)

    def carry_out(self, inc: Incarnation, decision: Decision) -> AgentExit:
        """Publish what ``decision`` says, requeue if it says so; the agent's exit."""
        match decision:
            case Succeed():
                self._await_tier1(inc)
                self._publish(inc, StatePayload(state=RunState.SUCCEEDED,
                                                reason=decision.reason))
                self._publish(inc, ResultPayload(state=RunState.SUCCEEDED))
                self._ended(inc, EXIT_OK)
                self._release_if_orphaned()
                return AgentExit(status=EXIT_OK)
            case LeaveToSlurm():
                self._record_preempted(inc)
                self._append(inc, RequeueLeftToSlurmNote(detail=decision.reason))
                self.requeuer.outlive()
                return AgentExit(status=EXIT_OK)
            case RestartInAllocation():
                self._publish(inc, StatePayload(state=RunState.RECOVERING,
                                                reason=decision.reason))
                return AgentExit(next_attempt=decision.attempt)
            case SwapSpare() | Shrink():
                # a spare in the lost node's place, or the survivors alone (node ranks dense)
                self._log_fault_once(inc, decision.fault)
                for node in decision.lost:
                    self._append(inc, QuarantinePayload(node=node, reason=decision.reason))
                # the new membership rides on RECOVERING: the next incarnation starts with it
                self._publish(inc, StatePayload(state=RunState.RECOVERING,
                                                reason=decision.reason, nodes=decision.gang))
                return AgentExit(next_attempt=decision.attempt)
            case Fail():
                if decision.preempted:
                    self._record_preempted(inc)
                self._publish(inc, StatePayload(state=RunState.FAILED, reason=decision.reason))
                self._publish(inc, ResultPayload(state=RunState.FAILED, reason=decision.reason))
                self._ended(inc, EXIT_USER_ERROR)
                self._release_if_orphaned()
                return AgentExit(status=EXIT_USER_ERROR)
            case Requeue():
                if decision.preempted:
                    self._record_preempted(inc, segment=decision.segment)
                else:
                    if decision.fault is not None:
                        self._log_fault_once(inc, decision.fault)
                    self._publish(inc, StatePayload(state=RunState.RECOVERING,
                                                    reason=decision.reason))
                    self._salvage(inc, decision.lost)
                return AgentExit(status=self._requeue(inc, decision))

    def _release_if_orphaned(self) -> None:
        """Give the allocation back when supervision was taken over from node 0 on Slurm.

        The batch script ran on the job's first node and died with it: nothing would end the
        job before its time limit. Once the other agents have exited (stopped beating; bounded
        by ``RELEASE_WAIT_S``, so the final run summary and drains are written), end the job.
        """
        if self.node.backend != Backend.SLURM or self.node.is_supervisor or self.liveness is None:
            return
        others = set(self.liveness.nodes)
        deadline = self.clock.monotonic() + RELEASE_WAIT_S
        while not others <= set(self._stale()) and self.clock.monotonic() < deadline:
            self.clock.sleep(POLL_S)
        try:
            done = self.requeuer.release()
        except HpcrunError as exc:  # the run's end stands; the time limit ends the job
            done = f"could not end the job ({exc}); it ends at its time limit"
        print(f"hpcrun agent {self.node.node}: {done}", file=sys.stderr)

    def _log_fault_once(self, inc: Incarnation, fault: GangFault) -> None:
        """Log ``fault`` under ``inc`` unless it is there already (its retry history)."""
        logged = gang_faults(self.view.valid_of(inc.generation, inc.holder, EntryKind.FAULT))
        if not any(f.signature == fault.signature and f.node == fault.node for f in logged):
            self._append(inc, fault.to_entry())

    def _record_preempted(self, inc: Incarnation, *,
                          segment: SegmentNote | None = None) -> None:
        """The checkpoint reaches tier 1 *before* the job ends; then PREEMPTED and its fault,
        or the segment note when the stop committed progress (a segment is not a fault)."""
        self._await_tier1(inc)
        self._publish(inc, StatePayload(state=RunState.PREEMPTED,
                                        reason=preemption.PREEMPTED_REASON))
        self._append(inc, segment if segment is not None
                     else preemption.PREEMPTION_FAULT.to_entry())

    def _requeue(self, inc: Incarnation, decision: Requeue) -> int:
        op_id = f"{inc.run_id}.g{inc.generation}.requeue"
        for node in decision.exclude:
            self._append(inc, QuarantinePayload(node=node, reason=decision.reason))
        self._append(inc, OpPayload(op_id=op_id, action=ActionKind.REQUEUE,
                                    delay_s=decision.delay_s, exclude=tuple(decision.exclude),
                                    reason=decision.reason))
        self._publish(inc, StatePayload(state=RunState.REQUEUED, reason=decision.reason,
                                        op_id=op_id, delay_s=decision.delay_s))
        done = self.requeuer.requeue(delay_s=decision.delay_s, exclude=decision.exclude)
        self._append(inc, RequeueSentNote(op_id=op_id, detail=done))
        if self.requeuer.slurm_requeues:
            # Stay until Slurm ends the job: one that exits during its preemption's grace
            # time completes, and Slurm never requeues it.
            self.requeuer.outlive()
        return preemption.requeued_exit(self.node.backend)

    def _salvage(self, inc: Incarnation, lost: tuple[str, ...]) -> None:
        """Before a requeue that lost nodes: ask every surviving node to drain its share of the
        newest tier-0 checkpoint and the partner copies it holds of the lost nodes' shards
        (:class:`~hpcrun.control.entries.SalvageNote`, followed in :meth:`follow`), do the same
        here, and commit it on tier 1 once whole, within the tier-1 wait."""
        if not lost or self.node.node_local_root is None:
            return
        self._append(inc, SalvageNote(lost=lost))
        self._await_tier1(inc, lost=lost)

    def _await_tier1(self, inc: Incarnation, *, lost: tuple[str, ...] = (),
                     commit_tier1: bool = True) -> None:
        """Drain until the newest tier-0 commit is committed on tier 1, for as long as its
        remaining bytes take at the run's measured drain rate (:func:`~hpcrun.checkpoint.
        drain.drain_wait_s`: twice that, at least 10 s, at most :data:`TIER1_WAIT_S`, and
        within :meth:`time_left` after a stop). ``lost``: nodes whose partner copies held here
        are drained too; ``commit_tier1``: whether this node appends the tier-1 commit (the
        supervisor; a follower salvaging only drains)."""
        if self.node.node_local_root is None:
            return
        from hpcrun.checkpoint.drain import (
            DrainRound,
            drain_rate,
            drain_to_tier1,
            drain_wait_s,
            pending_bytes,
        )
        from hpcrun.checkpoint.tiers import fold_checkpoints

        # the supervisor commits on tier 1, whichever node of the allocation it runs on
        target = dataclasses.replace(self._drain(inc), supervisor=commit_tier1).within(
            self.time_left())
        self.view.refresh()
        budget = drain_wait_s(pending_bytes(fold_checkpoints(self.view.valid)),
                              drain_rate(self.view.valid), cap_s=self.time_left())
        deadline = self.clock.monotonic() + budget
        while True:
            drain_to_tier1(target, self.log, DrainRound.FINAL, lost=lost)
            self.view.refresh()
            commits = decoded(self.view.valid, CommitPayload)
            local = [c.ckpt_id for c in commits if c.tier == Tier.NODE_LOCAL]
            shared = {c.ckpt_id for c in commits if c.tier == Tier.SHARED}
            if not local or local[-1] in shared or self.clock.monotonic() >= deadline:
                return
            self.clock.sleep(0.5)

    def time_left(self) -> float:
        """How long the end of an incarnation may still drain: :data:`TIER1_WAIT_S`, and after
        a stop signal the grace that is left of it (the site's preemption lead) less
        :data:`REQUEUE_MARGIN_S`, so a drain never holds a preemption past its grace."""
        at = self.stop.set_at
        if at is None:
            return TIER1_WAIT_S
        left = self.grace_s - (self.clock.monotonic() - at) - REQUEUE_MARGIN_S
        return max(0.0, min(TIER1_WAIT_S, left))

    # -- a job start after Slurm requeued the job ---------------------------------------------
    def record_slurm_requeue(self, generation: int, holder: str) -> None:
        """Record why Slurm requeued the job when the last incarnation could not say.

        A lost node (NODE_FAIL) or a job Slurm preempted before any agent saw the signal is
        requeued by Slurm itself, and the gang that was running never logged a decision: the
        fault and the REQUEUED state are recorded here, from Slurm's account of that run.
        """
        self.view.refresh()
        if not requeue_unrecorded(self.view.state()):
            return
        account = account_for_requeue(
            self.requeuer.previous_run(), job_id=self.node.job_id,
            restart_count=self.node.restart_count, last_step=self.view.last_step())
        if account is None:
            return  # no account of it (local backend, no accounting): the record infers it
        # Unfenced, like the login node's record of what Slurm did: under this generation it
        # would read as a fault of the gang now starting, and stop it.
        self.log.append_entry(account.fault.to_entry(), generation=UNFENCED, holder="")
        self.log.publish_entry(StatePayload(state=RunState.REQUEUED, reason=account.reason,
                                            decided_at=account.decided_at),
                               generation=generation, holder=holder)

    # -- other nodes ----------------------------------------------------------------------------
    def follow(self, inc: Incarnation, *, wait_s: float | None = FOLLOW_WAIT_S) -> AgentExit:
        """Wait for the supervisor's decision about ``inc`` and follow it.

        Args:
            inc: the incarnation whose end to follow.
            wait_s: how long to wait for the decision; None waits for as long as the run goes
                on (a hot spare idles through the whole incarnation).
        """
        deadline = None if wait_s is None else self.clock.monotonic() + wait_s
        salvaged = False
        while deadline is None or self.clock.monotonic() < deadline:
            self.view.refresh()
            if self.view.fence.generation != inc.generation:
                return rejoin(self.view, self.node, inc)
            lost = self._salvage_asked(inc)
            if lost and not salvaged:
                salvaged = True
                self._await_tier1(inc, lost=lost, commit_tier1=False)
                continue
            states = self.view.valid_of(inc.generation, inc.holder, EntryKind.STATE)
            last = next((p.state.value for p in decoded(states[-1:], StatePayload)), "")
            if last in TERMINAL_STATES:
                return AgentExit(status=EXIT_OK if last == RunState.SUCCEEDED
                                 else EXIT_USER_ERROR)
            if last == RunState.REQUEUED:
                return AgentExit(status=preemption.requeued_exit(self.node.backend))
            if self.take_over_if_lost(self._gang(inc), generation=inc.generation,
                                      holder=inc.holder, attempt=inc.attempt):
                return self._conclude_taken_over(inc, last)
            self.clock.sleep(POLL_S)
        return AgentExit(status=EXIT_USER_ERROR)

    def _salvage_asked(self, inc: Incarnation) -> tuple[str, ...]:
        """The lost nodes the supervisor of ``inc`` asked the survivors to salvage, if it did."""
        asked = decoded(self.view.valid_of(inc.generation, inc.holder, EntryKind.NOTE),
                        SalvageNote)
        return asked[-1].lost if asked else ()

    def _conclude_taken_over(self, inc: Incarnation, last_state: str) -> AgentExit:
        """This agent took over supervising ``inc``: decide how it ended, unless the lost
        supervisor had decided a restart already (RECOVERING) and died before fencing it;
        then start that restart (the next incarnation's gang is the one RECOVERING named)."""
        if last_state == RunState.RECOVERING:
            return AgentExit(next_attempt=inc.attempt + 1)
        return self.conclude(inc)

    # -- log ------------------------------------------------------------------------------------
    def _publish(self, inc: Incarnation, payload: EntryPayload) -> None:
        self.log.publish_entry(payload, generation=inc.generation, holder=inc.holder)

    def _ended(self, inc: Incarnation, status: int) -> None:
        """The run has ended: the job's exit ``status`` for its batch shell
        (:func:`~hpcrun.launch.sbatch.job_exit_lines`), then the post-run manifest, published
        under ``inc``'s fence (both best effort)."""
        if self.node.backend == Backend.SLURM:
            try:
                LOCAL_STORAGE.write_atomic(job_exit_path(self.run_dir, self.node.job_id),
                                            f"{status}\n".encode())
            except StorageError as exc:  # the job then ends with its step's own status
                print(f"hpcrun agent {self.node.node}: {exc}", file=sys.stderr)
        publish_ending(self.on_end, self.log, generation=inc.generation, holder=inc.holder)

    def _append(self, inc: Incarnation, payload: EntryPayload) -> None:
        self.log.append_entry(payload, generation=inc.generation, holder=inc.holder)
