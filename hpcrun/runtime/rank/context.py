"""The object a training ``main(ctx)`` receives.

A training script builds its model, optimizer and loader, then::

    start = ctx.restore(model=model, optim=optim, data=loader)
    for step in ctx.steps(total):
        batch = next(loader)
        loss = ctx.run_step(train_one_step, batch)  # or train_one_step(batch): no replay
        ctx.step_done(tokens=n_tokens, loss=loss)

hpcrun does the rest at step boundaries: heartbeats, events, checkpoint cadence and commits, the
stop agreement after a preemption signal (one tiny all-reduce per step), the replica agreement
check against silent data corruption (:mod:`hpcrun.runtime.rank.sdc_guard`), and a final commit.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import InitFromNote, KnownGoodNote, StatePayload
from hpcrun.control.log import RunLog
from hpcrun.control.notes import DdpRebuildsNote, NoRestoreNote
from hpcrun.control.states import RunState
from hpcrun.errors import HpcrunError, NonFiniteError
from hpcrun.observe.events import EventKind
from hpcrun.runtime import faults, preemption
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.rank.sdc_guard import SdcGuard
from hpcrun.vocab import ResumeContract, Tier

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from hpcrun.checkpoint.cadence import CadenceTimer
    from hpcrun.checkpoint.checkpointer import Checkpointer
    from hpcrun.checkpoint.state import SaveResult
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.signals import StopFlag
    from hpcrun.observe.events import EventWriter


class Heartbeat(Protocol):
    """Tells this rank's agent how far the rank got (a node-local heartbeat file)."""

    def __call__(self, *, step: int, step_time_s: float) -> object: ...


@dataclass(kw_only=True, slots=True)
class _Progress:
    step: int = 0
    tokens: int = 0
    """Tokens of the whole gang through the last agreed step boundary."""
    my_tokens: int = 0
    """This rank's tokens since that boundary."""
    restored_step: int = 0
    restored_tier: Tier | None = None
    committed_step: int = -1
    committed_id: str | None = None
    """Newest checkpoint this rank saw committed."""
    known_good_id: str | None = None
    """Newest checkpoint marked known-good by this incarnation."""
    checked_step: int = -1
    """Step of the last replica check that passed."""
    step_started: float = 0.0
    validated: bool = False
    unrestored_noted: bool = False
    """Whether this incarnation already warned that no state is registered."""
    in_step: bool = False
    input_wait_s: float | None = None
    """Input wait timed by ``ctx.input_wait()`` during the current step (None: none timed)."""


class Context:
    """Implements :class:`hpcrun.protocols.RunContext` for one rank."""

    def __init__(self, *, env: DistEnv, incarnation: Incarnation, spec: RunSpec, log: RunLog,
                 checkpointer: Checkpointer, cadence: Callable[[int], CadenceTimer],
                 events: EventWriter, stop: StopFlag, heartbeat: Heartbeat,
                 device: torch.device, group: ProcessGroup | None = None,
                 preempt_signal: int = 10, injections: tuple[faults.Injection, ...] = (),
                 clock: Clock = SYSTEM_CLOCK, announce_running: bool = True,
                 probe: Callable[[int], None] | None = None) -> None:
        """``announce_running=False``: the agent already logged RUNNING (a script run's ranks
        started), so the first step does not log it again. ``probe``: ``hpcrun preflight``'s
        registration probe; once :meth:`restore` registered the state, the context is closed
        and ``probe(step)`` ends the rank cleanly (it does not return)."""
        self.rank: int = env.rank
        self.local_rank: int = env.local_rank
        self.node_rank: int = env.node_rank
        self.world_size: int = env.world_size
        self.generation: int = incarnation.generation
        self.inc = incarnation
        self._spec = spec
        self._log = log
        self._ckpt = checkpointer
        self._new_cadence = cadence
        self._cadence = cadence(0)
        self._events = events
        self._stop = stop
        self._heartbeat = heartbeat
        self._device = device
        self._group = group
        self._preempt_signal = preempt_signal
        self._injections = injections
        self._clock = clock
        self._probe = probe
        self._state: dict[str, Any] = {}
        self._restored = False
        self._p = _Progress(validated=not announce_running)
        self.stopped = False
        self._sdc = SdcGuard(policy=spec.sdc, rank=env.rank, node=incarnation.node,
                             world_size=env.world_size, log=log, incarnation=incarnation,
                             events=events, clock=clock, device=device, group=group)

    # -- RunContext API ---------------------------------------------------------------------
    @property
    def device(self) -> Any:
        return self._device

    @property
    def spec(self) -> Any:
        return self._spec

    @property
    def config(self) -> Mapping[str, Any]:
        return self._spec.config

    @property
    def step(self) -> int:
        """Number of optimizer steps completed (the next step's index)."""
        return self._p.step

    @property
    def restored(self) -> bool:
        """Whether :meth:`restore` registered state (else no checkpoint is ever committed)."""
        return self._restored

    def register(self, **state: Any) -> None:
        """Register ``state`` for the commits that follow without loading anything (a state
        handed over at the end, ``hpcrun.lite.save(state)``)."""
        self._state = dict(state)

    def restore(self, *, init_from: Any = None, **state: Any) -> int:
        """Register ``state`` for checkpoints and load the newest committed checkpoint into it.

        While the run has no committed checkpoint of its own, ``init_from`` (else the spec's
        ``checkpoint.init_from``), a DCP directory or Hugging Face safetensors, is loaded into
        the registered model (and, from DCP, optimizer) instead, and the run log notes it with
        its digest (:mod:`hpcrun.checkpoint.initfrom`); once the run commits, it is never read
        again. Collective.

        Args:
            init_from: a path (``str`` or ``os.PathLike``) or None (typed loosely so that
                ``restore(**states)`` with a mapping of states type-checks).
        """
        self._state = dict(state)
        self._restored = True
        with self._events.span("restore", self._p.step):
            result = self._ckpt.restore(self._state)
        if result is not None:
            self._p.step = self._p.restored_step = self._p.committed_step = int(result.step)
            self._p.tokens = int((result.extra or {}).get("tokens", 0))
            self._p.restored_tier = result.tier
            self._events.emit("restored", self._p.step, ckpt_id=result.ckpt_id, tier=result.tier,
                              bytes_read=result.bytes_read, files_read=result.files_read,
                              peer_bytes=result.peer_bytes, **result.phases)
        elif (source := init_from or self._spec.checkpoint.init_from) is not None:
            self._init_from(os.fspath(source))
        self._cadence = self._new_cadence(self._p.step)
        self._sdc.start(self._state)
        self._note_rebuilding_ddp()
        if self._probe is not None:
            self._events.emit(EventKind.REGISTERED, self._p.step, families=sorted(self._state))
            self.close()
            self._probe(self._p.step)
        return self._p.step

    def _note_rebuilding_ddp(self) -> None:
        """Under ``data.contract: bitwise``, rank 0 notes a registered DDP that rebuilds its
        buckets (status shows it): a resume on 3+ ranks could not reproduce the bits."""
        if self.rank != 0 or self._spec.data.contract != ResumeContract.BITWISE:
            return
        modules = rebuilding_ddp(self._state)
        if modules:
            self._log.publish_entry(DdpRebuildsNote(modules=modules),
                                    generation=self.generation, holder=self.inc.holder)

    def run_step(self, fn: Callable[[Any], Any], batch: Any) -> Any:
        """Run one training step ``fn(batch)`` and return what it returns (the loss).

        ``fn`` does the whole optimizer step on the registered state (forward, backward,
        optimizer step) from ``batch`` alone, deterministically, without other side effects.
        Registered this way, a step that looks corrupted (replicas disagree, or a non-finite or
        spiking loss) can be replayed from the last checked state with the same inputs, which
        tells a faulty device from bad data (``sdc`` in the spec, docs/recovery.md).
        """
        return self._sdc.run_step(fn, batch, self._p.step)

    @property
    def skipped_steps(self) -> tuple[tuple[int, str], ...]:
        """(step, batch) of every step whose update ``sdc.policy: skip_batch`` dropped in this
        incarnation (``step`` counts completed steps: the loop's index + 1), for a sample
        ledger to record."""
        return tuple(self._sdc.skipped)

    def set_replica_groups(self, groups: Sequence[Sequence[int]] | None) -> None:
        """Which ranks hold the same parameters (None: every rank, as in DDP). With sharded
        data parallelism, each group is the ranks holding the same shard."""
        from hpcrun.runtime.rank.sdc import replica_groups

        self._sdc.groups = replica_groups(self.world_size, groups)

    def steps(self, total: int) -> Iterator[int]:
        """Yield step indices up to ``total``; end early (after a commit) when a stop is agreed."""
        while self._p.step < total:
            if self.boundary():
                return
            yield self._p.step
            if self._p.in_step:
                raise HpcrunError(
                    f"step {self._p.step} ended without ctx.step_done(); call ctx.step_done() "
                    "after each optimizer step so hpcrun can track progress and checkpoint"
                )
        self.finish()

    def boundary(self) -> bool:
        """One step boundary (what :meth:`steps` does before each step; ``hpcrun.lite`` calls
        it from a script's own loop): the ranks agree on a stop and a due checkpoint, save when
        due, and start timing the next step. True when they agreed to stop: the stop commit is
        then done and the loop must end.

        Collective: every rank calls it at the same boundary.
        """
        stop, due, suspect = self._agree()
        self._check_replicas(suspect=suspect)
        if stop:
            self._commit_and_stop()
            return True
        if due:
            self._save(blocking=False)
        self._p.step_started = self._clock.monotonic()
        self._p.in_step = True
        return False

    def finish(self) -> None:
        """The end of training (what :meth:`steps` does after the last step): count the last
        step's tokens and commit the final state. Collective."""
        self._final_commit()

    def step_done(self, *, tokens: int = 0, loss: float | None = None,
                  input_wait_s: float | None = None, **metrics: float) -> None:
        """Report the optimizer step as done: heartbeat, events, progress.

        ``input_wait_s``: how long the step waited for its batch. When omitted, the wait
        measured by the registered loaders (``take_input_wait()``, e.g. a DataPipeline passed
        to :meth:`restore`) and by ``with ctx.input_wait():`` blocks is used.

        The checkpoint the cadence asks for is taken at the next step boundary, after the
        ranks agree on it (:meth:`steps`), before the next step consumes data.
        """
        self._p.in_step = False
        self._p.step += 1
        self._p.my_tokens += int(tokens)
        self._fire_injections(slow=True)  # a slowed rank is slow inside its measured step
        dur = self._clock.monotonic() - self._p.step_started
        wait = self._take_input_wait() if input_wait_s is None else float(input_wait_s)
        suspect = self._sdc.observe_loss(loss, self._p.step) if loss is not None else ""
        if loss is not None and not math.isfinite(loss) and not self._sdc.suspect:
            raise NonFiniteError(
                f"loss is {loss} at step {self._p.step}; refusing to continue or checkpoint. "
                "Lower the learning rate or enable gradient clipping, then resume"
            )
        finite = loss if loss is None or math.isfinite(loss) else None  # JSON has no NaN
        self._events.emit("step", self._p.step, dur_s=dur, tokens=tokens, loss=finite,
                          input_wait_s=wait, **({"sdc_suspect": suspect} if suspect else {}),
                          **metrics)
        self._heartbeat(step=self._p.step, step_time_s=dur)
        self._cadence.observe_step(self._p.step, dur)
        self._finish_async(self._ckpt.poll())
        self._note_if_unrestored()
        self._validate_once()
        self._fire_injections(slow=False)

    @contextmanager
    def input_wait(self) -> Iterator[None]:
        """Count the time inside the block as the current step's input wait.

        For a loader hpcrun does not know: ``with ctx.input_wait(): batch = next(it)``.
        """
        t0 = self._clock.monotonic()
        try:
            yield
        finally:
            self._p.input_wait_s = (self._p.input_wait_s or 0.0) + self._clock.monotonic() - t0

    # -- internals --------------------------------------------------------------------------
    def _take_input_wait(self) -> float | None:
        """The step's input wait from ``input_wait()`` blocks and registered loaders, once."""
        timed, self._p.input_wait_s = self._p.input_wait_s, None
        sources = [take for obj in self._state.values()
                   if callable(take := getattr(obj, "take_input_wait", None))]
        if timed is None and not sources:
            return None
        return (timed or 0.0) + sum(float(take()) for take in sources)

    def _agree(self) -> tuple[bool, bool, bool]:
        """(stop, checkpoint due, a rank's last step suspect), the same on every rank: one tiny
        all-reduce per step.

        A time-based cadence (every_seconds, Young) reads each rank's own clock; a save is a
        collective, so the ranks must agree on it as on a stop, or one would wait forever. The
        same all-reduce sums the tokens the ranks consumed since the last boundary.
        """
        due = self._p.step > 0 and self._cadence.due(self._p.step, self._clock.monotonic())
        with self._events.span("collective", self._p.step, what="stop_agreement"):
            stop, due, tokens, suspect = preemption.agree_at_boundary(
                self._stop, due=due, tokens=self._p.my_tokens, suspect=bool(self._sdc.suspect),
                group=self._group)
        self._count_tokens(tokens)
        return stop, due, suspect

    def _check_replicas(self, *, suspect: bool = False, force: bool = False) -> None:
        """The replica agreement check when due (COLLECTIVE then); a pass makes the newest
        committed checkpoint known-good. A failed check ends the rank (an sdc fault) or, under
        ``sdc.policy: skip_batch``, drops a suspect step's update."""
        if self._sdc.at_boundary(self._p.step, suspect=suspect, force=force):
            self._p.checked_step = self._p.step
            self._mark_known_good()

    def _mark_known_good(self) -> None:
        """Rank 0 marks the newest committed checkpoint known-good once a replica check at or
        after its step passed (an asynchronous commit may land after that check: the state it
        captured was already verified)."""
        committed = self._p.committed_id
        if (self.rank != 0 or committed is None or committed == self._p.known_good_id
                or self._p.committed_step > self._p.checked_step):
            return
        self._p.known_good_id = committed
        self._log.publish_entry(
            KnownGoodNote(ckpt_id=committed, step=self._p.committed_step,
                          checked_step=self._p.step),
            generation=self.generation, holder=self.inc.holder)

    def _count_tokens(self, gang_tokens: int) -> None:
        self._p.tokens += gang_tokens
        self._p.my_tokens = 0

    def _extra(self) -> dict[str, Any]:
        from hpcrun.checkpoint.initfrom import param_names

        # the optimizers' parameter names let an export key their state by name
        names = param_names(self._state)
        return {"tokens": self._p.tokens, **({"param_names": names} if names else {})}

    def _init_from(self, source: str) -> None:
        """Load the outside checkpoint ``source`` into the registered state (no checkpoint of
        the run's own exists); rank 0 notes it in the run log with its digest."""
        from hpcrun.checkpoint.initfrom import load_init, source_digest

        with self._events.span("restore", self._p.step, init_from=source):
            loaded = load_init(source, self._state, group=self._group)
        if self.rank == 0:
            self._log.publish_entry(
                InitFromNote(path=source, format=loaded.source.fmt,
                             digest=source_digest(loaded.source), tensors=loaded.tensors),
                generation=self.generation, holder=self.inc.holder)

    def _save(self, *, blocking: bool) -> None:
        from hpcrun.checkpoint.commit import CommitProgress

        # rank 0's commit publishes PROGRESS and the CURSOR of the step it saved, taken now
        progress = (CommitProgress(tokens=self._p.tokens, cursor=self._data_cursor())
                    if self.rank == 0 else None)
        t0 = self._clock.monotonic()
        with self._events.span("ckpt_stage", self._p.step, blocking=blocking):
            result = self._ckpt.save(self._p.step, self._state, extra=self._extra(),
                                     progress=progress, blocking=blocking)
        # The cadence counts from the save's start: an async save is due once, not until
        # it commits. Its cost C is the exposed pause (the whole save when blocking).
        self._cadence.saved(self._p.step, cost_s=float(
            result.pause_s if result is not None else self._clock.monotonic() - t0))
        self._finish_async(result)

    def _finish_async(self, result: SaveResult | None) -> None:
        """A save that finished: when it committed, the run's committed step moves to it."""
        if result is None or not result.committed:
            return
        self._p.committed_step = result.step
        self._p.committed_id = result.ckpt_id
        self._mark_known_good()
        self._events.emit("checkpoint", result.step, ckpt_id=result.ckpt_id,
                          pause_s=result.pause_s, write_s=result.write_s, bytes=result.bytes)

    def _data_cursor(self) -> dict[str, Any] | None:
        """The cursor of the first registered data loader (a
        :class:`~hpcrun.protocols.CursorSource`), if any.

        Taken when a save starts, so an asynchronous commit publishes the position of the
        step it saved, not of the step at which it finished.
        """
        from hpcrun.protocols import CursorSource

        for obj in self._state.values():
            if isinstance(obj, CursorSource):
                return obj.cursor_envelope()
        return None

    def _ensure_committed(self) -> None:
        self._finish_async(self._ckpt.wait())
        if self._p.committed_step != self._p.step and self._state:
            self._save(blocking=True)

    def _commit_and_stop(self) -> None:
        with self._events.span("ckpt_commit", self._p.step, reason="stop"):
            self._ensure_committed()
        self._check_replicas(force=True)  # the stop commit is known-good if replicas agree
        self.stopped = True

    def _final_commit(self) -> None:
        # every rank ends here: count the last step's tokens
        with self._events.span("collective", self._p.step, what="stop_agreement"):
            tokens, suspect = preemption.agree_sum([self._p.my_tokens, int(bool(
                self._sdc.suspect))], group=self._group)
        self._count_tokens(tokens)
        self._check_replicas(suspect=suspect > 0)
        with self._events.span("ckpt_commit", self._p.step, reason="final"):
            self._ensure_committed()
        self._check_replicas(force=True)  # the final commit is known-good if replicas agree

    def _note_if_unrestored(self) -> None:
        """At this incarnation's first step with no state registered (``ctx.restore`` /
        ``hpcrun.lite.restore`` never called): one warning line in each rank's log, and rank 0
        notes it in the run log, where status reads it."""
        if self._p.unrestored_noted or self._state:
            return
        self._p.unrestored_noted = True
        print(f"hpcrun: warning: step {self._p.step} finished but no state is registered "
              "(ctx.restore / hpcrun.lite.restore was never called): no checkpoint will be "
              "committed; a preemption will lose all progress", file=sys.stderr, flush=True)
        if self.rank == 0:
            self._log.publish_entry(NoRestoreNote(step=self._p.step),
                                    generation=self.generation, holder=self.inc.holder)

    def _validate_once(self) -> None:
        # RUNNING means a step was validated after any restore: rank 0 says so once per
        # incarnation, under the incarnation's fence.
        if self._p.validated or self.rank != 0:
            self._p.validated = True
            return
        self._p.validated = True
        self._log.publish_entry(
            StatePayload(state=RunState.RUNNING, reason=f"step {self._p.step} validated",
                         restored_step=self._p.restored_step,
                         restored_tier=self._p.restored_tier),
            generation=self.generation, holder=self.inc.holder)

    def _stall_shared_tier(self, seconds: float) -> None:
        """The ``fsstall`` drill: rank 0 notes it (the drill's ground truth), then every rank
        stalls its shared-tier operations, and its agent's."""
        from hpcrun.control.entries import FaultInjectedNote
        from hpcrun.runtime.sharedtier import SHARED_FS_STALL, start_shared_tier_stall

        if self.rank == 0:
            self._log.append_entry(FaultInjectedNote(fault=SHARED_FS_STALL, node=self.inc.node,
                                                     step=self._p.step),
                                   generation=self.generation, holder=self.inc.holder)
        start_shared_tier_stall(self.inc, seconds)

    def _fire_injections(self, *, slow: bool) -> None:
        for inj in faults.due(self._injections, rank=self.rank, step=self._p.step,
                              restart=self.inc.restart_count, attempt=self.inc.attempt):
            if (inj.kind == faults.FaultKind.SLOW) != slow:
                continue
            self._events.emit("fault_injected", self._p.step, fault=inj.kind.value)
            if inj.kind == faults.FaultKind.SDC:
                self._sdc.inject()  # only the context holds the parameters
                continue
            if inj.kind == faults.FaultKind.FSSTALL:
                self._stall_shared_tier(inj.seconds)
                continue
            if inj.kind in (faults.FaultKind.CRASH, faults.FaultKind.HANG,
                            faults.FaultKind.NODECRASH):
                self._events.close()  # flush what this rank saw before it goes
            faults.fire(inj, preempt_signal=self._preempt_signal)

    def close(self) -> None:
        """Finish the in-flight checkpoint (if any) and release resources."""
        try:
            self._finish_async(self._ckpt.wait())
        finally:
            self._ckpt.close()
            self._events.close()


def rebuilding_ddp(state: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of ``state`` holding a ``DistributedDataParallel`` whose Reducer rebuilds its
    gradient buckets after the first step (``find_unused_parameters`` off, or a static graph):
    the layout a resumed run's first step reduces with differs from the one the run that kept
    going uses (:mod:`hpcrun.integrations.ddp` builds one that does not)."""
    ddp_module = sys.modules.get("torch.nn.parallel")
    ddp_type = getattr(ddp_module, "DistributedDataParallel", None)
    if ddp_type is None:  # torch's DDP never imported: no DDP in the state
        return ()
    return tuple(sorted(
        k for k, v in state.items() if isinstance(v, ddp_type)
        and (bool(getattr(v, "static_graph", False))
             or not bool(getattr(v, "find_unused_parameters", False)))))
