"""Silent data corruption: the pure decisions (replica agreement, suspect losses, replay verdicts).

Data-parallel replicas hold bitwise-identical parameters after every optimizer step. Every
``sdc.every_steps`` steps each rank fingerprints its parameters and the ranks exchange the
fingerprints; :func:`odd_replicas` names the replica that disagrees with its group's majority
(two replicas, or any tie: every member of the group is suspect). A non-finite loss, or one
above ``sdc.loss_spike`` times the recent mean (:func:`loss_suspect`), is suspect too.

A suspect window is replayed from the state of the last check that passed, with the same
inputs, on every rank (:mod:`hpcrun.runtime.rank.sdc_guard`); :func:`judge` compares what each rank
computed the first time with what it computed again:

- a rank whose replay differs from its own first result computed wrong once (a transient
  fault): the rank that deviated first is the origin (in DDP a wrong gradient reaches every
  replica one step later) → :attr:`Verdict.HARDWARE`;
- replicas that disagree again in the replay, with a strict majority → the odd ones are
  persistently wrong → :attr:`Verdict.HARDWARE`;
- the same results again everywhere → the data or the model → :attr:`Verdict.DETERMINISTIC`
  (the spec's policy: fail naming the batch, or skip it);
- replicas that disagree with no majority and no replay to tell → :attr:`Verdict.UNRESOLVED`
  (both suspect: roll back, quarantine nobody).

The per-device canary's operands and stored answer are here too (:func:`canary_operands`,
:data:`CANARY_ANSWER`): integer-valued matrices whose product is exact in fp32 and fp16, so
every correct device computes the same bits.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from hpcrun.errors import ArgumentError

__all__ = ["CANARY_ANSWER", "CANARY_N", "Judgement", "RankResult", "Verdict", "canary_answer_of",
           "canary_operands", "judge", "loss_bits", "loss_suspect", "odd_replicas",
           "replica_groups"]

SPIKE_WINDOW = 20
"""Finite losses the spike check averages over."""
SPIKE_MIN_HISTORY = 5
"""Losses needed before a spike can be called."""


class Verdict(StrEnum):
    """What a suspect step turned out to be."""

    AGREE = "agree"                  # nothing wrong
    HARDWARE = "hardware"            # a device computed wrong: fault ``sdc``, node quarantined
    DETERMINISTIC = "deterministic"  # the same result again: the data or the model
    UNRESOLVED = "unresolved"        # replicas disagree, nothing tells which: roll back


@dataclass(frozen=True, kw_only=True, slots=True)
class RankResult:
    """What one rank computed over a window of steps."""

    rank: int
    """Global rank."""
    node: str
    """Node it runs on."""
    fingerprint: str
    """Fingerprint of its parameters at the end of the window."""
    losses: tuple[str, ...] = ()
    """Its loss at each step of the window, bit-exact (:func:`loss_bits`)."""
    distance: float | None = None
    """After a replay: the largest absolute difference between its first and its replayed
    parameters (None: not measured)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Judgement:
    """The outcome of a check or a replay."""

    verdict: Verdict
    """What it was."""
    ranks: tuple[int, ...] = ()
    """Ranks at fault (hardware), suspect (unresolved), or whose step reproduced (deterministic)."""
    nodes: tuple[str, ...] = ()
    """Their nodes, sorted, once each."""
    step: int | None = None
    """Step at which the fault first showed (None: at the end of the window)."""
    detail: str = ""
    """One line for people."""


def replica_groups(world_size: int,
                   groups: Sequence[Sequence[int]] | None = None) -> tuple[tuple[int, ...], ...]:
    """The replica groups to compare: every rank one group (DDP) unless ``groups`` says (pure).

    With sharded data parallelism each group is the ranks that hold the same shard.

    Raises:
        ArgumentError: ``groups`` is not a partition of ``range(world_size)``.
    """
    if groups is None:
        return (tuple(range(world_size)),)
    out = tuple(tuple(int(r) for r in g) for g in groups)
    flat = sorted(r for g in out for r in g)
    if flat != list(range(world_size)) or any(not g for g in out):
        raise ArgumentError(f"replica groups {[list(g) for g in out]} must split ranks "
                            f"0..{world_size - 1} into non-empty groups, each rank once; "
                            "list the ranks that hold the same parameters together")
    return out


def odd_replicas(fingerprints: Mapping[int, str],
                 groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], bool]:
    """(ranks that disagree with their group's majority, whether every verdict had a strict
    majority) (pure). In a group with no strict majority (two replicas that differ) every
    member is suspect."""
    odd: list[int] = []
    decided = True
    for full in groups:
        group = [r for r in full if r in fingerprints]  # a rank alone (no process group)
        counts = Counter(fingerprints[r] for r in group)
        if len(counts) <= 1:
            continue
        top, n = counts.most_common(1)[0]
        if n * 2 > len(group):
            odd += [r for r in group if fingerprints[r] != top]
        else:
            decided = False
            odd += group
    return tuple(sorted(odd)), decided


def loss_bits(loss: float) -> str:
    """A loss written so that equal bits compare equal (NaN included) (pure)."""
    return float(loss).hex()


def loss_suspect(loss: float, recent: Sequence[float], spike: float | None) -> str:
    """Why ``loss`` is suspect ("" when it is not): non-finite, or above ``spike`` times the
    mean of the ``recent`` finite losses (pure)."""
    if not math.isfinite(loss):
        return f"loss is {loss}"
    if spike is None or len(recent) < SPIKE_MIN_HISTORY:
        return ""
    window = list(recent)[-SPIKE_WINDOW:]
    mean = sum(window) / len(window)
    if mean > 0 and loss > spike * mean:
        return f"loss {loss:.4g} is above {spike:g} x the recent mean {mean:.4g}"
    return ""


def _deviation(first: RankResult, again: RankResult) -> int | None:
    """Index of the first window step whose result changed on the replay; the window's length
    when only the final parameters did; None when nothing did."""
    for i, (a, b) in enumerate(zip(first.losses, again.losses, strict=False)):
        if a != b:
            return i
    return len(first.losses) if first.fingerprint != again.fingerprint else None


def _nodes(results: Sequence[RankResult], ranks: Sequence[int]) -> tuple[str, ...]:
    return tuple(sorted({r.node for r in results if r.rank in ranks}))


def judge(observed: Sequence[RankResult], replayed: Sequence[RankResult] | None,
          groups: Sequence[Sequence[int]], *, steps: Sequence[int] = ()) -> Judgement:
    """The verdict on a suspect window (pure; every rank computes the same one).

    Args:
        observed: each rank's first results (fingerprint at the end, losses per step).
        replayed: each rank's results when the window was replayed from the same state with
            the same inputs (None: no replay was possible).
        groups: replica groups (:func:`replica_groups`).
        steps: the window's step numbers, in order (for the verdict's ``step``).
    """
    first = {r.rank: r for r in observed}
    odd, decided = odd_replicas({r: x.fingerprint for r, x in first.items()}, groups)
    if replayed is None:
        return _unreplayed(observed, odd, decided)
    again = {r.rank: r for r in replayed}
    rep_odd, rep_decided = odd_replicas({r: x.fingerprint for r, x in again.items()}, groups)
    if rep_odd and rep_decided:
        return Judgement(verdict=Verdict.HARDWARE, ranks=rep_odd, nodes=_nodes(observed, rep_odd),
                         detail=f"ranks {list(rep_odd)} disagree with their replicas again when "
                                "the window is replayed: a device computes wrong")
    deviations = {r: d for r in first if (d := _deviation(first[r], again[r])) is not None}
    origin_rank = _farthest(again.values(), deviations)
    if origin_rank is not None:
        at = deviations[origin_rank]
        return Judgement(verdict=Verdict.HARDWARE, ranks=(origin_rank,),
                         nodes=_nodes(observed, (origin_rank,)),
                         step=steps[at] if at < len(steps) else None,
                         detail=f"rank {origin_rank}'s parameters are far from what the same "
                         "steps compute again from the same state with the same inputs (the "
                         "other replicas differ only by the gradients it shared)")
    if deviations:
        origin = min(deviations.values())
        ranks = tuple(sorted(r for r, d in deviations.items() if d == origin))
        step = steps[origin] if origin < len(steps) else None
        where = f"at step {step}" if step is not None else "in its parameters"
        return Judgement(verdict=Verdict.HARDWARE, ranks=ranks, nodes=_nodes(observed, ranks),
                         step=step, detail=f"rank(s) {list(ranks)} computed a different result "
                         f"{where} when replayed from the same state with the same inputs")
    if odd and decided:
        return Judgement(verdict=Verdict.HARDWARE, ranks=odd, nodes=_nodes(observed, odd),
                         detail=f"ranks {list(odd)} disagree with their replicas, the same way "
                                "on replay: a device computes wrong every time")
    what = ("replicas disagree the same way on replay (rank-dependent model or user code)"
            if odd else "the replay computes the same results")
    return Judgement(verdict=Verdict.DETERMINISTIC, ranks=odd, nodes=_nodes(observed, odd),
                     detail=f"{what}: the data or the model, not the hardware")


DOMINANCE = 8.0
"""How many times farther from its replay the corrupted replica's parameters must be than any
other's to be named by distance: in DDP a corrupted replica shares wrong gradients, so every
replica drifts from the replay a little, the corrupted one by the corruption itself."""


def _farthest(replayed: Iterable[RankResult], deviating: Mapping[int, int]) -> int | None:
    """The rank whose parameters moved far more than any other's from the replay, if one did."""
    dist = sorted(((r.distance, r.rank) for r in replayed if r.rank in deviating
                   and r.distance is not None and math.isfinite(r.distance)), reverse=True)
    if not dist or dist[0][0] <= 0:
        return None
    if len(dist) == 1 or dist[0][0] >= DOMINANCE * dist[1][0]:
        return dist[0][1]
    return None


def _unreplayed(observed: Sequence[RankResult], odd: tuple[int, ...],
                decided: bool) -> Judgement:
    if not odd:
        return Judgement(verdict=Verdict.AGREE, detail="replicas agree")
    if decided:
        return Judgement(verdict=Verdict.HARDWARE, ranks=odd, nodes=_nodes(observed, odd),
                         detail=f"ranks {list(odd)} disagree with the majority of their replicas")
    return Judgement(verdict=Verdict.UNRESOLVED, ranks=odd, nodes=_nodes(observed, odd),
                     detail=f"replicas {list(odd)} disagree and no majority or replay tells "
                            "which is wrong (register the step with ctx.run_step to replay it)")


# -- the per-device canary ------------------------------------------------------------------

CANARY_N = 128
"""Side of the canary's square matrices."""


def canary_operands(n: int = CANARY_N) -> tuple[np.ndarray, np.ndarray]:
    """Two integer-valued matrices in [-3, 3]; every entry of their product is an integer of
    magnitude <= 9n, exact in fp32 (and in fp16 for n <= 227) on any correct device (pure)."""
    i = np.arange(n * n, dtype=np.int64).reshape(n, n)
    return (i * 3 + 2 * (i // n)) % 7 - 3, (i * 5 + 3 * (i // n) + 1) % 7 - 3


def canary_answer_of(product: np.ndarray) -> int:
    """The canary's checksum of a product matrix: position-weighted, so a swapped or shifted
    entry changes it too (pure)."""
    flat = np.asarray(product, dtype=np.int64).reshape(-1)
    weights = np.arange(flat.size, dtype=np.int64) % 251 + 1
    return int((flat * weights).sum())


CANARY_ANSWER = 35042
"""The stored answer: :func:`canary_answer_of` of the exact product of :func:`canary_operands`
(a unit test recomputes it with integer arithmetic)."""
