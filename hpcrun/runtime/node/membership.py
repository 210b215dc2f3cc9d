"""Which nodes of the allocation run the gang, which wait as hot spares, and which are gone.

An allocation of ``resources.nodes + resources.spare_nodes`` nodes runs an agent on every node;
the gang is ``resources.nodes`` of them (the *active* set, in node-rank order) and the rest idle
warm as spares. When an active node is lost, a spare takes its place in the same position, so
every rank keeps its rank id, the world size stays ``resources.nodes x tasks_per_node`` and the
global sample order is unchanged. An elastic gang (``membership: elastic``) with no spare left
goes on without the lost node instead (:func:`shrink_gang`: the survivors, node ranks dense).
Whether a run survives a node loss at all is :func:`survives_node_loss` (spares or elastic).

Pure planning (:func:`initial_gang`, :func:`swap_in`, :func:`usable_spares`, kept in
:mod:`hpcrun.control.elastic` and re-exported here) and the liveness
bookkeeping the supervisor keeps (:class:`LivenessWatch`, skew-free: a node is stale when its
liveness file has not *changed* for ``stale_s`` of the supervisor's own clock). The agent's
liveness writer (:class:`LivenessBeat`) is the one effectful part: a daemon thread that rewrites
``<run_dir>/alive/<node>.json`` every :data:`ALIVE_EVERY_S` for as long as the agent lives, so a
vanished agent is told apart from one that is busy killing or draining its ranks.

A gang node dies in a run with hot spares (or an elastic gang), in this order:

1. **Start.** The STARTING entry names the gang (:func:`initial_gang`, in node-rank order); an
   agent outside it is a spare: it follows the log, keeps beating and keeps its warm processes.
   Each gang node's drainer pushes its newest tier-0 shards to its ring partner
   (``checkpoint/peer/push.py``).
2. **Beats stop.** The dead node's liveness file stops changing; the supervisor's
   :class:`LivenessWatch` calls it lost after ``NODE_STALE_S`` (``NODE_STALE_ECHO_S`` once the
   ranks logged ``peer_lost``), and the supervisor ends the incarnation (``supervise/
   supervisor.py``), logging a ``node_failure``.
3. **Decide.** With a live spare for each lost node and the in-allocation budget left:
   ``SwapSpare`` (:func:`swap_in`: the spare in the lost node's position, every rank keeps its
   id). The node is quarantined, RECOVERING names the new gang, a new fence and STARTING follow,
   in the same job.
4. **Restore.** The spare's ranks read the lost node's shards from the copy its partner holds
   (``checkpoint/peer/read.py``), so the restart resumes from a checkpoint newer than tier 1's.
5. **No spare left.** An elastic gang with at least ``membership.min_nodes`` survivors
   shrinks instead (``Shrink``, :func:`shrink_gang`: the survivors, node ranks dense): the world
   size is the new gang's, the restore reshards the state onto it, each rank takes
   ``global_batch / world_size`` rows of the same global batches. Otherwise the run requeues
   (an elastic job asks Slurm for ``min_nodes``-``nodes`` nodes).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.elastic import (
    initial_gang,
    shrink_gang,
    survives_node_loss,
    swap_in,
    usable_spares,
)
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = [
    "ALIVE_DIR",
    "ALIVE_EVERY_S",
    "NODE_STALE_S",
    "LivenessBeat",
    "LivenessWatch",
    "alive_path",
    "initial_gang",
    "read_liveness",
    "shrink_gang",
    "survives_node_loss",
    "swap_in",
    "usable_spares",
]

ALIVE_DIR = "alive"
"""Subdirectory of the run directory holding one liveness file per node."""
ALIVE_SCHEMA_VERSION = 1
ALIVE_EVERY_S = 0.5
"""How often an agent rewrites its liveness file (and the supervisor reads them all)."""
NODE_STALE_S = 3.0
"""A node whose liveness file did not change for this long (supervisor's clock) is lost.

Six beats: on this project's 2-vCPU test machine at load 8 (six busy processes and a busy
agent main thread), the largest gap between two beats a reader saw was 0.72 s
(``docs/recovery.md``, hot spares); a node that is merely slow keeps beating."""
NODE_STALE_ECHO_S = 1.5
"""The bound when the gang already failed with a lost peer (its ranks' collectives saw a
connection closed: a process of the gang is gone). Three beats: a slow node closes no
connection, and a live agent whose rank crashed keeps beating (its thread, not its ranks)."""


class LivenessWatch:
    """The supervisor's record of when each node's liveness file last changed (its own clock)."""

    def __init__(self, nodes: Iterable[str], *, clock: Clock = SYSTEM_CLOCK,
                 stale_s: float = NODE_STALE_S) -> None:
        now = clock.monotonic()
        self._clock, self._stale_s = clock, stale_s
        self._seen: dict[str, tuple[float | None, float]] = {n: (None, now) for n in nodes}

    def observe(self, beats: Mapping[str, float]) -> None:
        """Fold the liveness values just read (node -> the writer's counter or time)."""
        now = self._clock.monotonic()
        for node, (value, _) in list(self._seen.items()):
            if node in beats and beats[node] != value:
                self._seen[node] = (beats[node], now)

    def stale(self, stale_s: float | None = None) -> tuple[str, ...]:
        """Nodes whose liveness did not change for ``stale_s`` (default: the watch's bound),
        in watch order."""
        now, bound = self._clock.monotonic(), self._stale_s if stale_s is None else stale_s
        return tuple(n for n, (_, at) in self._seen.items() if now - at > bound)


def alive_path(run_dir: Path, node: str) -> Path:
    """Where ``node``'s agent leaves its liveness file."""
    return Path(run_dir) / ALIVE_DIR / f"{node}.json"


def read_liveness(run_dir: Path, nodes: Iterable[str], *,
                  storage: Storage = LOCAL_STORAGE) -> dict[str, float]:
    """Each node's liveness counter as written (missing or malformed files are left out)."""
    out: dict[str, float] = {}
    for node in nodes:
        try:
            body = json.loads(storage.read_bytes(alive_path(run_dir, node)))
            out[node] = float(body["beat"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


class LivenessBeat:
    """An agent's liveness writer: a daemon thread, started and stopped as a context manager."""

    def __init__(self, run_dir: Path, node: str, *, every_s: float = ALIVE_EVERY_S,
                 storage: Storage = LOCAL_STORAGE) -> None:
        self._path = alive_path(run_dir, node)
        self._node, self._every_s, self._storage = node, every_s, storage
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpcrun-liveness", daemon=True)

    def __enter__(self) -> LivenessBeat:
        self._storage.makedirs(self._path.parent)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            body = {"schema_version": ALIVE_SCHEMA_VERSION, "node": self._node, "beat": beat}
            # a slow or failing shared tier delays the beat; staleness says so
            with contextlib.suppress(OSError):
                self._storage.write_atomic(self._path, json.dumps(body).encode())
            self._stop.wait(self._every_s)
