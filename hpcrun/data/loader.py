"""The physical plane: parallel reads, emitted strictly in order, with bounded memory.

:class:`OrderedReader` runs ``fn(item)`` on a pool of threads or processes. Each item is tagged
with its sequence number; results that finish early wait in a reorder buffer until every
earlier one is emitted. At most ``max_inflight`` items are submitted-but-not-emitted at any time
(running, finished-and-waiting, or queued), so memory is bounded by ``max_inflight`` results
and a slow consumer stops the reads (backpressure). Arrival order never reaches the output.

:class:`LoaderMetrics` collects time-to-batch quantiles, input wait per step, queue depth,
bytes and samples per second and retries, and checks the required rate
``R_req = tokens per step / target step time``. It also keeps the input wait of the batches
handed out since the last :meth:`LoaderMetrics.take_input_wait`, which is how a training step
learns how long it waited for its batch (``ctx.step_done`` takes it).
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ArgumentError

__all__ = ["InlineExecutor", "LoaderMetrics", "OrderedReader", "RateCheck", "ReadAhead",
           "call_with_retries"]

T = TypeVar("T")
U = TypeVar("U")


def call_with_retries(fn: Callable[[T], U], item: T, retries: int, backoff_s: float,
                      clock: Clock = SYSTEM_CLOCK) -> tuple[U, int]:
    """``fn(item)``, retried on ``OSError`` with doubling backoff; returns (result, retries).

    Only I/O errors are retried: a :class:`~hpcrun.errors.DataError` (changed object, bad
    record) is deterministic and surfaces at once.
    """
    for attempt in range(retries):
        try:
            return fn(item), attempt
        except OSError:
            clock.sleep(backoff_s * 2**attempt)
    return fn(item), retries


class OrderedReader(Generic[T, U], Iterator[U]):
    """Parallel ``map(fn, items)`` that yields in item order with at most ``max_inflight``
    items outstanding.

    Args:
        fn: The read; must be picklable (a module-level function) for a process pool.
        items: Work items, consumed lazily (only as the window allows).
        workers: Pool size when no executor is given (threads).
        max_inflight: Bound on submitted-but-not-emitted items (the memory bound).
        executor: A pool to use instead (e.g. a ``ProcessPoolExecutor``); not shut down here.
        retries: Retries per item on ``OSError``.
        backoff_s: First retry delay.
        clock: Time source of the retry backoff.
    """

    def __init__(self, fn: Callable[[T], U], items: Iterable[T], *, workers: int = 4,
                 max_inflight: int = 16, executor: Executor | None = None, retries: int = 2,
                 backoff_s: float = 0.05, clock: Clock = SYSTEM_CLOCK) -> None:
        if workers < 1 or max_inflight < 1:
            raise ArgumentError(f"workers and max_inflight must be >= 1, found workers "
                                f"{workers}, max_inflight {max_inflight}")
        self._fn, self._items = fn, iter(items)
        self._own = executor is None
        self._pool = executor or ThreadPoolExecutor(max_workers=workers,
                                                    thread_name_prefix="hpcrun-read")
        self.max_inflight, self._retries, self._backoff, self._clock = (
            max_inflight, retries, backoff_s, clock)
        self._window: collections.deque[tuple[int, Future[tuple[U, int]]]] = collections.deque()
        self._next_seq = self._emitted = 0
        self._exhausted = False
        self.retries = 0
        """Retries spent so far."""
        self.peak_inflight = 0
        """Most items outstanding at once (never above ``max_inflight``)."""

    def __next__(self) -> U:
        self._fill()
        if not self._window:
            raise StopIteration
        seq, fut = self._window.popleft()
        assert seq == self._emitted, "reorder buffer out of sequence"
        value, used = fut.result()
        self._emitted += 1
        self.retries += used
        self._fill()
        return value

    @property
    def ready(self) -> int:
        """Finished reads waiting in the reorder buffer (the queue depth)."""
        return sum(1 for _, f in self._window if f.done())

    @property
    def inflight(self) -> int:
        return len(self._window)

    def close(self) -> None:
        """Cancel queued reads and drop buffered results (used before a restore)."""
        for _, fut in self._window:
            fut.cancel()
        self._window.clear()
        if self._own:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _fill(self) -> None:
        while not self._exhausted and len(self._window) < self.max_inflight:
            try:
                item = next(self._items)
            except StopIteration:
                self._exhausted = True
                break
            fut = self._pool.submit(call_with_retries, self._fn, item, self._retries,
                                    self._backoff, self._clock)
            self._window.append((self._next_seq, fut))
            self._next_seq += 1
            self.peak_inflight = max(self.peak_inflight, len(self._window))


class InlineExecutor(Executor):
    """Runs each call inside ``submit()``, on the caller's thread.

    With one reader the pool thread is only a hand-off (a future, a wake-up, a GIL switch per
    batch); the background thread that plans the batches reads them itself instead.
    """

    def submit(self, fn: Callable[..., U], /, *args: Any, **kwargs: Any) -> Future[U]:
        fut: Future[U] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered through the future, like a pool's
            fut.set_exception(exc)
        return fut


@dataclass(frozen=True, slots=True)
class _Raised:
    exc: BaseException


_END = object()


class ReadAhead(Iterator[T]):
    """``items`` produced by a background thread, at most ``depth`` ahead of the consumer.

    Keeps sequential work (planning the next batches, waiting for reads) off the consumer's
    ``next()``. Items come out in order; an exception of the producer is raised at the
    consumer's ``next()`` in its place.

    The hand-off is two C-level queues (``queue.SimpleQueue``): items one way, room tokens the
    other. Taking a ready item locks nothing written in Python, so the consumer never waits
    on a Python mutex that the producer holds while it waits for the GIL.
    """

    def __init__(self, items: Iterable[T], *, depth: int, name: str = "hpcrun-plan") -> None:
        if depth < 1:
            raise ArgumentError(f"read-ahead depth must be >= 1, found {depth}")
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(depth):
            self._room.put(None)
        self._stopping = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(iter(items),), name=name,
                                        daemon=True)
        self._thread.start()

    @property
    def ready(self) -> int:
        """Items produced and not yet taken."""
        return self._items.qsize()

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._items.get()
        self._room.put(None)
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Raised):
            self._done = True
            raise item.exc
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the producer and wait for it (it finishes the item in hand, then exits)."""
        self._stopping.set()
        self._room.put(None)
        self._thread.join()
        self._done = True

    def _run(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Raised(exc))
            return
        self._put(_END)

    def _put(self, item: object) -> bool:
        while not self._stopping.is_set():
            with contextlib.suppress(queue.Empty):
                self._room.get(timeout=0.05)
                if self._stopping.is_set():
                    return False
                self._items.put(item)
                return True
        return False


@dataclass(frozen=True, kw_only=True, slots=True)
class RateCheck:
    """Does the loader keep up with the step rate the run needs?"""

    required_tokens_per_s: float
    """``R_req = tokens per step / target step time``."""
    delivered_tokens_per_s: float
    """Measured delivery rate of this loader (tokens over time spent producing batches)."""

    @property
    def ok(self) -> bool:
        return self.delivered_tokens_per_s >= self.required_tokens_per_s

    def describe(self) -> str:
        verdict = "meets" if self.ok else "MISSES"
        return (f"loader {verdict} the required rate: delivers "
                f"{self.delivered_tokens_per_s:,.0f} tokens/s, needs "
                f"{self.required_tokens_per_s:,.0f} tokens/s")


class LoaderMetrics:
    """Per-batch delivery metrics (thread-safe; one instance per pipeline)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.time_to_batch: list[float] = []
        self.input_wait: list[float] = []
        self.queue_depth: list[int] = []
        self.bytes = self.samples = self.tokens = self.retries = 0
        self._start: float | None = None
        self._pending_wait = 0.0

    def record(self, *, time_to_batch: float, input_wait: float, queue_depth: int,
               nbytes: int, samples: int, tokens: int) -> None:
        """Account one delivered batch."""
        with self._lock:
            if self._start is None:
                self._start = self._clock.monotonic() - time_to_batch
            self.time_to_batch.append(time_to_batch)
            self.input_wait.append(input_wait)
            self._pending_wait += input_wait
            self.queue_depth.append(queue_depth)
            self.bytes += nbytes
            self.samples += samples
            self.tokens += tokens

    def take_input_wait(self) -> float:
        """Seconds the caller waited for batches handed out since the previous call; resets."""
        with self._lock:
            wait, self._pending_wait = self._pending_wait, 0.0
            return wait

    def summary(self) -> dict[str, Any]:
        """Quantiles and rates so far (JSON-serialisable)."""
        with self._lock:
            elapsed = (self._clock.monotonic() - self._start) if self._start is not None else 0
            ttb = np.asarray(self.time_to_batch or [0.0])
            p50, p95, p99 = (float(v) for v in np.quantile(ttb, [0.5, 0.95, 0.99]))
            def rate(x: float) -> float:
                return x / elapsed if elapsed > 0 else 0.0

            return {"batches": len(self.time_to_batch), "time_to_batch_p50_s": p50,
                    "time_to_batch_p95_s": p95, "time_to_batch_p99_s": p99,
                    "input_wait_mean_s": float(np.mean(self.input_wait or [0.0])),
                    "input_wait_total_s": float(np.sum(self.input_wait)),
                    "queue_depth_mean": float(np.mean(self.queue_depth or [0])),
                    "queue_depth_max": int(max(self.queue_depth, default=0)),
                    "bytes_per_s": rate(self.bytes), "samples_per_s": rate(self.samples),
                    "tokens_per_s": rate(self.tokens), "retries": self.retries}

    def rate_check(self, *, tokens_per_step: int, target_step_time_s: float) -> RateCheck:
        """Compare the delivered token rate with ``tokens_per_step / target_step_time_s``."""
        if tokens_per_step < 1 or target_step_time_s <= 0:
            raise ArgumentError(f"tokens_per_step must be >= 1 and target_step_time_s > 0, "
                                f"found {tokens_per_step} and {target_step_time_s}")
        return RateCheck(required_tokens_per_s=tokens_per_step / target_step_time_s,
                         delivered_tokens_per_s=self.summary()["tokens_per_s"])
