"""Preemption, from the signal to the requeue: the whole path, in the order it happens.

1. **Signal → flag.** Slurm (or ``hpcrun signal``) sends the site's preemption signal (SIGUSR1
   by default) to the agents and ranks; a time limit or scancel sends SIGTERM. A handler only
   sets a :class:`~hpcrun.launch.signals.StopFlag`: :func:`agent_stop_signals` in each agent,
   :func:`rank_stop_signals` in each rank (``worker.py``).
2. **Agent relay.** An agent says it again to its ranks every ``RELAY_EVERY_S`` until they stop
   (:class:`Relay`, driven by the rank watch, ``node/rankwatch.py``): a rank still starting up
   ignores it.
3. **Per-step agreement in the rank.** At each step boundary every rank joins one tiny
   sum of its flag, its "checkpoint due" vote and its tokens (:func:`agree_at_boundary`,
   called by ``context.py``; log2 n rounds on the host, ``launch/hostsum.py``); if any rank
   was signalled, all stop at the same step.
4. **Stop commit.** The ranks commit a checkpoint at that boundary (``Context._commit_and_stop``)
   and exit ``EXIT_PREEMPTED`` (:func:`rank_ending`); late signals are then ignored
   (:func:`ignore_late_signals`). Each agent drains its node's shards and notes ``preempted``.
5. **The supervisor's decision.** :func:`hpcrun.runtime.supervise.decide.decide` sends a stopped
   gang to :func:`decide_after_stop`: a SIGTERM from Slurm is :class:`LeaveToSlurm`; otherwise the
   preemption goes through the retry rules to ``Requeue(preempted=True)`` (or ``Fail`` when the
   requeue budget is spent). The shell (``supervisor.py``) waits for the tier-1 commit, records
   PREEMPTED and the preemption fault, then REQUEUED.
6. **Requeue.** ``requeue.py``'s requeuer puts the job back once: on Slurm ``scontrol
   requeuehold`` → update → release, inside :func:`sigterm_ignored`, unless Slurm is already
   requeueing it (never twice); on the local backend the agent exits with
   :func:`requeued_exit`'s status and the launcher starts the next allocation.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.retry import FaultClass
from hpcrun.launch.signals import StopFlag, holding, stop_on, take_held
from hpcrun.runtime.incarnation import EXIT_OK, EXIT_PREEMPTED, Ending
from hpcrun.runtime.supervise.decisions import (
    DecisionPolicy,
    Fail,
    GangFault,
    LeaveToSlurm,
    Observations,
    Requeue,
    RestartInAllocation,
    Shrink,
    SwapSpare,
    retry_decision,
)
from hpcrun.vocab import Backend

if TYPE_CHECKING:
    from hpcrun.control.record import RunRecord

# -- 1. signal → flag ---------------------------------------------------------------------------


@contextmanager
def agent_stop_signals(preempt_signal: int, flag: StopFlag) -> Iterator[StopFlag]:
    """Within the block the preemption signal and SIGTERM only set ``flag``.

    Outside it (before, and after it while the agent exits) a late preemption signal must not
    take its default action: it would kill an agent whose run has already ended, and Slurm would
    mark a finished job FAILED. The agent's process holds both signals from its first
    instruction (``python -m hpcrun.runtime``): what came before the block sets ``flag`` when it
    starts, and what comes after it is only held. An agent started otherwise ignores the
    preemption signal outside the block.
    """
    if not holding(preempt_signal):
        signal.signal(preempt_signal, signal.SIG_IGN)
    with stop_on([preempt_signal, signal.SIGTERM], flag):
        early = take_held()
        if early is not None:
            flag.set(early)
        yield flag


@contextmanager
def rank_stop_signals(preempt_signal: int, flag: StopFlag) -> Iterator[StopFlag]:
    """Within the block (the whole life of a rank) the preemption signal and SIGTERM only set
    ``flag``; the handler is in place before anything slow (process group, restore) happens."""
    with stop_on([preempt_signal, signal.SIGTERM], flag):
        yield flag


def ignore_late_signals(preempt_signal: int) -> None:
    """After the stop commit: Slurm may deliver the signal to every process of the step and
    the agent relays it again; neither must kill a rank that is exiting."""
    signal.signal(preempt_signal, signal.SIG_IGN)


# -- 2. agent relay -----------------------------------------------------------------------------

RELAY_EVERY_S = 2.0
"""A rank still starting up ignores the signal (its handler is not installed yet): say it again."""


class Relay:
    """Passes a stop on to this node's ranks, again every ``every_s`` until they end."""

    def __init__(self, flag: StopFlag, preempt_signal: int, *, clock: Clock = SYSTEM_CLOCK,
                 every_s: float = RELAY_EVERY_S) -> None:
        self._flag = flag
        self._signal = preempt_signal
        self._clock = clock
        self._every_s = every_s
        self._sent_at: float | None = None

    def tick(self, send: Callable[[int], None]) -> bool:
        """Send the preemption signal through ``send`` when a stop is pending and the last
        relay is older than ``every_s``; return whether it sent."""
        now = self._clock.monotonic()
        if not self._flag.is_set or (self._sent_at is not None
                                     and now - self._sent_at <= self._every_s):
            return False
        send(self._signal)
        self._sent_at = now
        return True


# -- 3. per-step agreement in the rank ----------------------------------------------------------


def agree_at_boundary(flag: StopFlag, *, due: bool, tokens: int, suspect: bool = False,
                      group: Any = None) -> tuple[bool, bool, int, bool]:
    """(stop, checkpoint due, the gang's tokens, any rank's step suspect): the same on every
    rank, one all-reduce.

    Collective: every rank calls it at the same step boundary. A stop, a save or the replay of
    a suspect step (:mod:`hpcrun.runtime.rank.sdc_guard`) is a collective, so the ranks must agree
    on each, or one would wait forever.
    """
    stop, save, summed, odd = agree_sum([int(flag.is_set), int(due), int(tokens), int(suspect)],
                                        group=group)
    return stop > 0, save > 0, summed, odd > 0


def agree_sum(values: Sequence[int], *, group: Any = None) -> list[int]:
    """Each value summed over the ranks of ``group``, all in one collective (int64): on gloo
    by recursive doubling (:func:`~hpcrun.launch.hostsum.tree_sum`: log2 n rounds, where
    gloo's all-reduce is a ring of 2 (n - 1) hops), otherwise one all-reduce.

    Collective: every rank calls it at the same point with the same number of values. Without
    an initialised process group the values come back unchanged.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [int(v) for v in values]
    backend = str(dist.get_backend(group)).lower()
    if backend == "gloo":
        from hpcrun.launch.hostsum import tree_sum

        return tree_sum(values, group=group)
    import torch

    device = _collective_device(backend)
    tally = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(tally, op=dist.ReduceOp.SUM, group=group)
    return [int(x) for x in tally.tolist()]


def _collective_device(backend: str) -> Any:
    import torch

    if str(backend).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# -- 4. stop commit -----------------------------------------------------------------------------


def rank_ending(stopped: bool) -> tuple[int, Ending]:
    """A rank's exit status and report status after ``main(ctx)`` returned: a rank that
    stopped at an agreed boundary (and committed there) exits EXIT_PREEMPTED."""
    return (EXIT_PREEMPTED, Ending.PREEMPTED) if stopped else (EXIT_OK, Ending.SUCCEEDED)


# -- 5. the supervisor's decision ---------------------------------------------------------------

PREEMPTION_FAULT = GangFault(fault=FaultClass.PREEMPTION, signature="preemption",
                             detail="preemption or time-limit signal")
"""The fault a preempted incarnation records (its class has its own retry budget)."""

PREEMPTED_REASON = "stopped at a step boundary after a preemption signal and committed"
"""The PREEMPTED state's reason."""


def slurm_is_ending(obs: Observations) -> bool:
    """Whether the stop came from SIGTERM: Slurm itself is ending the allocation (scancel, a
    preemption's grace period, the time limit) instead of warning with the preemption signal."""
    return (obs.backend == Backend.SLURM and obs.stop_signum == signal.SIGTERM
            and obs.preempt_signal != signal.SIGTERM)


def decide_after_stop(obs: Observations, record: RunRecord, policy: DecisionPolicy, *,
                      now: float, rng: random.Random | None) -> Requeue | Fail | LeaveToSlurm:
    """The gang stopped for a preemption (or a stop is pending): restarting inside this
    allocation is pointless, so the run commits what it has and requeues; the newest committed
    checkpoint is the restore point. Pure but for ``rng``'s state."""
    if slurm_is_ending(obs):
        return LeaveToSlurm()
    decision = retry_decision(obs, record, PREEMPTION_FAULT, policy, now=now, rng=rng,
                              preempted=True)
    assert not isinstance(decision, RestartInAllocation | SwapSpare | Shrink), \
        "a preempted gang never restarts"
    return decision


# -- 6. requeue ---------------------------------------------------------------------------------


@contextmanager
def sigterm_ignored() -> Iterator[None]:
    """``scontrol requeuehold`` makes Slurm kill this job's processes: the agent ignores
    SIGTERM for the few milliseconds the hold, update and release take."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def requeued_exit(backend: Backend) -> int:
    """How an agent exits after a requeue: on the local backend EXIT_PREEMPTED tells the
    launcher to start the next allocation; on Slurm the job simply ends (Slurm restarts it)."""
    return EXIT_PREEMPTED if backend == Backend.LOCAL else EXIT_OK
