"""The user-facing data pipeline: this replica's slice of global batch k, resumable exactly.

``DataPipeline(dataset, seed=..., global_batch=G, seq_len=L, replica=r, num_replicas=R)`` is an
iterator of batches and a :class:`~hpcrun.protocols.Stateful`. Its ``state_dict()`` is the
cursor of the next batch not yet delivered to the caller: prefetched-but-undelivered batches
never count, so a checkpoint taken at a step boundary after ``k`` batches resumes at batch ``k``.
``load_state_dict()`` validates dataset ID, algorithm version and layout, discards prefetched
reads and rebuilds from the restored position. ``R`` may differ between save and restore.

Each ``next()`` measures how long the caller waited for the batch (the reorder buffer was empty);
:meth:`DataPipeline.take_input_wait` hands that time over once. A pipeline registered with
``ctx.restore(data=pipe)`` is asked by ``ctx.step_done()``, so every step event carries the
step's input wait without any change to the training loop.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.data.assemble import assemble, slice_segments
from hpcrun.data.batches import DocStream, GlobalOrder, OrderState, replica_rows
from hpcrun.data.buffers import BufferPool
from hpcrun.data.cursor import DataCursor
from hpcrun.data.dataset import Dataset, Verify
from hpcrun.data.loader import (
    InlineExecutor,
    LoaderMetrics,
    OrderedReader,
    ReadAhead,
    call_with_retries,
)
from hpcrun.data.mixture import Exhaustion, MixMode, Mixture, MixUnit
from hpcrun.data.packing import PackingPolicy
from hpcrun.data.workers import Fill, ProcessBatches, SlotLayout, reader_workers
from hpcrun.errors import ArgumentError, DataError, OutOfRangeError

__all__ = ["THREAD_READERS", "DataPipeline", "MixtureSpec", "sample_rng"]

Transform = Callable[[np.ndarray, np.random.Generator], np.ndarray]
"""A stochastic, length-preserving transform of one document's tokens."""

THREAD_READERS = 1
"""Reader threads when ``workers`` is not given: planning and assembly are Python under one
GIL, so on data in the page cache more threads only add contention (measured: 2 or 4 threads
deliver 0.5-0.7x the tokens/s of one). Reads that block on a slow tier can still use
more: pass ``workers``."""

_VERIFY_DRAWS = 1 << 16
"""Restored positions up to this many draws are checked against the order
(:meth:`~hpcrun.data.batches.GlobalOrder.mismatch`: one vectorized pass over the draws'
lengths and the mixture state, no batch planned)."""


def sample_rng(seed: int, sample_id: int, epoch: int) -> np.random.Generator:
    """The random stream of one sample in one epoch: never of a worker or of arrival order."""
    return np.random.default_rng([seed, sample_id, epoch, 0x7472616E])


@dataclass(frozen=True, kw_only=True, slots=True)
class MixtureSpec:
    """How sources are mixed (user-facing; resolved against the dataset's sources)."""

    weights: Mapping[str, float] | Sequence[float] | None = None
    """Per source, by name or in manifest order; ``None`` = proportional to record counts."""
    mode: MixMode = MixMode.EXACT
    """``exact`` quotas (Tijdeman) or ``categorical`` draws."""
    exhaustion: Exhaustion = Exhaustion.REPEAT
    """What a source does when it runs out of records."""
    unit: MixUnit = MixUnit.SAMPLES
    """Weights are shares of samples or of tokens."""

    def build(self, dataset: Dataset, seed: int) -> Mixture:
        """The :class:`Mixture` for ``dataset``'s sources."""
        names = [s.name for s in dataset.sources]
        weights = self._weights(names, dataset)
        return Mixture(weights, mode=self.mode, seed=seed, exhaustion=self.exhaustion,
                       sizes=[s.size for s in dataset.sources], unit=self.unit,
                       mean_tokens=[max(s.mean_tokens, 1e-9) for s in dataset.sources])

    def _weights(self, names: list[str], dataset: Dataset) -> list[float]:
        if self.weights is None:
            return [float(s.size) for s in dataset.sources]
        if isinstance(self.weights, Mapping):
            if set(self.weights) != set(names):
                raise DataError(f"mixture weights name {sorted(self.weights)}, the dataset has "
                                f"sources {names}; give one weight per source")
            return [float(self.weights[n]) for n in names]
        return [float(w) for w in self.weights]


@dataclass(frozen=True, slots=True)
class _BatchTask:
    batch: int
    table: np.ndarray  # SLICE_DTYPE: this replica's segments of global batch ``batch``


BATCH_ARRAYS = (("tokens", "int64"), ("document", "int32"), ("position", "int64"))
"""The arrays of one replica slice, in shared-memory slot order."""


class _BatchReader:
    """Assembles one replica slice (picklable: a process re-opens the dataset by path)."""

    def __init__(self, dataset: Dataset, *, rows: int, seq_len: int, pad_id: int, seed: int,
                 transform: Transform | None, keep: int = 4, as_torch: bool = False) -> None:
        self.dataset: Dataset | None = dataset
        self.path = str(dataset.manifest_path)
        self.rows, self.seq_len, self.pad_id = rows, seq_len, pad_id
        self.seed, self.transform, self.keep, self.as_torch = seed, transform, keep, as_torch
        self._buffers: BufferPool | None = self._pool()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["dataset"] = state["_buffers"] = None
        return state

    def __call__(self, task: _BatchTask, out: Mapping[str, np.ndarray] | None = None
                 ) -> dict[str, Any]:
        """The slice's arrays, written into ``out`` or into recycled buffers."""
        ds = self.dataset or _worker_dataset(self.path)
        pooled = out is None
        if out is None:
            if self._buffers is None:  # unpickled: a reader process's own pool
                self._buffers = self._pool()
            out = self._buffers.take()
        arrays = assemble(ds, task.table, rows=self.rows, seq_len=self.seq_len,
                          pad_id=self.pad_id, out=out,
                          document=None if self.transform is None else self._document)
        # Converted here, on the reader thread: the caller's next() does nothing more.
        return _as_torch(arrays) if pooled and self.as_torch else arrays

    def _pool(self) -> BufferPool:
        return BufferPool((self.rows, self.seq_len), BATCH_ARRAYS, keep=self.keep)

    def _document(self, ds: Dataset, seg: np.void) -> np.ndarray:
        tokens = ds.read(int(seg["source"]), int(seg["record"]))
        assert self.transform is not None
        out = np.asarray(self.transform(tokens, sample_rng(self.seed, int(seg["sample_id"]),
                                                           int(seg["epoch"]))))
        if out.shape != tokens.shape:
            raise DataError(f"transform changed sample {int(seg['sample_id'])} from "
                            f"{tokens.shape} to {out.shape} tokens; packed transforms must keep "
                            "the length")
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _BatchProducer:
    """A reader process's share of the batches: it walks the pure global order itself."""

    manifest: str
    seed: int
    global_batch: int
    seq_len: int
    rows: tuple[int, int]
    mixture: MixtureSpec
    packing: str
    pad_id: int
    transform: Transform | None

    def produce(self, start: int, state: dict[str, Any] | None, worker: int,
                stride: int) -> Iterator[tuple[int, Fill]]:
        ds = _worker_dataset(self.manifest)
        order = _global_order(ds, self.mixture, seed=self.seed, global_batch=self.global_batch,
                              seq_len=self.seq_len, packing=PackingPolicy(self.packing))
        if state is not None:
            order.remember(OrderState.from_dict(state))
        read = _BatchReader(ds, rows=self.rows[1] - self.rows[0], seq_len=self.seq_len,
                            pad_id=self.pad_id, seed=self.seed, transform=self.transform)
        rows = range(*self.rows)
        for k in itertools.count(start + worker, stride):
            plan = order.plan(k)
            if plan is None:
                return
            yield k, functools.partial(_fill_slot, read, _BatchTask(k, slice_segments(plan,
                                                                                       rows)))


def _fill_slot(read: _BatchReader, task: _BatchTask,
               out: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """Assemble ``task`` into a shared slot; returns (tokens read, retries spent)."""
    arrays, retries = call_with_retries(functools.partial(read, out=out), task, 2, 0.05)
    return int(arrays["tokens_read"]), retries


def _as_torch(batch: dict[str, Any]) -> dict[str, Any]:
    """``torch`` tensors over the arrays (no copy; a tensor keeps its array referenced, so a
    recycled buffer is never reused while any tensor or view of it lives)."""
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for k, v in batch.items()}


def _converted(batches: Iterator[dict[str, Any]], as_torch: bool
               ) -> Iterator[dict[str, Any]]:
    """``batches`` as tensors when asked (made on the thread that iterates this)."""
    return (_as_torch(b) for b in batches) if as_torch else batches


def _plan_tasks(order: GlobalOrder, lock: threading.Lock, rows: range, start: int,
                submitted: dict[int, float], clock: Clock) -> Iterator[_BatchTask]:
    """Read tasks of batches ``start, start+1, ...`` until the stream ends."""
    for k in itertools.count(start):
        with lock:
            plan = order.plan(k)
        if plan is None:
            return
        submitted[k] = clock.monotonic()
        yield _BatchTask(batch=k, table=slice_segments(plan, rows))


def _global_order(dataset: Dataset, spec: MixtureSpec, *, seed: int, global_batch: int,
                  seq_len: int, packing: PackingPolicy) -> GlobalOrder:
    stream = DocStream(dataset.sources, spec.build(dataset, seed), seed=seed,
                       salt=dataset.dataset_id)
    return GlobalOrder(stream, global_batch=global_batch, seq_len=seq_len, policy=packing)


_WORKER_DATASETS: dict[str, Dataset] = {}


def _worker_dataset(path: str) -> Dataset:
    ds = _WORKER_DATASETS.get(path)
    if ds is None:  # the parent verified every digest; a worker re-checks sizes only
        ds = _WORKER_DATASETS[path] = Dataset.open(path, verify=Verify.SIZE)
    return ds


class DataPipeline(Iterator[dict[str, Any]]):
    """This replica's slice of each global batch, in order, resumable exactly.

    Args:
        dataset: An open :class:`Dataset` or a manifest path.
        seed: Seed of the order (permutations and categorical draws).
        global_batch: Rows per global batch (G), divisible by ``num_replicas``.
        seq_len: Tokens per row.
        replica: This data-parallel replica (tensor/pipeline peers pass the same value).
        num_replicas: Data-parallel replicas (R).
        mixture: How sources are mixed (default: exact, proportional to size, repeat).
        packing: ``concat`` (concatenate-then-split) or ``none`` (one document per row).
        workers: Reader threads or processes; ``None`` = :data:`THREAD_READERS` threads (more
            only contend for the GIL) or as many processes as this rank's CPU share allows
            (its allowed CPUs minus one for the training loop, see
            :func:`~hpcrun.data.workers.reader_workers`).
        executor: ``thread`` or ``process`` (worker processes that plan and assemble whole
            batches into shared memory; a background thread of this process only copies
            each batch out of its slot).
        prefetch_batches: Batches read ahead; the memory bound is this many of our slices
            (plus one queued and one in hand on the background thread).
        transform: Stochastic, length-preserving per-document transform (picklable for
            processes); its randomness comes from :func:`sample_rng`.
        pad_id: Token used to pad rows in ``packing="none"``.
        as_torch: Yield ``torch`` tensors instead of numpy arrays.
        clock: Time source of metrics and retry backoff.
    """

    def __init__(self, dataset: Dataset | str | os.PathLike[str], *, seed: int,
                 global_batch: int, seq_len: int, replica: int = 0, num_replicas: int = 1,
                 mixture: MixtureSpec | None = None, packing: PackingPolicy | str = "concat",
                 workers: int | None = None, executor: str = "thread",
                 prefetch_batches: int = 2,
                 transform: Transform | None = None, pad_id: int = 0, as_torch: bool = False,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset.open(dataset)
        self.rows = replica_rows(global_batch, replica, num_replicas)
        self.seed, self.global_batch, self.seq_len = seed, global_batch, seq_len
        self.packing = PackingPolicy(packing)
        self.mixture_spec = mixture or MixtureSpec()
        if workers is None:
            workers = THREAD_READERS if executor == "thread" else reader_workers()
        if executor not in ("thread", "process") or workers < 1 or prefetch_batches < 1:
            raise ArgumentError(f"need executor 'thread' or 'process', workers >= 1 and "
                                f"prefetch_batches >= 1; found {executor!r}, {workers}, "
                                f"{prefetch_batches}")
        self.workers, self.executor_kind = workers, executor
        self.prefetch_batches = prefetch_batches
        self.as_torch, self.clock = as_torch, clock
        self._order = self._new_order()
        self._read = _BatchReader(self.dataset, rows=len(self.rows), seq_len=seq_len,
                                  pad_id=pad_id, seed=seed, transform=transform,
                                  keep=prefetch_batches + 4, as_torch=as_torch)
        self.metrics = LoaderMetrics(clock)
        self._batch_nbytes = len(self.rows) * seq_len * np.dtype(BATCH_ARRAYS[0][1]).itemsize
        self._delivered = 0
        self._reader: OrderedReader[_BatchTask, dict[str, Any]] | ProcessBatches | None = None
        self._transform, self._pad_id = transform, pad_id
        self._ahead: ReadAhead[dict[str, Any]] | None = None
        self._submitted: dict[int, float] = {}
        self._order_lock = threading.Lock()  # the planner thread and state_dict share the memo

    @property
    def dataset_id(self) -> str:
        return self.dataset.dataset_id

    @property
    def max_inflight_rows(self) -> int:
        """The declared memory bound, in rows of ``seq_len`` tokens."""
        return self.prefetch_batches * len(self.rows)

    def layout(self) -> dict[str, Any]:
        """What a cursor must agree on (the replica count is deliberately not part of it)."""
        return {"seed": self.seed, "global_batch": self.global_batch, "seq_len": self.seq_len,
                "packing": str(self.packing), "mixture": self._order.stream.mixture.describe()}

    def sample_ids(self, k: int) -> np.ndarray:
        """Segments of global batch ``k`` (all rows) as :data:`~hpcrun.data.batches.LEDGER_DTYPE`.

        Raises:
            OutOfRangeError: the stream ends before batch ``k`` (an ``IndexError``).
        """
        with self._order_lock:
            plan = self._order.plan(k)
        if plan is None:
            raise OutOfRangeError(f"the data stream ends before global batch {k}; ask for a "
                                  "batch the mixture's exhaustion policy still produces")
        return plan.ledger()

    def __iter__(self) -> DataPipeline:
        return self

    def __next__(self) -> dict[str, Any]:
        t0 = self.clock.monotonic()
        source = self._ahead or self._start()
        depth = source.ready
        batch = next(source)
        now = self.clock.monotonic()
        self.metrics.retries = self._reader.retries if self._reader is not None else 0
        self.metrics.record(time_to_batch=now - self._submitted.pop(self._delivered, t0),
                            input_wait=now - t0, queue_depth=depth,
                            nbytes=self._batch_nbytes, samples=len(self.rows),
                            tokens=batch.pop("tokens_read"))
        batch["batch"] = self._delivered
        self._delivered += 1
        return batch

    def take_input_wait(self) -> float:
        """Seconds spent waiting in ``next()`` since the previous call (each wait counted once).

        This is the :class:`~hpcrun.protocols.InputWaitSource` seam ``ctx.step_done()`` reads.
        """
        return self.metrics.take_input_wait()

    def state_dict(self) -> dict[str, Any]:
        """Cursor of the next batch not yet delivered to the caller (an envelope dict)."""
        with self._order_lock:
            state = self._order.state_at(self._delivered)
        if state is None:
            raise DataError(f"no position for batch {self._delivered}: the stream ended")
        sizes = [s.size for s in self.dataset.sources]
        epochs = tuple(c // n for c, n in zip(state.mix.counts, sizes, strict=True))
        return DataCursor(dataset_id=self.dataset_id, position=state, epochs=epochs,
                          layout=self.layout()).to_state_dict()

    def cursor_envelope(self) -> dict[str, Any]:
        """The :class:`~hpcrun.protocols.CursorSource` seam: the cursor a commit publishes
        (the same envelope as :meth:`state_dict`)."""
        return self.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], /) -> None:
        """Resume at the cursor's batch; prefetched reads are discarded and rebuilt.

        Raises:
            DataError: another dataset, algorithm version or layout (both sides printed), or
                a position that does not match this data.
        """
        cursor = DataCursor.from_state_dict(state_dict, dataset_id=self.dataset_id,
                                            layout=self.layout())
        self._stop()
        self._order = self._new_order()
        pos = cursor.position
        why = self._order.mismatch(pos) if pos.pack.draw <= _VERIFY_DRAWS else None
        if why is not None:
            raise DataError(f"cursor position {pos.to_dict()} does not match this data's order: "
                            f"{why}; the cursor is corrupt or from other data")
        self._order.remember(pos)
        self._delivered = pos.batch

    def close(self) -> None:
        """Stop the readers and worker processes and close the dataset's files."""
        self._stop()
        self.dataset.close()

    def _new_order(self) -> GlobalOrder:
        return _global_order(self.dataset, self.mixture_spec, seed=self.seed,
                             global_batch=self.global_batch, seq_len=self.seq_len,
                             packing=self.packing)

    def _start(self) -> ReadAhead[dict[str, Any]]:
        if self.executor_kind == "process":
            # A background thread takes each batch's message, copies the slot out, hands the
            # slot back and makes the tensors: the caller's next() is one queue get, as on
            # the thread path (two system calls and the conversions cost more than the step's
            # budget for input wait). Two copied batches wait, so a background thread that
            # loses the CPU for a step (the reader process is one more runnable) has one left.
            procs = self._reader = self._start_processes()
            self._ahead = ReadAhead(_converted(procs, self.as_torch), depth=2,
                                    name="hpcrun-batches")
            return self._ahead
        # Planning, submitting reads and the reorder buffer run on one background thread;
        # the caller's next() only takes a finished batch off a queue.
        self._reader = OrderedReader(self._read, self._batch_tasks(self._delivered),
                                     workers=self.workers, max_inflight=self.prefetch_batches,
                                     executor=InlineExecutor() if self.workers == 1 else None,
                                     clock=self.clock)
        self._ahead = ReadAhead(self._reader, depth=1, name="hpcrun-batches")
        return self._ahead

    def _stop(self) -> None:
        if self._ahead is not None:  # first: it pulls from the reader
            self._ahead.close()
            self._ahead = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._submitted.clear()

    def _start_processes(self) -> ProcessBatches:
        with self._order_lock:
            state = self._order.state_at(self._delivered)
        producer = _BatchProducer(
            manifest=str(self.dataset.manifest_path), seed=self.seed,
            global_batch=self.global_batch, seq_len=self.seq_len,
            rows=(self.rows.start, self.rows.stop), mixture=self.mixture_spec,
            packing=str(self.packing), pad_id=self._pad_id, transform=self._transform)
        layout = SlotLayout(shape=(len(self.rows), self.seq_len), dtypes=BATCH_ARRAYS)
        depth = -(-self.prefetch_batches // self.workers)
        return ProcessBatches(producer, layout, start=self._delivered,
                              state=None if state is None else state.to_dict(),
                              workers=self.workers, depth=depth)

    def _batch_tasks(self, start: int) -> Iterator[_BatchTask]:
        # A free function: the planner thread must not keep the pipeline alive (a pipeline
        # dropped without close() is collected, and its __del__ stops the thread).
        return _plan_tasks(self._order, self._order_lock, self.rows, start, self._submitted,
                           self.clock)

    def __del__(self) -> None:
        # interpreter teardown: nothing left to release safely when this fails
        with contextlib.suppress(Exception):
            self._stop()
