"""Ordered parallel reads: in order under random delays, bounded memory, retries."""

from __future__ import annotations

import random
import threading
import time

import pytest

from hpcrun.data.loader import InlineExecutor, LoaderMetrics, OrderedReader, call_with_retries
from hpcrun.testing.fakes import FakeClock


class SlowReads:
    """A read that sleeps a random time and tracks how many results exist un-emitted."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.started = 0

    def __call__(self, item: int) -> int:
        with self.lock:
            delay = self.rng.choice([0.0, 0.0, 0.001, 0.004, 0.012])
            self.started += 1
        time.sleep(delay)
        return item * item


@pytest.mark.parametrize("workers,bound", [(1, 1), (4, 3), (8, 16)])
def test_randomly_slow_reads_emit_in_order_within_the_bound(workers: int, bound: int) -> None:
    fn = SlowReads(seed=workers)
    reader = OrderedReader(fn, range(300), workers=workers, max_inflight=bound)
    out = []
    for i, value in enumerate(reader):
        out.append(value)
        assert reader.inflight <= bound
        assert fn.started <= i + 1 + bound  # backpressure: reads never run ahead of the bound
        if i % 50 == 0:
            time.sleep(0.01)  # a slow consumer
    assert out == [i * i for i in range(300)]
    assert reader.peak_inflight == bound
    reader.close()


def test_transient_io_errors_are_retried_and_counted() -> None:
    failures = {3: 2, 7: 1}

    def flaky(item: int) -> int:
        if failures.get(item, 0):
            failures[item] -= 1
            raise OSError("transient")
        return item

    clock = FakeClock()
    reader = OrderedReader(flaky, range(10), workers=2, max_inflight=4, clock=clock,
                           backoff_s=0.5)
    assert list(reader) == list(range(10))
    assert reader.retries == 3 and sorted(clock.sleeps) == [0.5, 0.5, 1.0]


def test_persistent_errors_surface_after_the_retry_budget() -> None:
    def broken(item: int) -> int:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        call_with_retries(broken, 1, retries=2, backoff_s=0.0, clock=FakeClock())
    with pytest.raises(OSError):
        list(OrderedReader(broken, range(3), retries=0))


def test_metrics_quantiles_rates_and_required_rate() -> None:
    clock = FakeClock()
    m = LoaderMetrics(clock)
    for i in range(100):
        clock.advance(0.01)
        m.record(time_to_batch=0.001 * (i + 1), input_wait=0.002, queue_depth=i % 4,
                 nbytes=1000, samples=4, tokens=400)
    s = m.summary()
    assert s["time_to_batch_p50_s"] == pytest.approx(0.0505, rel=1e-3)
    assert s["time_to_batch_p99_s"] == pytest.approx(0.09901, rel=1e-3)
    assert s["queue_depth_max"] == 3 and s["input_wait_total_s"] == pytest.approx(0.2)
    assert s["tokens_per_s"] == pytest.approx(40_000 / 0.991, rel=1e-3)  # from first request
    assert m.rate_check(tokens_per_step=400, target_step_time_s=0.02).ok
    assert not m.rate_check(tokens_per_step=4000, target_step_time_s=0.02).ok


def test_an_inline_reader_is_ordered_bounded_and_raises_in_place() -> None:
    made: list[int] = []

    def read(item: int) -> int:
        made.append(item)
        if item == 6:
            raise ValueError("object 6 is damaged")
        return -item

    reader = OrderedReader(read, range(10), max_inflight=3, executor=InlineExecutor())
    assert [next(reader) for _ in range(4)] == [0, -1, -2, -3]
    assert made == list(range(7))  # the window: three read ahead of the consumer, no more
    assert next(reader) == -4 and next(reader) == -5
    with pytest.raises(ValueError, match="object 6 is damaged"):
        next(reader)
