"""Silent data corruption checks inside a rank: the shell of :mod:`hpcrun.runtime.rank.sdc`.

The :class:`~hpcrun.runtime.rank.context.Context` owns one :class:`SdcGuard` and calls it at each
step boundary, after the ranks' boundary agreement (which also tells whether any rank saw a
suspect loss):

1. every ``sdc.every_steps`` steps (and after the stop and final commits) each rank
   :func:`fingerprint`\\ s its parameters on their device and the ranks exchange the
   fingerprints in one small collective on the host (CPU) group;
2. when they agree the check passed: the state is the new *known state* (a snapshot of this
   rank's own shards in host memory, pinned for a device and its buffers reused, never a
   second copy on the device; taken only when the step is registered through
   ``ctx.run_step``), and the caller marks the newest committed checkpoint known-good;
3. when they disagree, or a rank saw a suspect loss, every rank replays the window since the
   known state with the same inputs (the user's step function registered through
   ``ctx.run_step``; the step is collective in DDP, so the whole gang replays it) and
   :func:`hpcrun.runtime.rank.sdc.judge` decides; :meth:`SdcGuard.act` carries the verdict out.

A verdict against the hardware is logged once, by rank 0, as a FAULT ``sdc`` naming the node;
every rank then stops with :class:`~hpcrun.errors.SdcEchoError` (an echo, not a fault of its
own), and the supervisor requeues excluding the node and rolls back to the newest known-good
checkpoint.

The per-device known-answer canary (:func:`run_canary`) runs at start and every
``sdc.canary_every_min`` minutes; a wrong answer is a fault ``sdc`` of this rank's node.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from hpcrun.control.entries import BatchSkippedNote, FaultPayload, ReplicaCheckOffNote
from hpcrun.errors import DataError, HpcrunError, NonFiniteError, SdcEchoError, SdcError
from hpcrun.runtime.rank import sdc
from hpcrun.vocab import FaultClass, SdcAction

if TYPE_CHECKING:
    import torch

    from hpcrun.clock import Clock
    from hpcrun.control.log import RunLog
    from hpcrun.control.spec import SdcPolicy
    from hpcrun.observe.events import EventWriter
    from hpcrun.runtime.incarnation import Incarnation

_WORD = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def fingerprint(tensors: Iterable[torch.Tensor]) -> str:
    """A fast integer checksum of the tensors' raw bytes, computed on their device.

    Each tensor's bytes are viewed as integer words (no conversion, no host copy of the model);
    per tensor the device sums the words and their squares in int64 (wrapping), and only those
    two numbers per tensor come back to the host, in one transfer. A single flipped bit always
    changes the first sum.
    """
    import torch

    sums = []
    for t in tensors:
        flat = _local(t).detach().contiguous().reshape(-1)
        if flat.numel() == 0:
            continue
        words = flat.view(getattr(torch, _WORD[flat.element_size()]))
        # int64 words and their squares, a slice at a time: the transient memory stays within
        # the tensor's own bytes (or 64 KiB); wrapping sums add up the same by slices
        step = max(4096, flat.numel() * flat.element_size() // 16)
        acc = torch.zeros(2, dtype=torch.int64, device=flat.device)
        for i in range(0, words.numel(), step):
            wide = words[i:i + step].to(torch.int64)
            acc += torch.stack([wide.sum(), (wide * wide).sum()])
        sums.append(acc)
    if not sums:
        return "empty"
    values = torch.cat(sums).cpu().tolist()
    return hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=16).hexdigest()


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local part (this rank's shard); a plain tensor as it is."""
    from hpcrun.checkpoint.chunks import is_dtensor

    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined, no-any-return]


def shard_signature(tensors: Iterable[torch.Tensor]) -> str:
    """Which shard of the parameters this rank holds: every DTensor's global offset and local
    shape (a plain tensor: its shape). Ranks with equal signatures are replicas."""
    from hpcrun.checkpoint.chunks import dtensor_box, is_dtensor

    parts = []
    for t in tensors:
        if is_dtensor(t):
            shape, offset = dtensor_box(t)
            parts.append(f"{list(offset)}{list(shape)}")
        else:
            parts.append(f"{list(t.shape)}")
    return hashlib.blake2b(";".join(parts).encode(), digest_size=16).hexdigest()


def exchange_fingerprints(mine: str, *, world_size: int, group: Any = None) -> list[str]:
    """Every rank's fingerprint, by rank: one all-gather of 16 bytes per rank on the host
    (CPU) group. Collective; a single process gets its own back."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    # The host group is gloo; a run still on the default NCCL group exchanges on its device.
    device = (torch.device("cuda", torch.cuda.current_device())
              if str(dist.get_backend(group)).lower() == "nccl" else torch.device("cpu"))
    raw = bytes.fromhex(mine) if mine != "empty" else bytes(16)
    local = torch.tensor(struct.unpack("<2q", raw), dtype=torch.int64, device=device)
    out = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(out, local, group=group)
    return [struct.pack("<2q", *t.tolist()).hex() for t in out]


def parameters_of(state: Mapping[str, Any]) -> list[torch.Tensor]:
    """The parameters and buffers of every ``torch.nn.Module`` among the registered state."""
    import torch

    out: list[torch.Tensor] = []
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            out += list(obj.parameters()) + list(obj.buffers())
    return out


def run_canary(device: Any) -> int:
    """The known-answer computation on ``device``: the checksum a correct device returns is
    :data:`hpcrun.runtime.rank.sdc.CANARY_ANSWER` (fp32, and fp16 too on a GPU)."""
    import torch

    a, b = (torch.from_numpy(m) for m in sdc.canary_operands())
    dtypes = [torch.float32] + ([torch.float16] if torch.device(device).type == "cuda" else [])
    answers = set()
    for dtype in dtypes:
        prod = a.to(device=device, dtype=dtype) @ b.to(device=device, dtype=dtype)
        answers.add(sdc.canary_answer_of(prod.to(torch.int64).cpu().numpy()))
    return answers.pop() if len(answers) == 1 else sdc.CANARY_ANSWER + 1


@dataclass(kw_only=True, slots=True)
class _Step:
    step: int
    """Steps completed after it (its ``ctx.step`` once done)."""
    batch: Any
    loss: str


class SdcGuard:
    """One rank's replica checks, suspect-step replays and canaries."""

    def __init__(self, *, policy: SdcPolicy, rank: int, node: str, world_size: int,
                 log: RunLog, incarnation: Incarnation, events: EventWriter, clock: Clock,
                 device: Any, group: Any = None,
                 replica_groups: Sequence[Sequence[int]] | None = None) -> None:
        self.policy = policy
        self.rank, self.node, self.world_size = rank, node, world_size
        self._log, self._inc, self._events, self._clock = log, incarnation, events, clock
        self._device, self._group = device, group
        self._groups = sdc.replica_groups(world_size, replica_groups)
        self._groups_given = replica_groups is not None
        self._off = False
        """No rank has a replica (a sharded model without replicate dims): nothing to compare."""
        self._state: Mapping[str, Any] = {}
        self._step_fn: Callable[[Any], Any] | None = None
        self._window: list[_Step] = []
        self._snapshot: dict[str, Any] | None = None
        self._recent: deque[float] = deque(maxlen=sdc.SPIKE_WINDOW)
        self.suspect = ""
        """Why this rank's last loss is suspect ("" when it is not)."""
        self._suspect_step: int | None = None
        self._checked = -1
        self._canary_at: float | None = None
        self.skipped: list[tuple[int, str]] = []
        """(step, batch) of each step whose update ``skip_batch`` dropped, in order."""

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The replica groups fingerprints are compared in."""
        return self._groups

    @groups.setter
    def groups(self, groups: tuple[tuple[int, ...], ...]) -> None:
        """Set by the user (``ctx.set_replica_groups``): kept over what the mesh says."""
        self._groups, self._groups_given, self._off = groups, True, False

    @property
    def can_replay(self) -> bool:
        """Whether the step is registered (``ctx.run_step``), so a window can be replayed."""
        return self._step_fn is not None

    # -- hooks the context calls -------------------------------------------------------------
    def start(self, state: Mapping[str, Any]) -> None:
        """The registered state is in place (restored or fresh): run the canary."""
        self._state = state
        if self.enabled:
            self.canary()
            if not self._groups_given:
                self._mesh_groups()

    def _mesh_groups(self) -> None:
        """COLLECTIVE: replica groups from the shards the ranks hold (DDP: one group; FSDP
        or TP: the ranks along the mesh's replicate dims); none at all turns the check off,
        said once in the run log."""
        signatures = self._gather(shard_signature(parameters_of(self._state)))
        by_shard: dict[str, list[int]] = {}
        for rank, sig in enumerate(signatures):
            by_shard.setdefault(sig, []).append(rank)
        self._groups = tuple(tuple(g) for g in by_shard.values())
        self._off = len(signatures) > 1 and all(len(g) == 1 for g in self._groups)
        if self._off and self.rank == 0:
            self._log.append_entry(ReplicaCheckOffNote(
                detail="no replicas to compare: replica check off (every rank holds a "
                       "different shard; the canary and loss checks stay on)"),
                generation=self._inc.generation, holder=self._inc.holder)

    def run_step(self, fn: Callable[[Any], Any], batch: Any, step: int) -> Any:
        """Run the user's step on ``batch``, keeping what a replay needs."""
        if not self.enabled:
            return fn(batch)
        if self._step_fn is None or self._snapshot is None:
            self._snapshot = self._take_snapshot()
            self._window = []
        self._step_fn = fn
        loss = fn(batch)
        self._window.append(_Step(step=step + 1, batch=batch, loss=_bits(loss)))
        return loss

    def observe_loss(self, loss: float, step: int) -> str:
        """Note this rank's loss for ``step``; why it is suspect ("" when it is not).

        A suspect loss is replayed at the next boundary only when the step is registered
        (:attr:`can_replay`); otherwise the caller handles it as before.
        """
        if not self.enabled:
            return ""
        why = sdc.loss_suspect(loss, self._recent, self.policy.loss_spike)
        if why and self.can_replay and not self.suspect:
            self.suspect, self._suspect_step = why, step
        elif not why:
            self._recent.append(loss)
        return why

    def due(self, step: int) -> bool:
        return (self.enabled and step > 0 and step % self.policy.every_steps == 0
                and step != self._checked)

    def at_boundary(self, step: int, *, suspect: bool, force: bool = False) -> bool:
        """COLLECTIVE when a check is due, ``suspect`` (any rank's) or ``force``: check the
        replicas (and replay and act when they disagree). True when a check passed."""
        if not self.enabled:
            return False
        self._canary_if_due()
        if not (suspect or force or self.due(step)) or (self._off and not suspect):
            return False
        self._checked = step
        t0 = self._clock.monotonic()
        mine = fingerprint(parameters_of(self._state))
        fps = exchange_fingerprints(mine, world_size=self.world_size, group=self._group)
        agree = all(len({fps[r] for r in g if r < len(fps)}) <= 1 for g in self._groups)
        if agree and not suspect:  # the common case: one tiny all-gather
            self._passed()
            self._events.emit("sdc_check", step, dur_s=self._clock.monotonic() - t0, ok=True)
            return True
        observed = self._gather(self._result(mine))
        verdict = sdc.judge(observed, None, self.groups)
        if verdict.verdict is sdc.Verdict.AGREE and not suspect:
            self._passed()
            self._events.emit("sdc_check", step, dur_s=self._clock.monotonic() - t0, ok=True)
            return True
        self._events.emit("sdc_check", step, dur_s=self._clock.monotonic() - t0, ok=False,
                          detail=verdict.detail)
        return self._decide(step, observed)

    # -- checks -------------------------------------------------------------------------------
    def _result(self, fp: str) -> sdc.RankResult:
        return sdc.RankResult(rank=self.rank, node=self.node, fingerprint=fp,
                              losses=tuple(s.loss for s in self._window))

    def _gather(self, mine: Any) -> list[Any]:
        """All ranks' ``mine`` (one small all-gather on the host group)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return [mine]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self._group)
        return out

    def _passed(self) -> None:
        self.suspect, self._suspect_step = "", None
        if self._step_fn is not None:
            self._snapshot = self._take_snapshot()
        self._window = []

    def _decide(self, step: int, observed: list[sdc.RankResult]) -> bool:
        replayable = all(self._gather(self.can_replay and self._snapshot is not None))
        replayed = self._gather(self._replay()) if replayable else None
        steps = [s.step for s in self._window]
        verdict = sdc.judge(observed, replayed, self.groups, steps=steps)
        self._events.emit("sdc_verdict", step, verdict=verdict.verdict.value,
                          ranks=list(verdict.ranks), nodes=list(verdict.nodes),
                          detail=verdict.detail)
        if verdict.verdict is sdc.Verdict.DETERMINISTIC:
            return self._deterministic(step, verdict, suspects=self._gather(
                (self._suspect_step, self.suspect)))
        self._fault(step, verdict)

    def _replay(self, skip: int | None = None) -> sdc.RankResult:
        """Load the known state and run the window's steps again with the same inputs (every
        rank at once: a DDP step is collective); ``skip`` leaves that step's batch out."""
        assert self._step_fn is not None and self._snapshot is not None
        # rare (a suspect): this rank's shards, to host memory, never a second device copy
        first = [_local(p).detach().to("cpu", copy=True) for p in parameters_of(self._state)]
        self._load_snapshot(self._snapshot)
        losses = []
        for s in self._window:
            losses.append(s.loss if s.step == skip else _bits(
                self._step_fn(s.batch)))
        params = parameters_of(self._state)
        return sdc.RankResult(rank=self.rank, node=self.node, fingerprint=fingerprint(params),
                              losses=tuple(losses), distance=_distance(first, params))

    def _deterministic(self, step: int, verdict: sdc.Judgement,
                       suspects: Sequence[tuple[int | None, str]]) -> bool:
        at = min((s for s, _ in suspects if s is not None), default=None)
        reasons = [why for s, why in suspects if s == at and at is not None]
        batch = next((s.batch for s in self._window if s.step == at), None)
        if (self.policy.policy is SdcAction.SKIP_BATCH and at is not None
                and any(s.step == at for s in self._window)):
            self._replay(skip=at)  # the step's update is dropped; its data stays consumed
            if self.rank == 0:
                self._log.publish_entry(BatchSkippedNote(step=at, batch=_batch_id(batch),
                                                         detail=verdict.detail),
                                        generation=self._inc.generation,
                                        holder=self._inc.holder)
            self._events.emit("sdc_skip", step, skipped_step=at, batch=_batch_id(batch))
            self.skipped.append((at, _batch_id(batch)))
            self.suspect, self._suspect_step = "", None
            return self.at_boundary(step, suspect=False, force=True)
        if self.rank != 0:
            raise SdcEchoError(f"rank 0 stops the run at step {step}: {verdict.detail}")
        if at is None:
            raise HpcrunError(f"replicas disagree at step {step}: {verdict.detail}; make the "
                              "model and the step identical on every replica (seeded "
                              "initialisation, DDP or equal updates), then resume")
        what = f"step {at} (batch {_batch_id(batch)})"
        if any(str(r).startswith("loss is") for r in reasons):
            raise NonFiniteError(f"{what}: the loss is not finite again when replayed: "
                                 f"{verdict.detail}. Inspect that batch or lower the learning "
                                 "rate, or set sdc.policy: skip_batch, then resume")
        raise DataError(f"{what}: the loss spiked again when replayed: {verdict.detail}. "
                        "Inspect that batch, or set sdc.policy: skip_batch, then resume")

    def _fault(self, step: int, verdict: sdc.Judgement) -> NoReturn:
        """Rank 0 logs the gang's FAULT ``sdc``; every rank stops."""
        node = verdict.nodes[0] if verdict.verdict is sdc.Verdict.HARDWARE and len(
            verdict.nodes) == 1 else None
        if self.rank == 0:
            self._log.append_entry(FaultPayload(
                fault=FaultClass.SDC, node=node,
                rank=verdict.ranks[0] if verdict.ranks and node is not None else None,
                step=verdict.step if verdict.step is not None else step,
                signature=f"sdc:{node or 'unresolved'}",
                detail=f"silent data corruption on {', '.join(verdict.nodes) or '?'}: "
                       f"{verdict.detail}"[:2000]),
                generation=self._inc.generation, holder=self._inc.holder)
        raise SdcEchoError(f"silent data corruption found at step {step}: {verdict.detail}")

    # -- snapshot ------------------------------------------------------------------------------
    def _take_snapshot(self) -> dict[str, Any]:
        """The registered modules' and optimizers' tensors copied to host memory (pinned for a
        device; the previous snapshot's buffers reused), the optimizers' hyperparameters and
        the RNG streams: the known state a replay starts from. Nothing is copied on the
        device."""
        import torch

        from hpcrun.checkpoint.state import capture_rng

        old = self._snapshot or {}
        snap: dict[str, Any] = {"rng": capture_rng()}
        for name, obj in self._state.items():
            if isinstance(obj, torch.nn.Module | torch.optim.Optimizer):
                snap[name] = _host_snapshot(obj, old.get(name))
        return snap

    def _load_snapshot(self, snap: Mapping[str, Any]) -> None:
        from hpcrun.checkpoint.state import restore_rng

        for name, saved in snap.items():
            if name != "rng":
                _load_host_snapshot(self._state[name], saved)
        restore_rng(snap["rng"])

    # -- canary --------------------------------------------------------------------------------
    def _canary_if_due(self) -> None:
        every = self.policy.canary_every_min
        if every is not None and self._canary_at is not None and (
                self._clock.monotonic() - self._canary_at >= every * 60.0):
            self.canary()

    def canary(self) -> None:
        """Run the known-answer canary on this rank's device; a wrong answer is a fault ``sdc``
        of this node (raised here: the rank's exit report names it)."""
        self._canary_at = self._clock.monotonic()
        got = run_canary(self._device)
        if got != sdc.CANARY_ANSWER:
            raise SdcError(f"device {self._device} on {self.node} failed the known-answer "
                           f"canary (checksum {got}, expected {sdc.CANARY_ANSWER}): it computes "
                           "wrong answers; the node is quarantined")

    def inject(self, *, bit: int = 22) -> None:
        """Fault injection (``sdc@step=N,rank=R``): flip one bit of this rank's parameters."""
        from hpcrun.runtime.faults import flip_bit

        # this rank's own shard of a DTensor parameter (its local tensor is what it computes)
        params = [t for p in parameters_of(self._state)
                  if (t := _local(p)).is_floating_point() and t.numel()]
        if not params:
            raise HpcrunError("sdc fault injection found no floating-point parameters among "
                              "the registered state; register the model with ctx.restore")
        flip_bit(max(params, key=lambda p: p.numel()), index=0, bit=bit)


@dataclass(kw_only=True, slots=True)
class _HostCopy:
    live: list[torch.Tensor]
    """The object's own tensors (a DTensor's local part), filled in place on a replay."""
    host: list[torch.Tensor]
    """Their values in host memory."""
    groups: list[dict[str, Any]]
    """An optimizer's hyperparameters (lr, ...) per param group."""
    empty: bool
    """An optimizer without state yet (a replay clears the state it built)."""


def _tensors_of(obj: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(obj, torch.nn.Module):
        return [_local(t) for t in [*obj.parameters(), *obj.buffers()]]
    return [_local(v) for st in obj.state.values() for v in st.values()
            if isinstance(v, torch.Tensor)]


def _host_snapshot(obj: Any, old: _HostCopy | None) -> _HostCopy:
    import torch

    live = [t.detach() for t in _tensors_of(obj)]
    reuse = old.host if old is not None and len(old.host) == len(live) else []
    host = []
    for i, t in enumerate(live):
        buf = reuse[i] if reuse and reuse[i].shape == t.shape and reuse[i].dtype == t.dtype \
            else torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        buf.copy_(t)
        host.append(buf)
    groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
              for g in getattr(obj, "param_groups", [])]
    return _HostCopy(live=live, host=host, groups=groups,
                     empty=not getattr(obj, "state", True))


def _load_host_snapshot(obj: Any, saved: _HostCopy) -> None:
    if saved.empty:
        obj.state.clear()  # the optimizer had no state: its first replayed step builds it
    else:
        for t, h in zip(saved.live, saved.host, strict=True):
            t.copy_(h)
    for g, hyper in zip(getattr(obj, "param_groups", []), saved.groups, strict=True):
        g.update(copy.deepcopy(hyper))


def _distance(first: Sequence[torch.Tensor], again: Sequence[torch.Tensor]) -> float:
    """The largest absolute difference between two parameter lists (float64, on device;
    this rank's shards)."""

    worst = 0.0
    for a, b in zip(map(_local, first), map(_local, again), strict=True):
        if a.is_floating_point() and a.numel():
            again_host = b.detach().to(a.device)
            worst = max(worst, float((a.double() - again_host.double()).abs().max()))
    return worst


def _bits(loss: Any) -> str:
    if loss is None:
        return ""
    try:
        return sdc.loss_bits(float(loss))
    except (TypeError, ValueError):
        return ""


def _batch_id(batch: Any) -> str:
    """How a skipped batch is named: its ``batch`` index when it carries one."""
    if isinstance(batch, Mapping) and "batch" in batch:
        try:
            return str(int(batch["batch"]))
        except (TypeError, ValueError):
            pass
    return "?"
