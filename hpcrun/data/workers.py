"""Reader processes: whole batches made in worker processes, handed over in shared memory.

Threads do not scale here: planning a batch and the numpy calls between the large copies are
Python under one GIL, which the training loop needs too. :class:`ProcessBatches` runs ``W``
worker processes; worker ``w`` makes batches ``start + w, start + w + W, ...`` (each worker
walks the pure global order itself, so nothing depends on ``W``) and writes each into one of its
``depth`` slots of a shared-memory block. The parent takes batch ``k`` from worker
``(k - start) % W``, copies it out and hands the slot back: batches come out strictly in order,
and at most ``W × depth`` are made ahead (the memory bound).

Workers are fresh interpreters (``python -m hpcrun.data.workers``: no inherited threads or CUDA
state, and unlike ``multiprocessing``'s spawn the training script is never re-imported), talk
to the parent over a socket pair, ignore the preemption signals their rank handles, die with
their parent (``PR_SET_PDEATHSIG``), and are stopped by PID on :meth:`ProcessBatches.close`, on
any error, when the pipeline is collected and at interpreter exit; a rank that is killed leaves
no reader behind. The producer (and a transform in it) must be importable by module name.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hpcrun.data.buffers import BufferPool
from hpcrun.errors import ArgumentError, DataError

__all__ = ["BatchProducer", "Fill", "ProcessBatches", "SlotLayout", "reader_workers"]

_PR_SET_PDEATHSIG = 1
_POOL_MIN_BYTES = 128 << 10
"""Batches from this size are copied into recycled arrays; smaller ones come from the heap
(below glibc's ``mmap`` threshold: no page faults), which is cheaper than the pool's check."""
_MSG = struct.Struct("<5q")
"""A worker's message: kind, batch, slot, tokens read, retries (error: kind, text length)."""
_BATCH, _END, _ERROR = 0, 1, 2
_SLOT = struct.Struct("<q")
"""The parent's message: a slot handed back, or -1 = stop."""
_STOP_GRACE_S = 2.0
_POLL_S = 0.5


def reader_workers(reserve: int = 1, cap: int = 8) -> int:
    """Reader workers this rank's CPU share allows: its allowed CPUs minus ``reserve`` for the
    training loop (at least 1, at most ``cap``).

    Slurm binds each task to its CPUs (cgroup cpuset); ``sched_getaffinity`` sees exactly
    those, where ``os.cpu_count()`` would count the whole node.
    """
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = os.cpu_count() or 1
    return max(1, min(cap, allowed - reserve))


Fill = Callable[[dict[str, np.ndarray]], tuple[int, int]]
"""Writes one batch into the given arrays (a shared slot, :class:`SlotLayout`'s views) and
returns ``(tokens read, read retries spent)``."""


class BatchProducer(Protocol):
    """What a worker runs (picklable): the batches of one worker, in order."""

    def produce(self, start: int, state: dict[str, Any] | None, worker: int,
                stride: int) -> Iterator[tuple[int, Fill]]:
        """Yield ``(k, fill)`` for ``k = start + worker, start + worker + stride, ...``;
        ``fill`` writes batch ``k`` into a slot in place. Stop at the end."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotLayout:
    """The arrays of one batch: names, shape and dtypes (one slot of shared memory)."""

    shape: tuple[int, int]
    """``(rows, seq_len)`` of every array."""
    dtypes: tuple[tuple[str, str], ...]
    """``(name, numpy dtype string)`` per array, in slot order."""

    @property
    def nbytes(self) -> int:
        n = self.shape[0] * self.shape[1]
        return sum(n * np.dtype(dt).itemsize for _, dt in self.dtypes)

    def views(self, buf: memoryview, offset: int) -> dict[str, np.ndarray]:
        """Arrays over slot bytes starting at ``offset`` of ``buf``."""
        out, at = {}, offset
        for name, dt in self.dtypes:
            arr = np.ndarray(self.shape, dtype=np.dtype(dt), buffer=buf, offset=at)
            out[name] = arr
            at += arr.nbytes
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _WorkerArgs:
    producer: BatchProducer
    layout: SlotLayout
    size: int
    worker: int
    stride: int
    depth: int
    start: int
    state: dict[str, Any] | None
    parent: int


class ProcessBatches(Iterator[dict[str, Any]]):
    """Batches from ``workers`` processes, in order, at most ``workers × depth`` ahead.

    Per batch the parent reads one fixed-size message (no pickling), copies the slot out
    (large batches into recycled arrays, :class:`~hpcrun.data.buffers.BufferPool`: no fresh
    pages) and hands the slot back with one 8-byte write.

    Args:
        producer: Makes the batches (picklable; re-opens its data in the worker).
        layout: The arrays of one batch.
        start: First batch index.
        state: Position state at ``start`` for the producer (``None``: computed from 0).
        workers: Worker processes.
        depth: Slots (batches made ahead) per worker.
    """

    def __init__(self, producer: BatchProducer, layout: SlotLayout, *, start: int,
                 state: dict[str, Any] | None, workers: int, depth: int) -> None:
        if workers < 1 or depth < 1:
            raise ArgumentError(f"need workers >= 1 and depth >= 1, found {workers}, {depth}")
        self.layout, self.workers, self.depth = layout, workers, depth
        self._start = self._next = start
        self._fd, self._shm = _shared_block(max(1, layout.nbytes * workers * depth))
        self._socks: list[socket.socket] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._socks, self._shm,
                                           self._fd)
        self._views = [[layout.views(memoryview(self._shm), (w * depth + slot) * layout.nbytes)
                        for slot in range(depth)] for w in range(workers)]
        self._buffers = (BufferPool(layout.shape, layout.dtypes, keep=workers * depth + 5)
                         if layout.nbytes >= _POOL_MIN_BYTES else None)
        self._ended = False
        self._early = b""  # the next batch's message, read ahead by ``ready``
        self.retries = 0
        try:
            self._spawn(producer, state)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """PIDs of the worker processes."""
        return [p.pid for p in self._procs]

    @property
    def ready(self) -> int:
        """1 when the next batch is already waiting, else 0 (the queue depth the consumer
        sees). Its message is read ahead without blocking, so asking costs no extra call."""
        if self._ended or not self._socks:
            return 0
        w = (self._next - self._start) % self.workers
        if len(self._early) < _MSG.size:
            with contextlib.suppress(OSError):  # nothing yet, or a dead worker next() reports
                self._early += self._socks[w].recv(_MSG.size - len(self._early),
                                                   socket.MSG_DONTWAIT)
        return int(len(self._early) >= _MSG.size)

    def __next__(self) -> dict[str, Any]:
        if self._ended:
            raise StopIteration
        w = (self._next - self._start) % self.workers
        kind, k, slot, tokens_read, retries = _MSG.unpack(self._receive(w, _MSG.size))
        if kind == _END:
            self._ended = True
            raise StopIteration
        if kind == _ERROR:
            text = self._receive(w, k).decode(errors="replace")
            self.close()
            raise DataError(f"reader process {w} failed on batch {self._next}: {text}")
        if k != self._next:
            self.close()
            raise DataError(f"reader process {w} delivered batch {k}, expected {self._next}; "
                            "this is a bug")
        out = self._copy_out(self._views[w][slot])
        self._socks[w].sendall(_SLOT.pack(slot))
        out["tokens_read"] = tokens_read
        self.retries += retries
        self._next += 1
        return out

    def _copy_out(self, views: dict[str, np.ndarray]) -> dict[str, Any]:
        if self._buffers is None:  # small batches: the heap serves them without faults
            return {name: view.copy() for name, view in views.items()}
        out: dict[str, Any] = self._buffers.take()
        for name, view in views.items():
            np.copyto(out[name], view)
        return out

    def close(self) -> None:
        """Stop every worker (by PID when it does not exit at once) and free the memory."""
        self._views = []
        self._finalizer()

    def _spawn(self, producer: BatchProducer, state: dict[str, Any] | None) -> None:
        for w in range(self.workers):
            mine, theirs = socket.socketpair()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", _ENTRY, str(theirs.fileno()), str(self._fd)],
                    pass_fds=(theirs.fileno(), self._fd), stdin=subprocess.DEVNULL)
            finally:
                theirs.close()
            self._procs.append(proc)
            self._socks.append(mine)
            # Transient setup over our own socket pair (never persisted): the producer and
            # where to import it from.
            setup = pickle.dumps((list(sys.path), _WorkerArgs(
                producer=producer, layout=self.layout, size=len(self._shm), worker=w,
                stride=self.workers, depth=self.depth, start=self._start, state=state,
                parent=os.getpid())))
            mine.sendall(_SLOT.pack(len(setup)) + setup)

    def _receive(self, w: int, n: int) -> bytes:
        """Exactly ``n`` bytes from worker ``w``; a dead worker or a closed pipe raises."""
        sock, proc = self._socks[w], self._procs[w]
        data, self._early = self._early[:n], self._early[n:]
        while len(data) < n:
            try:
                chunk = sock.recv(n - len(data), socket.MSG_DONTWAIT)
            except BlockingIOError:
                self._wait(w)
                continue
            except OSError as exc:
                self.close()
                raise DataError(f"reader process {w} (pid {proc.pid}) closed its pipe before "
                                f"batch {self._next} ({exc!r}); see the rank's stderr") from exc
            if not chunk:
                self._wait_exit(w)
            data += chunk
        return data

    def _wait(self, w: int) -> None:
        """Block until worker ``w`` has something to say, checking that it still lives."""
        sock, proc = self._socks[w], self._procs[w]
        while not select.select([sock], [], [], _POLL_S)[0]:
            if proc.poll() is not None:
                self._wait_exit(w)

    def _wait_exit(self, w: int) -> None:
        proc = self._procs[w]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_STOP_GRACE_S)
        code = proc.returncode
        self.close()
        raise DataError(f"reader process {w} (pid {proc.pid}) exited with {code} before batch "
                        f"{self._next}; see the rank's stderr for why, or use executor='thread'")


def _shared_block(size: int) -> tuple[int, mmap.mmap]:
    """An anonymous shared file (nothing to clean up if we die) and our mapping of it."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("hpcrun-batches")
    else:  # no memfd: an unlinked temporary file is just as anonymous
        fd, path = tempfile.mkstemp(prefix="hpcrun-batches-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


def _shutdown(procs: list[subprocess.Popen[bytes]], socks: list[socket.socket],
              shm: mmap.mmap, fd: int) -> None:
    """Ask each worker to stop, then SIGKILL by PID whatever is still alive; free memory."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.sendall(_SLOT.pack(-1))
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    for sock in socks:
        sock.close()
    procs.clear()
    socks.clear()
    with contextlib.suppress(BufferError):  # a view still exported: freed with it
        shm.close()
    with contextlib.suppress(OSError):
        os.close(fd)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


_ENTRY = ("import sys; from hpcrun.data.workers import main; "
          "main(int(sys.argv[1]), int(sys.argv[2]))")


def main(fd: int, shared_fd: int) -> None:
    """A reader process: make this worker's batches into free slots until told to stop."""
    # The rank handles preemption and interrupts; its readers stop when it closes them.
    for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        head = _read_exact(sock, _SLOT.size)
        body = None if head is None else _read_exact(sock, _SLOT.unpack(head)[0])
        if body is None:  # the parent is gone before it sent the setup
            return
        path, args = pickle.loads(body)
        sys.path[:] = path
        _die_with_parent(args.parent)
        shm = mmap.mmap(shared_fd, args.size)
        _serve(args, sock, memoryview(shm))
    except Exception as exc:  # reported to the parent, which raises it as a DataError
        text = f"{type(exc).__name__}: {exc}".encode()
        with contextlib.suppress(OSError):  # the parent is gone: nothing to report to
            sock.sendall(_MSG.pack(_ERROR, len(text), 0, 0, 0) + text)


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or ``None`` when the parent closed the pipe first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _slot_back(sock: socket.socket) -> int:
    """The next slot the parent handed back; -1 = stop (or the parent is gone)."""
    data = _read_exact(sock, _SLOT.size)
    return -1 if data is None else int(_SLOT.unpack(data)[0])


def _serve(args: _WorkerArgs, sock: socket.socket, shm: memoryview) -> None:
    views = [args.layout.views(shm, (args.worker * args.depth + slot) * args.layout.nbytes)
             for slot in range(args.depth)]
    free = list(range(args.depth))
    batches = args.producer.produce(args.start, args.state, args.worker, args.stride)
    while True:
        while not free or select.select([sock], [], [], 0)[0]:
            slot = _slot_back(sock)
            if slot < 0:
                return
            free.append(slot)
        got = next(batches, None)
        if got is None:
            sock.sendall(_MSG.pack(_END, 0, 0, 0, 0))
            while _slot_back(sock) >= 0:
                pass
            return
        k, fill = got
        slot = free.pop(0)
        tokens_read, retries = fill(views[slot])
        sock.sendall(_MSG.pack(_BATCH, k, slot, tokens_read, retries))
