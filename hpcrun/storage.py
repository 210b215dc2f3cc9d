"""The storage seam: every metadata-visible file operation of the record and checkpoint code.

Parallel filesystems (Lustre, GPFS) are slow at metadata, not at bytes, so the operations that
matter at scale (create, stat, rename, fsync, list) go through one :class:`Storage` object that a
benchmark can wrap with :class:`CountingStorage`. Bulk shard bytes may bypass it (h5py, O_DIRECT)
but their files are still created, renamed and fsynced through it.

Every operation of :class:`LocalStorage` also passes a :class:`StallGate` (the drill's
``shared-fs-stall``: a process's operations under the run directory block for a while) and is
timed into :class:`SlowOps` (an operation of 3 s or more: a stall, real or injected, that the
supervisor reports).
"""

from __future__ import annotations

import collections
import errno
import functools
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ConfigError, StorageError, StorageTimeoutError
from hpcrun.vocab import MetaOp

T = TypeVar("T")

PathLike = str | os.PathLike[str]


@runtime_checkable
class Storage(Protocol):
    """File operations on one tier."""

    def create_exclusive(self, path: PathLike, data: bytes) -> bool:
        """Create ``path`` with ``data`` iff it does not exist, atomically and durably.

        Returns False when the name is taken. This is the log's atomic primitive.
        """
        ...

    def write_atomic(self, path: PathLike, data: bytes) -> None:
        """Durably replace ``path``: temp file in the same directory, fsync, rename, fsync dir."""
        ...

    def replace_bytes(self, path: PathLike, data: bytes) -> None:
        """Replace ``path`` whole but not durably: temp file, rename, no fsync (for files a
        reader needs whole, never after a crash: heartbeats)."""
        ...

    def read_bytes(self, path: PathLike) -> bytes: ...

    def exists(self, path: PathLike) -> bool: ...

    def size(self, path: PathLike) -> int: ...

    def listdir(self, path: PathLike) -> list[str]:
        """Names in ``path``, sorted; empty when it does not exist."""
        ...

    def makedirs(self, path: PathLike, mode: int = 0o750) -> None: ...

    def rename(self, src: PathLike, dst: PathLike) -> None: ...

    def fsync_path(self, path: PathLike) -> None:
        """fsync a file or a directory."""
        ...

    def remove(self, path: PathLike) -> None: ...

    def rmtree(self, path: PathLike) -> None: ...

    def data(self, op: str, path: PathLike, fn: Callable[[], T]) -> T:
        """Run ``fn``, a data operation on ``path`` (a shard's bytes written or read back:
        ``op`` is one of :data:`DATA_OPS`), under this tier's rules, as every metadata
        operation runs: a drill's stall, the deadline, an injected fault."""
        ...


DATA_OPS: tuple[str, ...] = ("write_data", "read_data")
"""The data operations a :class:`Storage` runs (:meth:`Storage.data`)."""


def _wrap(op: str, path: PathLike, exc: OSError) -> StorageError:
    return StorageError(f"{op} {os.fspath(path)!r} failed: {exc.strerror or exc}; "
                        "check that the tier is mounted, writable and not full")


class StallGate:
    """A shared-tier stall in this process (the ``shared-fs-stall`` drill, ``fsstall@``): once
    armed, every operation on a path under its root blocks until the stall ends, as every
    metadata call does while a Lustre metadata server stops answering. Paths elsewhere (the
    node-local tier) go on. Thread-safe; unarmed it costs one attribute read per operation."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._root: str | None = None
        self._until = float("-inf")
        self._lock = threading.Lock()

    def arm(self, root: PathLike, seconds: float) -> None:
        """Stall every operation under ``root`` for ``seconds`` from now."""
        with self._lock:
            self._root = os.path.join(os.path.abspath(os.fspath(root)), "")
            self._until = self._clock.monotonic() + seconds

    def remaining(self, path: PathLike) -> float:
        """How long an operation on ``path`` must wait now (0 when it need not)."""
        root = self._root
        if root is None:
            return 0.0
        left = self._until - self._clock.monotonic()
        if left <= 0 or not os.path.join(os.path.abspath(os.fspath(path)), "").startswith(root):
            return 0.0
        return left

    def wait_out(self, path: PathLike) -> None:
        """Block while a stall covers ``path``."""
        left = self.remaining(path)
        while left > 0:
            self._clock.sleep(left)
            left = self.remaining(path)


SHARED_TIER_STALL = StallGate()
"""This process's shared-tier stall gate (armed only by the ``fsstall@`` drill fault)."""

SLOW_OP_S = 3.0
"""An operation at the seam this slow is worth reporting: the liveness bound
(``NODE_STALE_S``), past which liveness read from files alone would lose every node."""


class SlowOps:
    """The slowest operation at the seam since it was last taken, among those of at least
    ``threshold_s`` (a shared-filesystem stall seen from this process); thread-safe."""

    def __init__(self, *, threshold_s: float = SLOW_OP_S) -> None:
        self._threshold_s = threshold_s
        self._slowest: tuple[str, str, float] | None = None
        self._lock = threading.Lock()

    def note(self, op: str, path: PathLike, seconds: float) -> None:
        """Record one operation's duration."""
        if seconds < self._threshold_s:
            return
        with self._lock:
            if self._slowest is None or seconds > self._slowest[2]:
                self._slowest = (op, os.fspath(path), seconds)

    def take(self) -> tuple[str, str, float] | None:
        """The slowest slow operation since the last take (op, path, seconds), or None."""
        with self._lock:
            out, self._slowest = self._slowest, None
        return out


SHARED_TIER_SLOW = SlowOps()
"""This process's slow shared-tier operations (what :data:`LOCAL_STORAGE` saw)."""

P = ParamSpec("P")
_LS = TypeVar("_LS", bound="LocalStorage")


def _at_seam(fn: Callable[Concatenate[_LS, PathLike, P], T]
             ) -> Callable[Concatenate[_LS, PathLike, P], T]:
    """One operation of :class:`LocalStorage`: wait out a drill's stall, then run it; either
    way, a slow one is recorded."""

    @functools.wraps(fn)
    def op(self: _LS, path: PathLike, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.data(fn.__name__.strip("_"), path, lambda: fn(self, path, *args, **kwargs))

    return op


class LocalStorage:
    """POSIX implementation, correct on local disks, Lustre, GPFS and NFSv3+."""

    def __init__(self, gate: StallGate | None = None, slow: SlowOps | None = None) -> None:
        """``gate`` stalls operations (the drill's ``fsstall``); ``slow`` records the slowest
        operation (a stall, injected or real, for the supervisor to report)."""
        self._gate = gate if gate is not None else StallGate()
        self._slow = slow if slow is not None else SlowOps()

    @_at_seam
    def create_exclusive(self, path: PathLike, data: bytes) -> bool:
        # Write the bytes under a private name, then link(2) them into place: link is atomic
        # and fails with EEXIST when the name is taken (POSIX, Lustre, GPFS, NFSv3+), so a
        # reader never sees the name with partial content, unlike O_CREAT|O_EXCL then write.
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.new")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        except OSError as exc:
            raise _wrap("create", path, exc) from exc
        self.fsync_path(target.parent)
        return True

    def write_atomic(self, path: PathLike, data: bytes) -> None:
        self._replace(path, data, durable=True)

    def replace_bytes(self, path: PathLike, data: bytes) -> None:
        self._replace(path, data, durable=False)

    @_at_seam
    def _replace(self, path: PathLike, data: bytes, *, durable: bool) -> None:
        """Write under a private name, then rename into place; ``durable`` fsyncs the file and
        its directory (a crash never loses it), else a reader sees old or new bytes, never part."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            try:
                os.write(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            if durable:
                self.fsync_path(target.parent)
        except OSError as exc:
            raise _wrap("write", path, exc) from exc

    @_at_seam
    def read_bytes(self, path: PathLike) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise _wrap("read", path, exc) from exc

    @_at_seam
    def exists(self, path: PathLike) -> bool:
        return os.path.exists(path)

    @_at_seam
    def size(self, path: PathLike) -> int:
        try:
            return os.stat(path).st_size
        except OSError as exc:
            raise _wrap("stat", path, exc) from exc

    @_at_seam
    def listdir(self, path: PathLike) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _wrap("list", path, exc) from exc

    @_at_seam
    def makedirs(self, path: PathLike, mode: int = 0o750) -> None:
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
        except OSError as exc:
            raise _wrap("mkdir", path, exc) from exc

    @_at_seam
    def rename(self, src: PathLike, dst: PathLike) -> None:
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise _wrap("rename", src, exc) from exc

    @_at_seam
    def fsync_path(self, path: PathLike) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise _wrap("open", path, exc) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EBADF):  # some filesystems refuse dir fsync
                raise _wrap("fsync", path, exc) from exc
        finally:
            os.close(fd)

    @_at_seam
    def remove(self, path: PathLike) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _wrap("remove", path, exc) from exc

    @_at_seam
    def rmtree(self, path: PathLike) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def data(self, op: str, path: PathLike, fn: Callable[[], T]) -> T:
        """Any operation at this seam, metadata (:func:`_at_seam`) or data: wait out a drill's
        stall, then run it; either way, a slow one is recorded."""
        start = time.monotonic()
        self._gate.wait_out(path)
        try:
            return fn()
        finally:
            self._slow.note(op, path, time.monotonic() - start)


_O, _S, _L, _M, _R, _U, _F = (MetaOp.OPEN, MetaOp.STAT, MetaOp.LISTDIR, MetaOp.MKDIR,
                               MetaOp.RENAME, MetaOp.UNLINK, MetaOp.FSYNC)
META_COST: dict[str, dict[MetaOp, int]] = {
    # temp file: create (open), fsync; link into place (rename); unlink the temp; directory
    # open + fsync
    "create_exclusive": {_O: 2, _F: 2, _R: 1, _U: 1},
    # temp file: create (open), fsync; rename over the target; directory open + fsync
    "write_atomic": {_O: 2, _F: 2, _R: 1},
    # temp file: create (open); rename over the target
    "replace_bytes": {_O: 1, _R: 1},
    "read_bytes": {_O: 1},
    "exists": {_S: 1},
    "size": {_S: 1},
    "listdir": {_L: 1},
    "makedirs": {_M: 1},
    "rename": {_R: 1},
    "fsync_path": {_O: 1, _F: 1},
    "remove": {_U: 1},
    # at least the listing and the directory itself; each file inside costs one unlink more,
    # which the seam does not see (rmtree runs only in retention and cleanup)
    "rmtree": {_L: 1, _U: 1},
}
"""The metadata operations each :class:`Storage` call costs as :class:`LocalStorage` does it."""


class CountingStorage:
    """Wraps a :class:`Storage` and counts each call by name, and the metadata operations the
    calls cost (:data:`META_COST`); safe to share between threads (a liveness beat's)."""

    _OPS = ("create_exclusive", "write_atomic", "replace_bytes", "read_bytes", "exists", "size",
            "listdir", "makedirs", "rename", "fsync_path", "remove", "rmtree")

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name not in self._OPS:
            raise AttributeError(name)
        fn = getattr(self.inner, name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            with self._lock:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    def data(self, op: str, path: PathLike, fn: Callable[[], T]) -> T:
        """Data operations cost no metadata operation: passed on uncounted."""
        return self.inner.data(op, path, fn)

    def meta_ops(self) -> collections.Counter[MetaOp]:
        """The metadata operations of every call so far, by kind."""
        with self._lock:
            counts = dict(self.counts)
        out: collections.Counter[MetaOp] = collections.Counter()
        for name, n in counts.items():
            for op, cost in META_COST[name].items():
                out[op] += cost * n
        return out

    def total_meta_ops(self) -> int:
        """Every metadata operation so far."""
        return sum(self.meta_ops().values())

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()


LOCAL_STORAGE = LocalStorage(SHARED_TIER_STALL, SHARED_TIER_SLOW)

STORAGE_OPS: tuple[str, ...] = CountingStorage._OPS
"""The names of every :class:`Storage` metadata operation."""
FAULTABLE_OPS: tuple[str, ...] = STORAGE_OPS + DATA_OPS
"""What a drill's storage fault can name: every metadata and data operation."""


class DeadlineStorage:
    """Wraps a :class:`Storage`: every operation must finish within ``deadline_s``.

    An operation that outlives its deadline (a stuck OST, an NFS server gone) raises
    :class:`~hpcrun.errors.StorageTimeoutError` to the caller, which goes on; the operation
    itself stays blocked in its own daemon thread (a kernel wait cannot be interrupted). While
    ``max_stuck`` operations are still blocked, new ones are refused at once instead of piling
    up more threads on a dead mount.
    """

    def __init__(self, inner: Storage, *, deadline_s: float, max_stuck: int = 4,
                 stuck: set[threading.Thread] | None = None,
                 on_timeout: Callable[[str], None] | None = None) -> None:
        """``stuck`` shares the blocked operations between wrappers of one process (a new
        wrapper per drain round still sees the earlier rounds' stuck threads); ``on_timeout``
        is told each timeout's message before it is raised (to record the fault)."""
        if deadline_s <= 0:
            raise ConfigError(f"storage deadline_s must be > 0, found {deadline_s}; set "
                              "shared_tier.deadline_s to a positive number of seconds")
        self.inner = inner
        self.deadline_s = deadline_s
        self.max_stuck = max_stuck
        self._stuck: set[threading.Thread] = set() if stuck is None else stuck
        self._on_timeout = on_timeout

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in STORAGE_OPS:
            raise AttributeError(name)
        fn = getattr(self.inner, name)
        return lambda *args, **kwargs: self.call(name, fn, *args, **kwargs)

    def data(self, op: str, path: PathLike, fn: Callable[[], T]) -> T:
        """A data operation under the deadline, as every metadata operation."""
        return self.call(op, lambda where: self.inner.data(op, where, fn), path)

    def call(self, op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` under the deadline (``op`` names it in errors)."""
        for done in [t for t in self._stuck if not t.is_alive()]:
            self._stuck.discard(done)
        where = os.fspath(args[0]) if args else "?"
        if len(self._stuck) >= self.max_stuck:
            raise self._timeout(
                f"{op} {where!r} not started: {len(self._stuck)} earlier storage operations "
                f"are still blocked past their {self.deadline_s:g} s deadline; the tier is "
                "hung (check the mount, `lfs check servers`, the NFS server)")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=run, name=f"hpcrun-storage-{op}", daemon=True)
        worker.start()
        worker.join(self.deadline_s)
        if worker.is_alive():
            self._stuck.add(worker)
            raise self._timeout(
                f"{op} {where!r} did not finish within its {self.deadline_s:g} s deadline; the "
                "tier is stuck or overloaded (a hung OST or NFS server); it is retried later")
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]


    def _timeout(self, message: str) -> StorageTimeoutError:
        if self._on_timeout is not None:
            self._on_timeout(message)
        return StorageTimeoutError(message)


class FaultyStorage:
    """Fault injection at the storage seam (drills and tests): while ``while_path`` exists,
    each operation in ``ops`` fails (``fail``) or blocks in the kernel (``stall``: it opens
    the FIFO at ``while_path`` for reading, which waits until a writer opens it, as a hung
    mount does). Other operations go straight to ``inner``."""

    def __init__(self, inner: Storage, *, mode: str, while_path: str,
                 ops: tuple[str, ...] = FAULTABLE_OPS) -> None:
        if mode not in ("fail", "stall"):
            raise ConfigError(f"storage fault mode must be fail or stall, found {mode!r}")
        self.inner, self.mode, self.while_path, self.ops = inner, mode, while_path, ops

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in STORAGE_OPS:
            raise AttributeError(name)
        fn = getattr(self.inner, name)
        if name not in self.ops:
            return fn  # type: ignore[no-any-return]

        def faulty(*args: Any, **kwargs: Any) -> Any:
            self._inject(name, args[0] if args else "?")
            return fn(*args, **kwargs)

        return faulty

    def data(self, op: str, path: PathLike, fn: Callable[[], T]) -> T:
        if op in self.ops:
            self._inject(op, path)
        return self.inner.data(op, path, fn)

    def _inject(self, op: str, path: Any) -> None:
        if not os.path.exists(self.while_path):
            return
        if self.mode == "fail":
            raise StorageError(f"{op} {os.fspath(path)!r} failed: shared tier unwritable "
                               f"(injected while {self.while_path} exists)")
        with open(self.while_path, "rb"):  # blocks until the drill opens the FIFO for writing
            time.sleep(0)

