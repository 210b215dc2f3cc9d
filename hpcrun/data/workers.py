"""Reader processes: whole batches made in worker processes, handed over in shared memory.

Threads do not scale here: planning a batch and the numpy calls between the large copies are
Python under one GIL, which the training loop needs too. :class:`ProcessBatches` runs ``W``
worker processes; worker ``w`` makes batches ``start + w, start + w + W, ...`` (each worker
walks the pure global order itself, so nothing depends on ``W``) and writes each into one of its
``depth`` slots of a shared-memory block. The parent takes batch ``k`` from worker
``(k - start) % W``, copies it out and hands the slot back: batches come out strictly in order,
and at most ``W × depth`` are made ahead (the memory bound).

Workers are started with ``spawn`` (no inherited threads or CUDA state), ignore the preemption
signals their rank handles, die with their parent (``PR_SET_PDEATHSIG``), and are stopped by
PID on :meth:`ProcessBatches.close`, on any error, when the pipeline is collected and at
interpreter exit; a rank that is killed leaves no reader behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Protocol

import numpy as np

from hpcrun.errors import ArgumentError, DataError

__all__ = ["BatchProducer", "ProcessBatches", "SlotLayout", "reader_workers"]

_PR_SET_PDEATHSIG = 1
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


class BatchProducer(Protocol):
    """What a worker runs (picklable): the batches of one worker, in order."""

    def produce(self, start: int, state: dict[str, Any] | None, worker: int,
                stride: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(k, arrays)`` for ``k = start + worker, start + worker + stride, ...``
        (``arrays`` matches the :class:`SlotLayout` plus ``tokens_read``); stop at the end."""
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
    shm_name: str
    worker: int
    stride: int
    depth: int
    start: int
    state: dict[str, Any] | None
    parent: int


class ProcessBatches(Iterator[dict[str, Any]]):
    """Batches from ``workers`` processes, in order, at most ``workers × depth`` ahead.

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
        self._shm = SharedMemory(create=True, size=max(1, layout.nbytes * workers * depth))
        self._conns: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._shm)
        self._ended = False
        self.retries = 0
        try:
            self._spawn(producer, state)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """PIDs of the worker processes."""
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def ready(self) -> int:
        """Workers with a finished batch waiting (the queue depth seen by the consumer)."""
        return sum(1 for c in self._conns if not c.closed and c.poll())

    def __next__(self) -> dict[str, Any]:
        if self._ended:
            raise StopIteration
        w = (self._next - self._start) % self.workers
        msg = self._receive(w)
        if msg[0] == "end":
            self._ended = True
            raise StopIteration
        _, k, slot, tokens_read, retries = msg
        if k != self._next:
            self.close()
            raise DataError(f"reader process {w} delivered batch {k}, expected {self._next}; "
                            "this is a bug")
        offset = (w * self.depth + slot) * self.layout.nbytes
        out: dict[str, Any] = {name: view.copy() for name, view in
                               self.layout.views(self._shm.buf, offset).items()}
        out["tokens_read"] = tokens_read
        self.retries += retries
        self._conns[w].send(slot)
        self._next += 1
        return out

    def close(self) -> None:
        """Stop every worker (by PID when it does not exit at once) and free the memory."""
        self._finalizer()

    def _spawn(self, producer: BatchProducer, state: dict[str, Any] | None) -> None:
        ctx = mp.get_context("spawn")
        for w in range(self.workers):
            parent_end, child_end = ctx.Pipe()
            args = _WorkerArgs(producer=producer, layout=self.layout, shm_name=self._shm.name,
                               worker=w, stride=self.workers, depth=self.depth,
                               start=self._start, state=state, parent=os.getpid())
            proc = ctx.Process(target=_worker_main, args=(args, child_end), daemon=True,
                               name=f"hpcrun-reader-{w}")
            proc.start()
            child_end.close()
            self._conns.append(parent_end)
            self._procs.append(proc)

    def _receive(self, w: int) -> tuple[Any, ...]:
        conn, proc = self._conns[w], self._procs[w]
        while not conn.poll(_POLL_S):
            if not proc.is_alive():
                self.close()
                raise DataError(f"reader process {w} (pid {proc.pid}) exited with "
                                f"{proc.exitcode} before batch {self._next}; see the rank's "
                                "stderr for why, or use executor='thread'")
        try:
            msg: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise DataError(f"reader process {w} (pid {proc.pid}) closed its pipe before "
                            f"batch {self._next} ({exc!r}); see the rank's stderr") from exc
        if msg[0] == "error":
            self.close()
            raise DataError(f"reader process {w} failed on batch {self._next}: {msg[1]}")
        return msg


def _shutdown(procs: list[mp.process.BaseProcess], conns: list[Connection],
              shm: SharedMemory) -> None:
    """Ask each worker to stop, then SIGKILL by PID whatever is still alive; free memory."""
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.join()
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()
    with contextlib.suppress(FileNotFoundError):
        shm.close()
        shm.unlink()


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _worker_main(args: _WorkerArgs, conn: Connection) -> None:
    """A reader process: make this worker's batches into free slots until told to stop."""
    _die_with_parent(args.parent)
    # The rank handles preemption and interrupts; its readers stop when it closes them.
    for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    shm = SharedMemory(name=args.shm_name)
    try:
        _serve(args, conn, shm)
    except Exception as exc:  # reported to the parent, which raises it as a DataError
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        shm.close()


def _serve(args: _WorkerArgs, conn: Connection, shm: SharedMemory) -> None:
    free = list(range(args.depth))
    batches = args.producer.produce(args.start, args.state, args.worker, args.stride)
    while True:
        while not free or conn.poll():
            msg = conn.recv()
            if msg is None:
                return
            free.append(msg)
        got = next(batches, None)
        if got is None:
            conn.send(("end",))
            while conn.recv() is not None:
                pass
            return
        k, arrays = got
        slot = free.pop(0)
        offset = (args.worker * args.depth + slot) * args.layout.nbytes
        for name, view in args.layout.views(shm.buf, offset).items():
            view[...] = arrays[name]
        conn.send(("batch", k, slot, int(arrays["tokens_read"]), int(arrays.get("retries", 0))))
