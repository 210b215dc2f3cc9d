"""Liveness over the network: each agent's beat as a UDP datagram, and the thread that hears them.

The shared filesystem is for data, not for chatter: a liveness file rewritten by every node every
0.5 s is ~4,000 metadata operations a second at 2,048 nodes, and a 3 s metadata-server stall
(common on Lustre) would make every node look lost at once. So agents beat each other directly:

- **Who hears whom** (:func:`beat_peers`). The first :data:`WATCHERS` nodes of the allocation
  (the supervisor, node 0, and the agents next in line to take supervision over,
  :mod:`hpcrun.runtime.supervise.takeover`) hear every node; every other node hears only them.
  A beat therefore goes to ``WATCHERS`` datagrams from an ordinary node and ``N - 1`` from a
  watcher: under ``2 x WATCHERS x N`` datagrams per beat period in all, O(N), never O(N²). At
  2,048 nodes that is 12,276 datagrams of under 300 bytes per 0.5 s, about 7 MB/s over the
  whole fabric; a watcher receives ~4,100 a second, a thread's work.
- **Endpoints are published once.** Each agent binds a UDP socket to its node's fabric
  address, the partner server's (the site's ``fabric_interface``, else the interface holding the
  node's Slurm ``NodeAddr``: :mod:`hpcrun.launch.fabric`; settled by the agent before the beats
  start and read through :func:`hpcrun.checkpoint.peer.server.node_address`), on a port the
  kernel picks, and writes ``<run_dir>/alive/<node>.endpoint.json`` once at start; a sender reads
  each peer's endpoint once (retrying a missing one every :data:`ENDPOINT_RETRY_S`).
- **Beats are untrusted input** (:func:`decode_beat`): at most :data:`MAX_BEAT_BYTES`, canonical
  JSON of a fixed schema, the run's id and the job start (the allocation: ``job<J>.r<R>.``, so a
  beat of another run or of an earlier allocation of this one is ignored), a node of the
  allocation, an integer counter, and an HMAC-SHA256 under the run's partner secret
  (``<run_dir>/partner/secret``, mode 0600), so nobody else on the fabric can keep a dead node
  alive.
- **The receiver records, the supervisor judges.** :class:`BeatReceiver` is a daemon thread
  that keeps, per node, the newest counter and the receiver's own monotonic time of it
  (:class:`BeatBoard`). The supervisor's loop may block (a slow shared filesystem) without
  losing a beat: when it looks again, the board says when each node was last heard, on the
  board's clock, not when the supervisor got round to asking.

The liveness file stays as a slow fallback (every ``FILE_EVERY_S``, for an agent whose datagrams
do not arrive); :class:`~hpcrun.runtime.node.membership.LivenessWatch` counts a node alive when
either source changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import FormatError
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = ["BEAT_SCHEMA_VERSION", "ENDPOINT_RETRY_S", "MAX_BEAT_BYTES", "WATCHERS", "Beat",
           "BeatBoard", "BeatReceiver", "BeatScope", "BeatSender", "beat_peers",
           "decode_beat", "encode_beat", "endpoint_path", "publish_endpoint", "read_endpoint"]

BEAT_SCHEMA_VERSION = 1
MAX_BEAT_BYTES = 512
"""A datagram longer than this is refused unread."""
WATCHERS = 3
"""Nodes at the head of the allocation that hear every node's beat (node 0 supervises; the next
ones take over when it is lost). Losing all of them at once leaves the rest judging each other
by the liveness files alone."""
ENDPOINT_RETRY_S = 1.0
"""How often a sender looks again for a peer's endpoint that was not published yet."""
_MAC_CHARS = 32
_FIELDS = frozenset({"v", "run", "start", "node", "n", "mac"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Beat:
    """One liveness beat, as sent."""

    run_id: str
    """The run (its directory's name)."""
    job_start: str
    """The allocation's holder prefix (``job<J>.r<R>.``): beats of another job start are foreign."""
    node: str
    """The node beating."""
    counter: int
    """Increases with every beat of this agent."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BeatScope:
    """What a receiver accepts: beats of this run, this job start, from these nodes."""

    run_id: str
    """The run's id."""
    job_start: str
    """This allocation's holder prefix."""
    nodes: frozenset[str]
    """The allocation's nodes."""


def beat_peers(me: str, allocation: Sequence[str], *, watchers: int = WATCHERS
               ) -> tuple[str, ...]:
    """The nodes ``me`` sends its beat to, which are also the nodes it watches (pure): every
    other node for a watcher (the first ``watchers`` of ``allocation``), the watchers for
    everyone else."""
    head = tuple(allocation[:watchers])
    if me in head:
        return tuple(n for n in allocation if n != me)
    return tuple(n for n in head if n != me)


def _mac(secret: bytes, body: Mapping[str, object]) -> str:
    msg = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()[:_MAC_CHARS]


def encode_beat(beat: Beat, secret: bytes) -> bytes:
    """The datagram of ``beat``, signed with the run's secret (pure)."""
    body: dict[str, object] = {"v": BEAT_SCHEMA_VERSION, "run": beat.run_id,
                               "start": beat.job_start, "node": beat.node, "n": beat.counter}
    body["mac"] = _mac(secret, body)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_BEAT_BYTES:
        raise FormatError(f"a liveness beat of node {beat.node!r} is {len(data)} bytes, over "
                          f"the {MAX_BEAT_BYTES}-byte limit; shorten the node or run name")
    return data


def decode_beat(data: bytes, scope: BeatScope, secret: bytes) -> Beat:
    """The beat a datagram carries, checked against ``scope`` and the secret (pure).

    Raises:
        FormatError: too long, not the schema, unsigned or forged, or of another run, job
            start or node; the message says which.
    """
    if len(data) > MAX_BEAT_BYTES:
        raise FormatError(f"beat of {len(data)} bytes refused (limit {MAX_BEAT_BYTES})")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"beat is not JSON: {exc}") from exc
    if not isinstance(body, dict) or set(body) != _FIELDS:
        raise FormatError(f"beat fields are not {sorted(_FIELDS)}")
    mac = body.pop("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(secret, body)):
        raise FormatError("beat signature does not match the run's secret")
    return _in_scope(body, scope)


def _in_scope(body: Mapping[str, object], scope: BeatScope) -> Beat:
    counter = body["n"]
    if body["v"] != BEAT_SCHEMA_VERSION or type(counter) is not int or counter < 0:
        raise FormatError(f"beat schema {body['v']!r} / counter {counter!r}; expected schema "
                          f"{BEAT_SCHEMA_VERSION} and a non-negative integer counter")
    if body["run"] != scope.run_id or body["start"] != scope.job_start:
        raise FormatError(f"beat of run {body['run']!r} job start {body['start']!r}; this "
                          f"receiver hears run {scope.run_id!r} job start {scope.job_start!r}")
    if not isinstance(body["node"], str) or body["node"] not in scope.nodes:
        raise FormatError(f"beat from {body['node']!r}, not a node of this allocation")
    return Beat(run_id=scope.run_id, job_start=scope.job_start, node=str(body["node"]),
                counter=counter)


class BeatBoard:
    """Per node, the newest beat counter heard and when (the board's clock); thread-safe."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._newest: dict[str, tuple[int, float]] = {}

    def record(self, beat: Beat) -> bool:
        """Keep ``beat`` if it is newer than the newest of its node; whether it was."""
        now = self._clock.monotonic()
        with self._lock:
            old = self._newest.get(beat.node)
            if old is not None and beat.counter <= old[0]:
                return False  # a replayed or reordered datagram says nothing new
            self._newest[beat.node] = (beat.counter, now)
            return True

    def heard(self) -> dict[str, float]:
        """Each node's time of its newest beat (the board's monotonic clock)."""
        with self._lock:
            return {node: at for node, (_, at) in self._newest.items()}


def endpoint_path(run_dir: Path, node: str) -> Path:
    """Where ``node``'s agent publishes its beat endpoint (once, at start)."""
    return Path(run_dir) / "alive" / f"{node}.endpoint.json"


def publish_endpoint(run_dir: Path, node: str, address: tuple[str, int], *, job_start: str,
                     storage: Storage = LOCAL_STORAGE) -> None:
    """Write ``node``'s beat endpoint for this job start (one durable write per agent start)."""
    host, port = address
    body = {"schema_version": BEAT_SCHEMA_VERSION, "node": node, "job_start": job_start,
            "host": host, "port": port}
    storage.makedirs(endpoint_path(run_dir, node).parent)
    storage.write_atomic(endpoint_path(run_dir, node), json.dumps(body).encode())


def read_endpoint(run_dir: Path, node: str, *, job_start: str,
                  storage: Storage = LOCAL_STORAGE) -> tuple[str, int] | None:
    """``node``'s beat endpoint for this job start; None when not published (yet), malformed,
    or left by an earlier allocation (untrusted: checked for shape)."""
    try:
        body = json.loads(storage.read_bytes(endpoint_path(run_dir, node)))
        host, port = str(body["host"]), int(body["port"])
        ok = body["job_start"] == job_start and 0 < port < 65536
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (host, port) if ok else None


class BeatReceiver:
    """The thread that hears beats on this node's UDP endpoint and records them on a board."""

    def __init__(self, host: str, *, scope: BeatScope, secret: bytes, board: BeatBoard) -> None:
        self._scope, self._secret, self.board = scope, secret, board
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpcrun-beat-recv", daemon=True)
        self.refused = 0
        """Datagrams refused so far (foreign, malformed, forged)."""

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def __enter__(self) -> BeatReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, _ = self._sock.recvfrom(MAX_BEAT_BYTES + 1)
            except TimeoutError:
                continue
            except OSError:
                return  # the socket was closed
            try:
                self.board.record(decode_beat(data, self._scope, self._secret))
            except FormatError:
                self.refused += 1


class BeatSender:
    """Sends this agent's beats to its peers' endpoints (each read once from the run dir).

    :meth:`send` never touches the filesystem (it runs in the beat thread, which a stalled
    shared tier must not stop); :meth:`resolve` reads the endpoints not known yet, from the
    liveness file's slow thread."""

    def __init__(self, run_dir: Path, *, beat: Beat, peers: Iterable[str], secret: bytes,
                 storage: Storage = LOCAL_STORAGE) -> None:
        self._run_dir, self._beat, self._secret = Path(run_dir), beat, secret
        self._storage = storage
        self._peers = tuple(peers)
        self._known: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @property
    def missing(self) -> tuple[str, ...]:
        """Peers whose endpoint is not known yet."""
        with self._lock:
            return tuple(p for p in self._peers if p not in self._known)

    def resolve(self) -> None:
        """Read the endpoints of the peers not known yet (one read each)."""
        for peer in self.missing:
            found = read_endpoint(self._run_dir, peer, job_start=self._beat.job_start,
                                  storage=self._storage)
            if found is not None:
                with self._lock:
                    self._known[peer] = found

    def send(self, counter: int) -> int:
        """Send beat ``counter`` to every peer whose endpoint is known; how many were sent."""
        data = encode_beat(Beat(run_id=self._beat.run_id, job_start=self._beat.job_start,
                                node=self._beat.node, counter=counter), self._secret)
        with self._lock:
            addresses = list(self._known.values())
        sent = 0
        for address in addresses:
            with contextlib.suppress(OSError):  # a peer's host gone: its watcher sees silence
                self._sock.sendto(data, address)
                sent += 1
        return sent

    def close(self) -> None:
        self._sock.close()
