"""Operation leases: at most one login-node pass acts on a run at a time (pure).

A reconcile pass (``hpcrun status``, a cron ``hpcrun watch``, an operator's ``hpcrun watch``)
logs an operation's intent before sending it. The intent carries a bounded lease
(``lease_until``, from the writer's clock), the id of the pass (``pass``) and the slot of the
record the pass planned from (``base``). The log's order decides, as with fences:

- an intent **claims the run** unless, at its slot, another pass holds a lease that is still
  live (not yet ``done``/``failed`` and ``lease_until`` after the intent's time), or another
  pass logged a claiming operation entry after the intent's ``base`` (the pass planned from a
  record that no longer holds);
- a void intent changes nothing: its pass leaves the run alone;
- the lease ends when its pass logs ``done`` or ``failed``, or when ``lease_until`` passes.

A planner that sees a live lease plans nothing (:func:`live_lease`); after the lease expired a
pass takes over the unfinished operation under its original id, and a takeover of a submission
first asks Slurm for a job carrying the operation's ``--comment``. Intents written before
leases existed carry none and never hold the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcrun.control.entries import OpPayload, OpPhase

__all__ = ["Lease", "OpClaims", "claims_run", "lease_seconds", "live_lease", "note_op_entry"]

LEASE_MARGIN_S = 30.0
"""Added to twice the slowest scheduler command's timeout to get a lease's length."""


def lease_seconds(command_timeout_s: float) -> float:
    """How long an intent holds the run: longer than any command it may be waiting for, so a
    pass that takes over knows the first pass's command has returned or been killed."""
    return 2 * command_timeout_s + LEASE_MARGIN_S


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """The operation holding the run."""

    op_id: str
    """Operation whose intent claimed the run."""
    action: str
    """Its kind (``submit``, ``mark_state``, ...)."""
    pass_id: str
    """The pass that logged the intent."""
    slot: int
    """Slot of the claiming intent."""
    until: float
    """Epoch seconds after which another pass may take over."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpClaims:
    """What the fold keeps about operation entries to decide the next intent (pure value)."""

    lease: Lease | None = None
    """The lease not yet ended by ``done``/``failed`` (it may have expired by time)."""
    latest: tuple[tuple[str, int], ...] = ()
    """(pass, slot) of the newest counted operation entry of the two most recent passes,
    newest first: enough to know the newest entry of any pass but one."""

    def newest_other(self, pass_id: str) -> int:
        """Slot of the newest counted operation entry by a pass other than ``pass_id``."""
        return next((slot for p, slot in self.latest if p != pass_id), -1)

    def to_dict(self) -> dict[str, Any]:
        lease = None if self.lease is None else {
            "op_id": self.lease.op_id, "action": self.lease.action,
            "pass_id": self.lease.pass_id, "slot": self.lease.slot, "until": self.lease.until}
        return {"lease": lease, "latest": [list(x) for x in self.latest]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OpClaims:
        lease = raw.get("lease")
        return cls(lease=None if lease is None else Lease(**lease),
                   latest=tuple((str(p), int(s)) for p, s in raw.get("latest", ())))


def claims_run(claims: OpClaims, op: OpPayload, *, slot: int, ts: float) -> bool:
    """Whether an intent (``op``, written at ``slot`` and time ``ts``) claims the run."""
    pass_id = op.pass_id or ""
    lease = claims.lease
    if lease is not None and lease.pass_id != pass_id and lease.until > ts:
        return False  # another pass's operation is live
    return not (op.base is not None and claims.newest_other(pass_id) > op.base)


def note_op_entry(claims: OpClaims, op: OpPayload, *, slot: int,
                  ts: float) -> tuple[OpClaims, bool]:
    """One step of the fold over ``op`` entries: the claims after it, and whether it counts.

    An intent that does not claim the run is void and does not count; ``done``/``failed``
    end the lease of the operation they finish.
    """
    pass_id = op.pass_id or ""
    lease = claims.lease
    if op.phase == OpPhase.INTENT:
        if not claims_run(claims, op, slot=slot, ts=ts):
            return claims, False
        lease = None if op.lease_until is None else Lease(
            op_id=op.op_id, action=op.action.value, pass_id=pass_id, slot=slot,
            until=op.lease_until)
    elif lease is not None and (lease.op_id, lease.pass_id) == (op.op_id, pass_id) \
            and op.phase in (OpPhase.DONE, OpPhase.FAILED):
        lease = None
    latest = ((pass_id, slot), *((p, s) for p, s in claims.latest if p != pass_id))[:2]
    return OpClaims(lease=lease, latest=latest), True


def live_lease(claims: OpClaims, now: float) -> Lease | None:
    """The lease that still holds the run at ``now`` (None when none does)."""
    lease = claims.lease
    return lease if lease is not None and lease.until > now else None
