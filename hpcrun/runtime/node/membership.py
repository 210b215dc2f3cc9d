"""Which nodes of the allocation run the gang, which wait as hot spares, and which are gone.

An allocation of ``resources.nodes + resources.spare_nodes`` nodes runs an agent on every node;
the gang is ``resources.nodes`` of them (the *active* set, in node-rank order) and the rest idle
warm as spares. When an active node is lost, a spare takes its place in the same position, so
every rank keeps its rank id, the world size stays ``resources.nodes x tasks_per_node`` and the
global sample order is unchanged. An elastic gang (``membership: elastic``) with no spare left
goes on without the lost node instead (:func:`shrink_gang`: the survivors, node ranks dense).
Whether a run survives a node loss at all is :func:`survives_node_loss` (spares or elastic);
whether its agents watch each other's liveness is :func:`watches_liveness` (those runs, and every
multi-node gang on Slurm, whose survivors drain a lost node's partner copy before a requeue).

Pure planning (:func:`initial_gang`, :func:`swap_in`, :func:`usable_spares`, kept in
:mod:`hpcrun.control.elastic` and re-exported here) and the liveness
bookkeeping a watcher keeps (:class:`LivenessWatch`, skew-free: a node is stale when neither its
network beat was heard nor its liveness file *changed* for ``stale_s`` of the watcher's own
clock). The agent's liveness (:class:`LivenessBeat`, wired by :func:`node_liveness`) is the
effectful part: a thread that sends a UDP beat to its peers every :data:`ALIVE_EVERY_S` without
touching the filesystem (:mod:`hpcrun.runtime.node.netbeat`: who hears whom, the wire format, the
receiver), and one that replaces ``<run_dir>/alive/<node>.json`` every :data:`FILE_EVERY_S` as
the fallback, for as long as the agent lives, so a vanished agent is told apart from one that is
busy killing or draining its ranks, and a stalled shared filesystem silences no one.

A gang node dies in a run with hot spares (or an elastic gang), in this order:

1. **Start.** The STARTING entry names the gang (:func:`initial_gang`, in node-rank order); an
   agent outside it is a spare: it follows the log, keeps beating and keeps its warm processes.
   Each gang node's drainer pushes its newest tier-0 shards to its ring partner
   (``checkpoint/peer/push.py``).
2. **Beats stop.** The dead node's datagrams stop arriving (and its liveness file stops
   changing); the supervisor's receiver thread keeps when it last heard each node, and its
   :class:`LivenessWatch` calls the node lost after ``NODE_STALE_S`` (``NODE_STALE_ECHO_S`` once
   the ranks logged ``peer_lost``), and the supervisor ends the incarnation (``supervise/
   supervisor.py``), logging a ``node_failure``. A shared filesystem that stalls meanwhile
   freezes every liveness file but no beat: nobody is declared lost for it.
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
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.elastic import (
    initial_gang,
    shrink_gang,
    survives_node_loss,
    swap_in,
    usable_spares,
)
from hpcrun.errors import HpcrunError
from hpcrun.runtime.node.netbeat import (
    ENDPOINT_RETRY_S,
    Beat,
    BeatBoard,
    BeatReceiver,
    BeatScope,
    BeatSender,
    beat_peers,
    publish_endpoint,
)
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import Backend

if TYPE_CHECKING:
    from hpcrun.control.elastic import GangSpec
    from hpcrun.runtime.node.info import NodeInfo

__all__ = [
    "ALIVE_DIR",
    "ALIVE_EVERY_S",
    "FILE_EVERY_S",
    "FILE_STALE_S",
    "NODE_STALE_S",
    "LivenessBeat",
    "LivenessWatch",
    "alive_path",
    "initial_gang",
    "node_liveness",
    "read_liveness",
    "shrink_gang",
    "survives_node_loss",
    "swap_in",
    "usable_spares",
    "watches_liveness",
]

def watches_liveness(spec: GangSpec, backend: Backend) -> bool:
    """Whether a run's agents beat liveness and its supervisor watches them: a run that
    survives a node loss, and on Slurm every gang of several nodes. Without a spare such a gang
    still requeues after a node loss, but its survivors learn of it in seconds, long before
    Slurm marks the node down and ends the job, and drain the lost node's partner copy of the
    newest commit to tier 1 first. (On the local backend nothing ends the other nodes'
    processes; such a run finds a silent node by the exit wait.)"""
    return survives_node_loss(spec) or (backend == Backend.SLURM and spec.resources.nodes > 1)


ALIVE_DIR = "alive"
"""Subdirectory of the run directory holding one liveness file (and beat endpoint) per node."""
ALIVE_SCHEMA_VERSION = 1
ALIVE_EVERY_S = 0.5
"""How often an agent sends its liveness beat over the network (:mod:`.netbeat`)."""
FILE_EVERY_S = 5.0
"""How often an agent rewrites its liveness file, and a watcher reads its peers' files: the slow
fallback for an agent whose datagrams do not arrive (ten times rarer than the beat before
liveness went over the network)."""
NODE_STALE_S = 3.0
"""A node neither heard on the network nor seen changing its file for this long (the watcher's
clock) is lost.

Six beats: on this project's 2-vCPU test machine at load 8 (six busy processes and a busy
agent main thread), the largest gap between two beats a reader saw was 0.72 s
(``docs/recovery.md``, hot spares); a node that is merely slow keeps beating."""
FILE_STALE_S = 3 * FILE_EVERY_S
"""The bound for a node never heard on the network (its datagrams do not arrive, or not yet):
its file changes every ``FILE_EVERY_S`` and is read as often, so three periods."""
NODE_STALE_ECHO_S = 1.5
"""The bound when the gang already failed with a lost peer (its ranks' collectives saw a
connection closed: a process of the gang is gone). Three beats: a slow node closes no
connection, and a live agent whose rank crashed keeps beating (its thread, not its ranks)."""


class LivenessWatch:
    """A watcher's record of when each node was last heard (its network beat, at the time the
    receiver heard it) and when its liveness file last changed (the watcher's clock).

    A node is alive when either source changed within the bound; a node never heard on the
    network is judged by its file alone, under :data:`FILE_STALE_S`."""

    def __init__(self, nodes: Iterable[str], *, clock: Clock = SYSTEM_CLOCK,
                 stale_s: float = NODE_STALE_S, file_stale_s: float = FILE_STALE_S) -> None:
        now = clock.monotonic()
        self._clock, self._stale_s, self._file_stale_s = clock, stale_s, file_stale_s
        self._seen: dict[str, tuple[float | None, float]] = {n: (None, now) for n in nodes}
        self._heard: dict[str, float] = {}
        self._read: dict[str, float] = {}  # when each node's file was last read

    @property
    def nodes(self) -> tuple[str, ...]:
        """The watched nodes, in watch order."""
        return tuple(self._seen)

    def observe(self, beats: Mapping[str, float]) -> None:
        """Fold the liveness files just read (node -> the writer's counter).

        A change counts as news when the file was read one file beat before; the file of a
        node heard on the network is read only once the network went quiet on it, and that
        first read is a baseline: the change it shows may be from long before."""
        now = self._clock.monotonic()
        for node, (value, at) in list(self._seen.items()):
            if node not in beats:
                continue
            recent = now - self._read.get(node, float("-inf")) <= 2 * FILE_EVERY_S
            self._read[node] = now
            if beats[node] != value:
                news = recent or node not in self._heard
                self._seen[node] = (beats[node], now if news else at)

    def observe_net(self, heard: Mapping[str, float]) -> None:
        """Fold the network beats (node -> when its newest beat was heard, on this watch's
        clock: the receiver's record, however late the watcher looks)."""
        for node, at in heard.items():
            if node in self._seen and at > self._heard.get(node, float("-inf")):
                self._heard[node] = at

    def unheard(self, within_s: float) -> tuple[str, ...]:
        """Nodes not heard on the network for ``within_s`` (or never), in watch order: the
        ones whose liveness file can still tell something."""
        now = self._clock.monotonic()
        return tuple(n for n in self._seen
                     if now - self._heard.get(n, float("-inf")) > within_s)

    def stale(self, stale_s: float | None = None) -> tuple[str, ...]:
        """Nodes that neither beat nor changed their file for ``stale_s`` (default: the
        watch's bound), in watch order."""
        now, bound = self._clock.monotonic(), self._stale_s if stale_s is None else stale_s
        return tuple(n for n in self._seen if now - self._last(n) > self._bound(n, bound))

    def _last(self, node: str) -> float:
        return max(self._seen[node][1], self._heard.get(node, float("-inf")))

    def _bound(self, node: str, bound: float) -> float:
        return bound if node in self._heard else max(bound, self._file_stale_s)


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
    """An agent's liveness: two daemon threads, started and stopped as a context manager.

    The beat thread sends a datagram to the peers every ``every_s`` and never touches the
    filesystem, so a stalled shared tier does not silence it; the file thread rewrites the
    liveness file every ``file_every_s`` (the fallback) and looks up peers' endpoints that were
    not published yet."""

    def __init__(self, run_dir: Path, node: str, *, every_s: float = ALIVE_EVERY_S,
                 file_every_s: float | None = FILE_EVERY_S, sender: BeatSender | None = None,
                 storage: Storage = LOCAL_STORAGE) -> None:
        """``file_every_s`` None: no liveness file, the network beat alone (a run that only
        needs to learn of a lost node quickly; see :func:`node_liveness`)."""
        self._path = alive_path(run_dir, node)
        self._node, self._every_s, self._file_every_s = node, every_s, file_every_s
        self._sender, self._storage = sender, storage
        self._counter = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._file_loop, name="hpcrun-liveness-file",
                                          daemon=True)]
        if sender is not None:
            self._threads.append(threading.Thread(target=self._net_loop,
                                                  name="hpcrun-liveness", daemon=True))

    def __enter__(self) -> LivenessBeat:
        self._storage.makedirs(self._path.parent)
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._sender is not None:
            self._sender.close()

    def _next(self) -> int:
        self._counter += 1  # one counter for both sources: either one changing is a beat
        return self._counter

    def _net_loop(self) -> None:
        assert self._sender is not None
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self._sender.send(self._next())
            self._stop.wait(self._every_s)

    def _file_loop(self) -> None:
        written = float("-inf")
        every = self._file_every_s
        tick = ENDPOINT_RETRY_S if every is None else min(every, ENDPOINT_RETRY_S)
        while not self._stop.is_set():
            if self._sender is not None and self._sender.missing:
                self._sender.resolve()
            if every is not None and time.monotonic() - written >= every:
                written = time.monotonic()
                body = {"schema_version": ALIVE_SCHEMA_VERSION, "node": self._node,
                        "beat": self._next()}
                # a slow or failing shared tier delays this file; the network beat goes on
                with contextlib.suppress(OSError):
                    self._storage.replace_bytes(self._path, json.dumps(body).encode())
            self._stop.wait(tick)


@contextlib.contextmanager
def node_liveness(run_dir: Path, node: NodeInfo, *, host: str | None = None,
                  files: bool = True) -> Iterator[tuple[BeatBoard | None, tuple[str, ...]]]:
    """This agent's liveness for the job start: its beat receiver (bound to ``host``, the
    node's fabric address; default the node's own), its endpoint published once, its beats
    (network and, with ``files``, file); yields the board of beats heard (None when the network
    beat could not start: the files alone then) and the nodes this agent watches.

    ``files`` False: no liveness file while the network beat runs. A run that survives a node
    loss keeps the file, the fallback that tells a node the network went quiet on from a dead
    one; a gang that requeues after a node loss anyway beats only to learn of it before Slurm
    ends the job, and spares the shared filesystem a file per node every 5 s (819 metadata
    operations a second at 2,048 nodes)."""
    from hpcrun.checkpoint.peer.server import node_address, run_secret

    peers = beat_peers(node.node, node.nodes)
    try:
        secret = run_secret(run_dir)
        scope = BeatScope(run_id=run_dir.name, job_start=node.job_start_key,
                          nodes=frozenset(node.nodes))
        receiver = BeatReceiver(host or node_address(node.node, node.backend), scope=scope,
                                secret=secret, board=BeatBoard())
    except (HpcrunError, OSError) as exc:
        print(f"hpcrun agent {node.node}: no network liveness beat ({exc}); its liveness "
              f"file alone, every {FILE_EVERY_S:g} s, says it is alive", file=sys.stderr)
        with LivenessBeat(run_dir, node.node):
            yield None, peers
        return
    with receiver:
        publish_endpoint(run_dir, node.node, receiver.address, job_start=node.job_start_key)
        sender = BeatSender(run_dir, beat=Beat(run_id=run_dir.name, job_start=node.job_start_key,
                                               node=node.node, counter=0),
                            peers=peers, secret=secret)
        with LivenessBeat(run_dir, node.node, sender=sender,
                          file_every_s=FILE_EVERY_S if files else None):
            yield receiver.board, peers
