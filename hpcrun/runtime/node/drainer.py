"""A node's background drain: ``python -m hpcrun.runtime.node.drainer`` (started by its agent).

Runs in its own process, never in a training process: h5py serialises every HDF5 call of a
process under one lock, so a drain inside training would stall the data loader's reads. Every
``--interval`` seconds it copies this node's newly committed tier-0 shards to the shared tier
(verified with reads that bypass the page cache) and, on the supervising node, appends the tier-1
commit once every node has drained. With partner copies a thread of the same process copies
the node's newest checkpoint to its partner node as soon as its tier-0 commit lands
(:func:`hpcrun.checkpoint.peer.push.push_loop`), at the same priority and pace, without waiting
for the drain round in flight. A failing drain is noted in the log (``drain_error``) and
retried on the next round; training goes on, and the RPO exposure grows until it succeeds.
Every shared-tier operation runs under the site's deadline (:mod:`hpcrun.runtime.sharedtier`):
a hung mount becomes a ``storage_timeout`` fault and a retry, never a hang of the drain or of
the agent's final drain.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.control.log import RunLog
from hpcrun.errors import HpcrunError, StaleGenerationError
from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.node.drainpace import start_background_drain
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.sharedtier import (
    DEFAULT_DEADLINE_S,
    parse_storage_injection,
    shared_tier_storage,
    site_deadline_s,
)
from hpcrun.storage import Storage

if TYPE_CHECKING:
    from hpcrun.checkpoint.peer.push import PushTarget


OP_FLOOR_S = 5.0
"""The shortest deadline an operation of a final drain gets (a healthy tier answers in far less;
the supervisor keeps :data:`~hpcrun.runtime.supervise.supervisor.REQUEUE_MARGIN_S` of a grace
for what follows)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainTarget:
    """What one drainer drains, under which fencing token."""

    run_dir: Path
    """Run directory (tier 1 lives under it)."""
    node: str
    """This node's name."""
    node_local_root: Path
    """This node's tier-0 directory."""
    generation: int
    """Fencing token: generation."""
    holder: str
    """Fencing token: holder."""
    supervisor: bool
    """Whether this node appends tier-1 commits."""
    deadline_s: float = DEFAULT_DEADLINE_S
    """Deadline of one shared-tier operation (the site's ``shared_tier.deadline_s``)."""
    injection: str = ""
    """The drill's fault-injection schedule; its ``storage@`` part, if any, wraps the shared
    tier (:mod:`hpcrun.runtime.sharedtier`)."""
    partner: str = ""
    """The node holding this node's partner copies ("" when the run keeps none): each round
    also copies the newest checkpoint there (:mod:`hpcrun.checkpoint.peer.push`)."""

    def argv(self, python: str, interval_s: float) -> list[str]:
        return [python, "-m", "hpcrun.runtime.node.drainer", "--run-dir", str(self.run_dir),
                "--node", self.node, "--node-local", str(self.node_local_root),
                "--generation", str(self.generation), "--holder", self.holder,
                "--interval", str(interval_s),
                "--deadline", str(self.deadline_s), "--inject", self.injection,
                "--partner", self.partner] + (["--supervisor"] if self.supervisor else [])

    def within(self, seconds: float) -> DrainTarget:
        """The same drain with each shared-tier operation bounded by ``seconds`` as well (at
        least :data:`OP_FLOOR_S`): the end of an incarnation, whose time left after a stop is
        the preemption's grace, never waits out the site's longer deadline on a hung tier."""
        return replace(self, deadline_s=max(OP_FLOOR_S, min(self.deadline_s, seconds)))

    def push_target(self) -> PushTarget:
        """This node's partner copies, pushed under the same fencing token."""
        from hpcrun.checkpoint.peer.push import PushTarget

        return PushTarget(run_dir=self.run_dir, node=self.node, partner=self.partner,
                          node_local_root=self.node_local_root, generation=self.generation,
                          holder=self.holder)

    def storage(self, log: RunLog) -> Storage:
        """The shared tier as this target's drain round writes it: under the deadline, with
        the drill's storage fault when one is scheduled."""
        return shared_tier_storage(deadline_s=self.deadline_s,
                                   injection=parse_storage_injection(self.injection), log=log,
                                   node=self.node, generation=self.generation,
                                   holder=self.holder)


def drain_target(run_dir: Path, node: NodeInfo, inc: Incarnation, *,
                 injection: str = "", partner: str = "") -> DrainTarget:
    """What ``node``'s drainer drains for incarnation ``inc`` (the node has a tier 0), under
    the site's shared-tier deadline; ``injection`` is the drill's schedule, if any, and
    ``partner`` the node that holds this node's partner copies, if the run keeps them."""
    if node.node_local_root is None:
        raise HpcrunError(f"node {node.node} has no node-local tier to drain; the site config "
                          "sets node_local_path for runs that checkpoint on tier 0")
    return DrainTarget(run_dir=run_dir, node=node.node, node_local_root=node.node_local_root,
                       generation=inc.generation, holder=inc.holder,
                       supervisor=node.is_supervisor, deadline_s=site_deadline_s(run_dir),
                       injection=injection, partner=partner)


def _parse(argv: list[str]) -> tuple[DrainTarget, float]:
    p = argparse.ArgumentParser(prog="hpcrun-drainer")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--node-local", required=True)
    p.add_argument("--generation", type=int, required=True)
    p.add_argument("--holder", required=True)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--supervisor", action="store_true")
    p.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S)
    p.add_argument("--inject", default="")
    p.add_argument("--partner", default="")
    a = p.parse_args(argv)
    return DrainTarget(run_dir=Path(a.run_dir), node=a.node, node_local_root=Path(a.node_local),
                       generation=a.generation, holder=a.holder, supervisor=a.supervisor,
                       deadline_s=a.deadline, injection=a.inject, partner=a.partner), a.interval


def main(argv: list[str] | None = None) -> int:
    # the checkpoint plane's drain needs numpy and h5py: loaded in this process only, never in
    # the agent, which imports this module for DrainTarget
    from hpcrun.checkpoint.drain import drain_to_tier1

    target, interval = _parse(sys.argv[1:] if argv is None else argv)
    priority = start_background_drain(target.node_local_root, target.run_dir.name, target.node)
    print(f"drainer at {priority}", flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    # Slurm may signal every process of the step on a preemption; the drain is not a rank and
    # must survive it to make the stop checkpoint durable on the shared tier.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    log = RunLog(target.run_dir)
    pusher = _Pusher(target) if target.partner else None
    try:
        while not stopping and (pusher is None or pusher.fenced is None):
            try:
                drain_to_tier1(target, log)
            except StaleGenerationError:
                return 3
            deadline = time.monotonic() + interval
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        fenced = pusher is not None and pusher.close()
    return 3 if fenced else 0


class _Pusher:
    """Partner copies in their own thread (:func:`~hpcrun.checkpoint.peer.push.push_loop`):
    a copy leaves as soon as its tier-0 commit lands, not after the drain round in flight."""

    def __init__(self, target: DrainTarget) -> None:
        from hpcrun.checkpoint.peer.push import push_loop

        self.fenced: bool | None = None
        self._stop = threading.Event()

        def run() -> None:
            self.fenced = not push_loop(target.push_target(), RunLog(target.run_dir), self._stop)

        self._thread = threading.Thread(target=run, name="partner-push", daemon=True)
        self._thread.start()

    def close(self) -> bool:
        """Stop pushing (the copy in flight finishes); whether the pusher was fenced out."""
        self._stop.set()
        self._thread.join()
        return bool(self.fenced)


if __name__ == "__main__":
    sys.exit(main())
