"""The lifecycle of a node's drain, as its agent drives it: each incarnation's drain process,
its final round, and the tier-1 commit a new incarnation starts with.

Every drain round is the checkpoint plane's (:func:`hpcrun.checkpoint.drain.drain_to_tier1`),
run with this node's :class:`~hpcrun.runtime.node.drainer.DrainTarget`: the same shared-tier
deadline and the same scheduled storage fault, if a drill injects one, in the background process,
the final round and (supervisor) the tier-1 wait. One drain process of a node runs at a time: a
start first waits for a drain told to stop earlier. After a fault the agent terminates the
drain without waiting for its round in flight (no final round follows) and reaps it before the
next one starts; otherwise it stops it and waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.checkpoint.peer.ledger import ring_partner
from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.log import RunLog
from hpcrun.launch.signals import ignored_from_exec
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.drainer import DrainTarget, drain_target
from hpcrun.runtime.node.info import NodeInfo

if TYPE_CHECKING:
    from hpcrun.checkpoint.tiers import CommittedCheckpoint
    from hpcrun.control.spec import RunSpec

INTERVAL_S = 2.0
"""Seconds between two background drain rounds."""
RETRY_S = 1.0
"""Pause between retries of a final drain round that left this node's share undrained."""
STOP_WAIT_S = 30.0
"""How long a stopped drain may finish its round in flight before it is killed."""
STOP_WAIT_FLOOR_S = 2.0
"""The least of it, whatever the time left (a healthy round ends in far less)."""


class DrainProcess:
    """This agent's drains (the process: ``python -m hpcrun.runtime.node.drainer``)."""

    def __init__(self, *, run_dir: Path, node: NodeInfo, spec: RunSpec, log: RunLog,
                 environ: Mapping[str, str], python: str) -> None:
        self.run_dir = run_dir
        self.node = node
        self.spec = spec
        self.log = log
        self.environ = environ
        self.python = python
        self._stopping: subprocess.Popen[bytes] | None = None

    def target(self, inc: Incarnation) -> DrainTarget:
        """This node's drain in ``inc``: background, final round and (supervisor) the tier-1
        wait alike."""
        place = self.node.placed(inc.gang)
        partner = ring_partner(place.nodes, place.node) if self._partner_copies else None
        return drain_target(self.run_dir, place, inc,
                            injection=self.environ.get("HPCRUN_INJECT", ""),
                            partner=partner or "")

    @property
    def _partner_copies(self) -> bool:
        from hpcrun.checkpoint.peer.push import wanted

        return wanted(self.spec, self.node.node_local_root)

    def start(self, inc: Incarnation) -> subprocess.Popen[bytes] | None:
        """Start ``inc``'s drain process (None: this node has no tier 0, so no drain)."""
        target = self.target(inc) if self.node.node_local_root is not None else None
        self.reap()  # never two drains of this node at once
        if target is None:
            return None
        argv = target.argv(self.python, interval_s=INTERVAL_S)
        out = open(inc.logs_dir() / "drainer.out", "ab")  # noqa: SIM115 - owned by the child
        try:
            # niced from its start: its imports must not slow the ranks starting beside it
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_lowest_cpu_priority)
        finally:
            out.close()

    def end(self, proc: subprocess.Popen[bytes] | None, *, failed: bool,
            wait_s: float = STOP_WAIT_S) -> None:
        """End ``inc``'s drain process once its ranks are gone: after a failure without
        waiting for the round in flight (no final round follows; reaped before the next drain
        starts), otherwise stopped and waited for, at most ``wait_s`` (a preemption's time
        left: a round blocked on a hung tier must not hold the stop past its grace; a drain
        killed mid-copy leaves only a temporary file, and the final round redoes the copy)."""
        if failed:
            self.terminate(proc)
        else:
            self.stop(proc, wait_s=max(STOP_WAIT_FLOOR_S, min(STOP_WAIT_S, wait_s)))

    def final_round(self, inc: Incarnation, *, time_left: Callable[[], float],
                    clock: Clock = SYSTEM_CLOCK) -> None:
        """The incarnation's last round: every pending checkpoint of this node to tier 1,
        retried (a copy that failed, a tier that stalled) while this node's share of the newest
        tier-0 checkpoint is not drained, for as long as its bytes take at the run's measured
        drain rate (:func:`~hpcrun.checkpoint.drain.drain_wait_s`), within ``time_left()``."""
        from hpcrun.checkpoint.drain import (
            DrainRound,
            drain_rate,
            drain_to_tier1,
            drain_wait_s,
            pending_bytes,
        )
        from hpcrun.checkpoint.tiers import fold_checkpoints

        target, deadline = self.target(inc).within(time_left()), None
        while True:
            drain_to_tier1(target, self.log, DrainRound.FINAL)
            entries = self.log.read()
            committed = fold_checkpoints(entries)
            left = pending_bytes(committed, self.node.node)
            if not left or not self._holds_newest(committed, inc.run_id):
                return
            if deadline is None:
                deadline = clock.monotonic() + drain_wait_s(left, drain_rate(entries),
                                                            cap_s=time_left())
            if clock.monotonic() >= deadline:
                return
            clock.sleep(RETRY_S)

    def _holds_newest(self, committed: Sequence[CommittedCheckpoint], run_id: str) -> bool:
        """Whether this node's tier 0 still holds the newest tier-0 checkpoint (a retry of a
        copy that is not here could never succeed)."""
        from hpcrun.checkpoint.tiers import Tier, node_local_root

        local = [c for c in committed if Tier.NODE_LOCAL in c.tiers]
        root = self.node.node_local_root
        return bool(local) and root is not None and (
            node_local_root(root, run_id) / local[-1].ckpt_id).is_dir()

    def commit_previous(self, generation: int, holder: str) -> None:
        """Commit on tier 1 what every node drained before the last incarnation ended.

        A supervisor that died between the last DRAINED entry and its tier-1 commit (a lost
        node, a killed job) leaves a checkpoint that is whole on the shared tier but not
        committed there; committing it now, before the restore point is fixed, lets this
        incarnation restore it instead of an older one.
        """
        if self.node.node_local_root is None:
            return
        from hpcrun.checkpoint.drain import DrainRound, drain_to_tier1

        scope = DrainTarget(run_dir=self.run_dir, node=self.node.node,
                            node_local_root=self.node.node_local_root, generation=generation,
                            holder=holder, supervisor=True)
        drain_to_tier1(scope, self.log, DrainRound.COMMIT_ONLY)

    def terminate(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Ask the drain to stop after its round in flight; :meth:`reap` waits."""
        if proc is not None and proc.poll() is None:
            proc.terminate()
            self._stopping = proc

    def reap(self) -> None:
        """Wait for a drain told to stop by :meth:`terminate` (if any)."""
        proc, self._stopping = self._stopping, None
        self.stop(proc)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes] | None, *, wait_s: float = STOP_WAIT_S) -> None:
        """Stop a drain and wait for it (killed after ``wait_s``)."""
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_IGNORE_PREEMPTION = ignored_from_exec([signal.SIGUSR1, signal.SIGUSR2])


def _lowest_cpu_priority() -> None:
    """In a child before exec: nice 19 (the drain lowers the rest of its priority itself), and
    the preemption signals ignored from its first instruction (ignoring survives exec): Slurm
    may signal every process of the step, and the drain must live to make the stop durable."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    _IGNORE_PREEMPTION()
