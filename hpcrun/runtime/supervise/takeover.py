"""Supervision is a role, not node 0: who supervises a job start, and who takes over (pure).

The first node of the allocation (``SLURM_NODEID`` 0) supervises a job start until a supervision
claim (:class:`~hpcrun.control.entries.SupervisionClaimPayload`) in the run log names another
node. A claim is published under the fence in force, like any publish: a claimant whose
generation was fenced out is refused (its entry is void), and of two claims under one fence the
earlier slot stands. The newest standing claim of the job start names its supervisor; every
agent reads the same log, so every agent agrees on who that is.

When the supervising node is lost (neither its network beat nor its liveness file changed for
the bound on the watcher's own clock, :class:`~hpcrun.runtime.node.membership.LivenessWatch`),
exactly one surviving agent is due to claim: the gang node with the lowest node rank that still
beats, else (no gang node left) the first live spare in allocation order (:func:`successor`).
Agents that are not due keep following; if two agents claim anyway (they disagree on
staleness), the log's order decides (:func:`standing_claims`).

The supervising node dies, in this order:

1. **Beats.** In a run that survives a node loss every agent beats over the network to its
   peers, its liveness file as the fallback (``node/membership.py``'s ``LivenessBeat``); the
   supervisor's too. The first three nodes of the allocation (the supervisor and its likely
   successors) hear everyone; every other agent hears them (``node/netbeat.py``).
2. **Staleness.** Each following agent watches its peers (``LivenessWatch``): the supervisor
   neither heard nor its file changed for ``NODE_STALE_S`` of the watcher's own clock means it
   is lost.
3. **Who claims.** The one agent :func:`claim_due` names (the :func:`successor`) publishes a
   ``supervise`` claim under the fence in force (``Supervisor.take_over_if_lost``, called from
   ``follow``, from a gang member whose ranks still run, ``Supervisor.moved_on``, and from an
   agent waiting for a restart's fence, ``Agent._establish``).
4. **Agreement.** Every agent reads the claims from the same log: :func:`supervisor_of` (the
   newest standing claim of the job start) names the supervisor.
5. **The claimant supervises.** It ends the incarnation (logging the lost node's
   ``node_failure`` if its own ranks still ran), decides as node 0 would (the lost supervisor
   is a lost node: a spare swapped in, a shrink, or a requeue), fences the restart and
   supervises every later attempt of this job start. A lost node 0's position (rank 0,
   ``MASTER_ADDR``, the tier-0 commit coordinator) moves with its replacement; a requeue
   starts a new job start, supervised by its node 0. When the lost supervisor had published
   RECOVERING but not yet fenced the restart, the claimant starts that restart instead of
   deciding again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hpcrun.control.entries import (
    EntryKind,
    LogEntry,
    PayloadError,
    SupervisionClaimPayload,
    decode_as,
)

__all__ = ["Claim", "claim_due", "standing_claims", "successor", "supervisor_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """A supervision claim as it stands in the log."""

    slot: int
    """Its log slot."""
    generation: int
    """The generation it was published under (the incarnation whose supervisor was lost)."""
    holder: str
    """That incarnation's holder (its fence key says which job start it belongs to)."""
    payload: SupervisionClaimPayload
    """What it claims."""

    @property
    def node(self) -> str:
        return self.payload.node


def standing_claims(valid: Iterable[LogEntry]) -> list[Claim]:
    """The claims that stand, in log order: the first claim under each fence.

    ``valid`` are entries that count (the fencing fold's output): a claim published after a
    newer fence is not among them. A later claim under the same fence lost the race.
    """
    seen: set[tuple[int, str]] = set()
    out: list[Claim] = []
    for e in valid:
        if e.kind != EntryKind.SUPERVISE or (e.generation, e.holder) in seen:
            continue
        try:
            payload = decode_as(e, SupervisionClaimPayload)
        except PayloadError:
            continue  # malformed: it claims nothing
        seen.add((e.generation, e.holder))
        out.append(Claim(slot=e.slot, generation=e.generation, holder=e.holder,
                         payload=payload))
    return out


def supervisor_of(valid: Iterable[LogEntry], *, allocation: Sequence[str],
                  job_start: str) -> str:
    """The node supervising the job start whose fence holders begin with ``job_start``.

    Args:
        valid: the entries that count, in slot order.
        allocation: the job start's nodes, in node-rank order (the first supervises first).
        job_start: the holder prefix of the job start (``job<JOB>.r<RESTART>.``): a claim in
            an earlier job start (before a requeue) does not carry over.
    """
    claims = [c for c in standing_claims(valid) if c.holder.startswith(job_start)]
    return claims[-1].node if claims else allocation[0]


def successor(allocation: Sequence[str], gang: Sequence[str], *, supervisor: str,
              unusable: Iterable[str]) -> str | None:
    """The agent due to take over from ``supervisor``: the gang node with the lowest node
    rank, else the first spare in allocation order, that is neither the lost supervisor nor
    ``unusable`` (stale or quarantined); None when no agent is left."""
    out = {supervisor, *unusable}
    order = [*gang, *(n for n in allocation if n not in gang)]
    return next((n for n in order if n not in out), None)


def claim_due(me: str, *, allocation: Sequence[str], gang: Sequence[str], supervisor: str,
              stale: Iterable[str], quarantined: Iterable[str]) -> bool:
    """Whether this agent (``me``) must claim supervision now: the supervisor went stale and
    this agent is its :func:`successor`."""
    stale = set(stale)
    if me == supervisor or supervisor not in stale:
        return False
    return successor(allocation, gang, supervisor=supervisor,
                     unusable=stale | set(quarantined)) == me
