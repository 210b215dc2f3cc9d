"""The rank watch: what a node's agent does while its ranks run, one poll at a time.

An incarnation's ranks are started (``node/gang.py``); until they all end, one fails, or the run
moves on, the agent polls every :data:`POLL_S`, in this order:

1. **Budget.** Past the run's wall/node-hour budget the stop flag is set as a preemption signal
   would set it (``node/budget_watch.py``).
2. **Rank exits.** A rank that neither succeeded nor stopped for a preemption is a failure: the
   cause is logged as one FAULT, echoes as a ``peer_lost`` note (``node/faultlog.py``), and the
   watch ends :attr:`Watched.FAILED`.
3. **Relay.** A pending stop is said to the ranks again until they end
   (``preemption.py``'s :class:`~hpcrun.runtime.preemption.Relay`, step 2 of a preemption).
4. **Script grace.** A script run's ranks had their time to save after a stop: past it they are
   killed with the short fault grace.
5. **Observe.** Heartbeats and events are folded into the node's files
   (``node/observations.py``). In a ``shared-fs-stall`` drill, once the node's ranks began
   the stall (their node-local mark), the agent stalls its own shared-tier operations too
   (``sharedtier.py``'s :func:`~hpcrun.runtime.sharedtier.arm_from_mark`).
6. **Warm refill.** Once every rank finished a step, the next incarnation's warm processes are
   started, off this one's critical path (``rank/warm.py``).
7. **The run moved on.** A newer fence, a terminal state, another node's fault or a vanished
   node ends the watch (the supervisor's judgement, passed in as ``moved_on``:
   :meth:`hpcrun.runtime.supervise.supervisor.Supervisor.moved_on`).
8. **Hang.** A rank whose step stopped advancing is dumped, killed and logged as ``hang``
   (``node/hangwatch.py``): :attr:`Watched.FAILED`.
9. **Done.** No rank left running: :attr:`Watched.DONE`. On the way out the node's observer
   takes its last look, where its ranks got to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import SpecError
from hpcrun.launch.signals import StopFlag
from hpcrun.runtime import faults, preemption
from hpcrun.runtime.incarnation import AgentExit, Incarnation
from hpcrun.runtime.node.budget_watch import BudgetWatch
from hpcrun.runtime.node.faultlog import FaultLog
from hpcrun.runtime.node.gang import RankGang
from hpcrun.runtime.node.hangwatch import hang_watch
from hpcrun.runtime.rank import script
from hpcrun.runtime.rank.warm import all_stepped
from hpcrun.runtime.sharedtier import arm_from_mark

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.site import SiteConfig
    from hpcrun.runtime.node.observations import NodeObserver
    from hpcrun.runtime.rank.warm import WarmPool

__all__ = ["FAULT_KILL_GRACE_S", "POLL_S", "MovedOn", "RankWatch", "Watched"]

POLL_S = 0.2
FAULT_KILL_GRACE_S = 0.5
"""SIGTERM grace for the ranks of a gang that already failed: they can commit nothing (their
next collective has lost a peer), so only exits already under way are waited for."""


class Watched(StrEnum):
    """How watching this node's ranks ended (when the run did not move on)."""

    DONE = "done"                # every rank ended (succeeded or stopped)
    FAILED = "failed"            # a rank here failed or hung
    PEER_FAILED = "peer_failed"  # another node logged a gang fault (node 0 only)


MovedOn = Callable[[Incarnation], "Watched | AgentExit | None"]
"""Step 7's question: has the run moved on from this incarnation, and how this node ends if so."""


class RankWatch:
    """One agent's watch over its node's ranks. Constructed with its parts; :meth:`watch`
    runs one incarnation's watch."""

    def __init__(self, *, run_dir: Path, node: str, spec: RunSpec, site: SiteConfig,
                 stop: StopFlag, rank_signal: int, faults: FaultLog, warm: WarmPool | None,
                 environ: Mapping[str, str], clock: Clock = SYSTEM_CLOCK) -> None:
        self.run_dir = run_dir
        self.node = node
        self.spec = spec
        self.site = site
        self.stop = stop
        self.rank_signal = rank_signal
        self.faults = faults
        self.warm = warm
        self.environ = environ
        self.clock = clock

    def watch(self, inc: Incarnation, gang: RankGang, obs: NodeObserver,
              moved_on: MovedOn) -> Watched | AgentExit:
        """Watch ``inc``'s ranks until they all end, one fails, or the run moves on."""
        hang = hang_watch(inc, gang, spec=self.spec, environ=self.environ, node=self.node,
                          clock=self.clock,
                          record_fault=lambda payload: self.faults.append(inc, payload))
        try:
            return self._poll_until_ended(inc, gang, obs, hang, moved_on)
        finally:
            obs.poll(force=True)  # 9. the node's last word: where its ranks got to

    def _stall_relay(self, inc: Incarnation) -> Callable[[], None]:
        """Step 5's drill part: arm this agent's shared-tier stall once its ranks began one (a
        no-op unless an ``fsstall`` is scheduled for this incarnation)."""
        try:
            scheduled = [i for i in faults.parse_injections(self.environ.get("HPCRUN_INJECT", ""))
                         if i.kind == faults.FaultKind.FSSTALL and
                         (i.every or (inc.restart_count, inc.attempt) == (i.restart, 0))]
        except SpecError:
            scheduled = []  # the ranks refuse a malformed schedule and say so
        armed: list[bool] = []

        def tick() -> None:
            if scheduled and not armed and arm_from_mark(inc):
                armed.append(True)

        return tick

    def _poll_until_ended(self, inc: Incarnation, gang: RankGang, obs: NodeObserver,
                          hang: Callable[[], bool], moved_on: MovedOn) -> Watched | AgentExit:
        relay = preemption.Relay(self.stop, self.rank_signal, clock=self.clock)
        grace = script.Grace(script.grace_s(self.site))
        budget = BudgetWatch.start(self.run_dir, self.spec, clock=self.clock)
        started, refilled = self.clock.now(), self.warm is None
        stall = self._stall_relay(inc)
        while True:
            budget.check(self.stop)  # 1.
            failed = [e for e in gang.poll() if not (e.succeeded or e.preempted)]
            if failed:  # 2.
                self.faults.rank_failures(inc, failed)
                return Watched.FAILED
            relay.tick(gang.signal)  # 3.
            if self.spec.script_mode and grace.expired(stopping=self.stop.is_set,
                                                       now=self.clock.monotonic()):
                gang.kill(grace_s=FAULT_KILL_GRACE_S)  # 4. the script had its time to save
            obs.poll()  # 5.
            stall()
            if not refilled and all_stepped(inc, gang.ranks, started):
                refilled = True  # 6.
                assert self.warm is not None
                self.warm.fill()
            moved = moved_on(inc)  # 7.
            if moved is not None:
                return moved
            if hang():  # 8.
                return Watched.FAILED
            if not gang.pending:  # 9.
                return Watched.DONE
            self.clock.sleep(POLL_S)
