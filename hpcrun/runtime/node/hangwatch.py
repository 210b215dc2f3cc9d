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
3. **Respond.** :func:`~hpcrun.observe.hang.respond_to_hang`, in this order because a killed
   process tells nothing: dump every rank's Python stacks, kill the node's ranks, record a
   ``hang`` fault under the incarnation's fence.
4. **Node exit.** The loop returns FAILED: the agent stops the rest with the short fault grace,
   notes ``node_exit`` failed; the other nodes see the fault on the log and stop theirs.
5. **Decision.** The supervisor (``supervise/supervisor.py``) sends the ``hang`` fault through
   the retry rules (``supervise/decide.py``): a restart in the allocation, a requeue, or FAILED.
   A rank killed after its NCCL flight recorder dumped reads as ``hang`` too
   (``node/gpus.py``'s ``exit_fault``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hpcrun.clock import Clock

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.runtime.incarnation import Incarnation
    from hpcrun.runtime.node.gang import Gang

START_GRACE_S = 600.0  # a rank with no finished step after this (or 2x the hang threshold) hung


def hang_threshold(spec: RunSpec) -> float:
    """The spec's hang threshold: its recovery-time objective, else 600 s."""
    rto = getattr(spec.checkpoint, "rto_s", None)
    return float(rto) if rto else 600.0


def hang_watch(inc: Incarnation, gang: Gang, *, spec: RunSpec, environ: Mapping[str, str],
               node: str, clock: Clock,
               record_fault: Callable[[Mapping[str, Any]], None]) -> Callable[[], bool]:
    """A check the agent calls every poll: whether a rank hung (and was dealt with)."""
    from hpcrun.observe.hang import detect_hangs, never_stepped, respond_to_hang
    from hpcrun.observe.heartbeat import NodeHeartbeat, read_rank_beats

    threshold = float(environ.get("HPCRUN_HANG_S", "0") or 0) or hang_threshold(spec)
    start_grace = float(environ.get("HPCRUN_START_S", "0") or 0) or max(
        2 * threshold, START_GRACE_S)
    if spec.script_mode:
        start_grace = math.inf  # a script may never report a step: not a hang
    started = clock.now()

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
        return bool(respond_to_hang(
            hangs, pids=gang.pids, kill_gang=lambda: gang.kill(grace_s=1.0),
            record_fault=record_fault, threshold_s=threshold, clock=clock))

    return check
