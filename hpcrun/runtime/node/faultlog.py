"""What a node's agent logs when its ranks fail: one cause per failure, echoes as notes.

1. **Cause or echo.** Of the ranks found failed in one poll, one is the cause: a rank killed by
   a signal first (its peers then raise from a collective that lost it, and one poll may find
   them all ended, in rank order rather than time order). Ranks whose exit report says
   ``peer_lost`` are echoes of a cause elsewhere.
2. **Script ranks.** A script leaves no exit report, so an exit from a collective whose peer
   died on another node reads like a crash of its own. Where only non-zero exits were seen,
   the log is followed for :data:`SCRIPT_ECHO_WAIT_S`: another node's gang fault in that time
   makes them echoes.
3. **Echoes only.** A :class:`~hpcrun.control.entries.PeerLostNote` names the ranks; the fault
   (and its retry budget) stays with the node where the cause happened.
4. **The cause.** A FAULT entry with the rank, its step (the exit report's, else its last
   heartbeat's: a rank killed outright leaves no report), a signature and the detail.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcrun.clock import Clock
from hpcrun.control.entries import FaultPayload, NodeExitNote, PayloadError, PeerLostNote
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.runtime.incarnation import Ending, Incarnation, RankExit
from hpcrun.runtime.node.gpus import exit_culprit, exit_fault
from hpcrun.runtime.node.logview import LogView, gang_faults

SCRIPT_ECHO_WAIT_S = 3.0
"""How long a script rank's non-zero exit waits for another node to log the fault it echoes."""
POLL_S = 0.2


@dataclass(frozen=True, kw_only=True)
class FaultLog:
    """One node's fault and node-exit entries in the run log."""

    log: RunLog
    view: LogView
    node: str
    nodes: Sequence[str]
    script_mode: bool
    clock: Clock

    def peer_faulted(self, inc: Incarnation) -> bool:
        """Whether another node logged a gang fault in this incarnation (as last read)."""
        return any(f.node != self.node for f in gang_faults(
            self.view.valid_of(inc.generation, inc.holder, EntryKind.FAULT)))

    def rank_failures(self, inc: Incarnation, failed: list[RankExit]) -> None:
        """Log the cause among ``failed`` (steps 1-4 above)."""
        from hpcrun.observe.heartbeat import read_rank_beats

        causes = [ex for ex in failed if not ex.echo]
        if causes and self._peer_fault_follows(inc, causes):
            causes = []
        if not causes:
            self.log.append_entry(PeerLostNote(node=self.node,
                                               ranks=tuple(ex.rank for ex in failed)),
                                  generation=inc.generation, holder=inc.holder)
            return
        beats = read_rank_beats(inc.heartbeat_dir())
        ex = sorted(causes, key=lambda e: e.returncode >= 0)[0]
        how = (f"killed by signal {-ex.returncode}" if ex.returncode < 0
               else f"exited {ex.returncode}")
        step = ex.report.get("step")
        if step is None and ex.rank in beats:
            step = beats[ex.rank].step
        fault = exit_fault(ex, inc)
        self.append(inc, {
            "fault": fault, "node": self.node, "rank": ex.rank,
            "step": step, "signature": f"{fault}:rank{ex.rank}:{ex.returncode}",
            "detail": str(ex.report.get("detail") or how)[-2000:],
            **(exit_culprit(inc) if fault == "hang" else {})})

    def _peer_fault_follows(self, inc: Incarnation, causes: list[RankExit]) -> bool:
        """Step 2: whether another node logs a gang fault within the wait."""
        if not self.script_mode or len(self.nodes) < 2 or any(
                ex.returncode < 0 for ex in causes):
            return False
        deadline = self.clock.monotonic() + SCRIPT_ECHO_WAIT_S
        while True:
            self.view.refresh()
            if self.peer_faulted(inc):
                return True
            if self.clock.monotonic() >= deadline:
                return False
            self.clock.sleep(POLL_S)

    def gpu_shortfall(self, inc: Incarnation, detail: str) -> None:
        """This node sees too few GPUs: a node failure, logged before any rank started."""
        print(f"hpcrun agent: error: {detail}", file=sys.stderr)
        self.append(inc, {"fault": "node_failure", "node": self.node, "rank": None,
                          "step": None, "signature": f"gpus:{self.node}", "detail": detail})

    def append(self, inc: Incarnation, payload: Mapping[str, Any]) -> None:
        """Log a FAULT through :class:`FaultPayload`; a payload it cannot hold is logged as is.

        A rank's exit report may name a word outside the fault classes (``stale``): it is
        logged as the rank wrote it, and readers take it as ``unknown``.
        """
        try:
            fault = FaultPayload.from_payload(payload)
        except PayloadError:
            self.log.append(EntryKind.FAULT, generation=inc.generation, holder=inc.holder,
                            payload=dict(payload))
            return
        self.log.append_entry(fault, generation=inc.generation, holder=inc.holder)

    def node_exit(self, inc: Incarnation, status: Ending) -> None:
        """This node's ranks are all gone, ending as ``status``."""
        self.log.append_entry(NodeExitNote(node=self.node, status=status, attempt=inc.attempt),
                              generation=inc.generation, holder=inc.holder)
