"""A sum over the ranks of a gloo group in log2(n) exchanges: the per-step agreement's path.

gloo's all-reduce is a ring: 2 (n - 1) messages one after another, so its latency grows with
the world (about 32,766 hops a step at 16,384 ranks). The step agreement sums a handful of
integers, so latency is all it costs; recursive doubling does it in ``log2(p) + 2`` rounds
(``p`` the largest power of two at most ``n``), each rank talking to at most
``log2(p) + 1`` peers. With gloo's lazy connections (``TORCH_GLOO_LAZY_INIT``, set by
:func:`hpcrun.launch.dist.form_groups`) a rank connects to only those peers.

The schedule is pure (:func:`doubling_schedule`); :func:`tree_sum` runs it over point-to-point
sends and receives of the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hpcrun.errors import ArgumentError


class Move(StrEnum):
    """One step of a rank's schedule."""

    SEND = "send"
    """Send the running sum to the peer (a rank folded into its partner below ``p``)."""
    ADD = "add"
    """Receive the peer's sum and add it (the partner above ``p`` folds in)."""
    SWAP = "swap"
    """Send the running sum to the peer and add the peer's (a doubling round)."""
    TAKE = "take"
    """Receive the final sum from the peer (a folded rank gets the result back)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What a rank does with which peer (group ranks)."""

    move: Move
    peer: int


def doubling_schedule(rank: int, world: int) -> tuple[Step, ...]:
    """The steps of ``rank`` in a recursive-doubling sum over ``world`` ranks (pure).

    Ranks at or above ``p`` (the largest power of two at most ``world``) first fold their
    values into rank ``rank - p``, the ``p`` ranks below then swap sums with ``rank ^ mask``
    for mask = 1, 2, ... p/2, and the folded ranks take the result back.
    """
    if not 0 <= rank < world:
        raise ArgumentError(f"rank {rank} outside a world of {world}: a recursive-doubling "
                            f"schedule needs a rank in 0..{world - 1}")
    p = 1 << (world.bit_length() - 1)
    if rank >= p:
        return (Step(Move.SEND, rank - p), Step(Move.TAKE, rank - p))
    folded = rank + p < world
    steps = [Step(Move.ADD, rank + p)] if folded else []
    mask = 1
    while mask < p:
        steps.append(Step(Move.SWAP, rank ^ mask))
        mask <<= 1
    if folded:
        steps.append(Step(Move.SEND, rank + p))
    return tuple(steps)


def tree_sum(values: Sequence[int], *, group: Any = None) -> list[int]:
    """Each value summed over the ranks of the gloo ``group`` (default: the default group).

    Collective: every rank of the group calls it at the same point with the same number of
    values; a peer that never arrives blocks a receive until the group's timeout, as an
    all-reduce would.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    total = torch.tensor([int(v) for v in values], dtype=torch.int64)

    def peer(r: int) -> int:  # send and recv name global ranks
        return r if group is None else dist.get_global_rank(group, r)

    for step in doubling_schedule(rank, world):
        req = None
        if step.move in (Move.SEND, Move.SWAP):
            req = dist.isend(total.clone(), peer(step.peer), group=group)
        if step.move in (Move.ADD, Move.SWAP, Move.TAKE):
            got = torch.empty_like(total)
            dist.recv(got, peer(step.peer), group=group)
        if req is not None:
            req.wait()
        if step.move in (Move.ADD, Move.SWAP):
            total += got
        elif step.move == Move.TAKE:
            total = got
    return [int(x) for x in total.tolist()]


__all__ = ["Move", "Step", "doubling_schedule", "tree_sum"]
