"""A hung rank, from its last step to the decision: the node's hang watch.

1. **Beats.** Each rank rewrites its heartbeat file (node-local, beside its agent) at every step
   boundary (:class:`~hpcrun.observe.heartbeat.RankHeartbeat`, from ``rank/worker.py``).
2. **Watch.** The rank watch (``node/rankwatch.py``, step 8) calls :func:`hang_watch`'s check
   every poll: a rank whose step has not advanced for the hang threshold (``HPCRUN_HANG_S``,
   else the spec's ``checkpoint.rto_s``, else 600 s) hangs
   (:func:`~hpcrun.observe.hang.detect_hangs`), and so does one that finished no step within
   the start-up allowance (``HPCRUN_START_S``, else twice
   the threshold and at least :data:`START_GRACE_S`; none for a script, which may never report
   a step: :func:`~hpcrun.observe.hang.never_stepped`).
3. **Culprit.** Every rank's beat carries its world group's collective sequence number, kept
   current while it is blocked (``SeqTicker``); the node reads the gang's beats (its own, the
   other nodes' published ones) and NCCL's flight recorder dumps if any, and names the ranks
   that did not arrive (:mod:`~hpcrun.observe.culprit`). It waits up to
   :data:`EVIDENCE_WAIT_S` for every node's numbers to settle, then names whom they show.
4. **Respond.** :func:`~hpcrun.observe.hang.respond_to_hang`, in this order because a killed
   process tells nothing: dump every rank's Python stacks, kill the node's ranks, record a
   ``hang`` fault under the incarnation's fence: one naming the culprit ranks and nodes, else
   one per stalled rank (which no quarantine counts).
5. **Node exit.** The loop returns FAILED: the agent stops the rest with the short fault grace,
   notes ``node_exit`` failed; the other nodes see the fault on the log and stop theirs.
6. **Decision.** The supervisor (``supervise/supervisor.py``) sends the ``hang`` fault through
   the retry rules (``supervise/decide.py``): a restart in the allocation, a requeue, or FAILED;
   only a named culprit's node counts toward its quarantine. A rank killed after its NCCL
   flight recorder dumped reads as ``hang`` too, with the culprit its dumps name
   (``node/gpus.py``'s ``exit_fault`` and ``flight_recorder_culprit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hpcrun.clock import Clock

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.observe.culprit import Culprit
    from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat
    from hpcrun.runtime.incarnation import Incarnation
    from hpcrun.runtime.node.gang import RankGang

START_GRACE_S = 600.0  # a rank with no finished step after this (or 2x the hang threshold) hung
EVIDENCE_WAIT_S = 15.0
"""How long a detected hang waits for every node's sequence numbers to settle (a node
publishes its beats every 5 s while one of its ranks is stalled) before the culprit is named
from what there is."""


def hang_threshold(spec: RunSpec) -> float:
    """The spec's hang threshold: its recovery-time objective, else 600 s."""
    rto = getattr(spec.checkpoint, "rto_s", None)
    return float(rto) if rto else 600.0


def hang_watch(inc: Incarnation, gang: RankGang, *, spec: RunSpec, environ: Mapping[str, str],
               node: str, clock: Clock,
               record_fault: Callable[[Mapping[str, Any]], None]) -> Callable[[], bool]:
    """A check the agent calls every poll: whether a rank hung (and was dealt with)."""
    from hpcrun.observe.hang import HangReason, detect_hangs, never_stepped, respond_to_hang
    from hpcrun.observe.heartbeat import NodeHeartbeat, read_rank_beats

    threshold = float(environ.get("HPCRUN_HANG_S", "0") or 0) or hang_threshold(spec)
    start_grace = float(environ.get("HPCRUN_START_S", "0") or 0) or max(
        2 * threshold, START_GRACE_S)
    if spec.script_mode:
        start_grace = math.inf  # a script may never report a step: not a hang
    started = clock.now()

    first_seen: list[float] = []  # when the hang was first seen (the evidence wait)

    def check() -> bool:
        if threshold <= 0:
            return False
        now = clock.now()
        # only this incarnation's beats count: older files are the last gang's
        beats = {r: b for r, b in read_rank_beats(inc.heartbeat_dir()).items()
                 if b.ts >= started - 1}
        hangs = never_stepped(node, gang.live_ranks, beats, started=started, now=now,
                              grace_s=start_grace)
        if beats:
            hb = NodeHeartbeat(node=node, ts=now, ranks=beats)
            hangs += detect_hangs({node: hb}, now, threshold_s=threshold)
        if not hangs:
            return False
        first_seen[:1] = first_seen[:1] or [now]
        culprit, ready = hang_culprit(inc, node, beats, now=now, started=started,
                                      waited_s=now - first_seen[0])
        if not ready and any(h.reason != HangReason.NEVER_STEPPED for h in hangs):
            return False  # a rank that never stepped has no number to wait for
        return bool(respond_to_hang(
            hangs, pids=gang.pids, kill_gang=lambda: gang.kill(grace_s=1.0),
            record_fault=record_fault, threshold_s=threshold, clock=clock, culprit=culprit))

    return check


def gang_evidence(inc: Incarnation, node: str, beats: Mapping[int, RankBeat], *, now: float,
                  started: float) -> dict[str, NodeHeartbeat]:
    """This node's beats as of ``now`` and the other gang nodes' published ones of this
    incarnation (one small file per node, read only once a hang is seen)."""
    from hpcrun.observe.heartbeat import NodeHeartbeat, read_heartbeats

    gang = set(inc.gang)
    out = {}
    for name, hb in read_heartbeats(inc.run_dir).items():
        ranks = {r: b for r, b in hb.ranks.items() if b.ts >= started - 1}
        if name != node and (not gang or name in gang) and ranks:
            out[name] = NodeHeartbeat(node=name, ts=hb.ts, ranks=ranks,
                                      generation=hb.generation)
    out[node] = NodeHeartbeat(node=node, ts=now, ranks=beats, generation=inc.generation)
    return out


def hang_culprit(inc: Incarnation, node: str, beats: Mapping[int, RankBeat], *, now: float,
                 started: float, waited_s: float) -> tuple[Culprit | None, bool]:
    """The hang's culprit and whether to act now: the flight recorder's dumps when they name
    one, else the settled sequence numbers once every node's have settled or the wait is
    over."""
    from hpcrun.observe.culprit import Evidence, name_culprit, settled_evidence
    from hpcrun.runtime.node.gpus import flight_recorder_culprit

    seen = gang_evidence(inc, node, beats, now=now, started=started)
    evidence = settled_evidence(seen, inc.gang or (node,))
    flight = flight_recorder_culprit(inc, evidence.rank_nodes)
    if flight is not None:
        return flight, True
    culprit = name_culprit(evidence.seqs, evidence.rank_nodes, evidence=Evidence.SEQUENCE)
    return culprit, evidence.complete or waited_s >= EVIDENCE_WAIT_S
