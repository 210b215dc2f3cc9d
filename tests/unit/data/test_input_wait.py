"""A step event carries the time the step waited for its batch, with no change to the loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hpcrun.checkpoint.cadence import CadencePolicy, CadenceTimer
from hpcrun.control.spec import CheckpointPolicy, SdcPolicy
from hpcrun.data import DataPipeline, MixtureSpec
from hpcrun.runtime.rank.context import Context

DELAY_S = 0.03


class _Events:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def emit(self, kind: str, step: int, **data: Any) -> None:
        if kind == "step":
            self.steps.append(data)

    @contextmanager
    def span(self, kind: str, step: int, **data: Any) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


class _Checkpointer:
    def restore(self, state: Any) -> None:
        return None

    def poll(self) -> None:
        return None

    def wait(self) -> None:
        return None

    def save(self, step: int, state: Any, **kw: Any) -> Any:
        return SimpleNamespace(committed=False, pause_s=0.0)

    def close(self) -> None:
        pass


def _context(events: _Events) -> Context:
    env = SimpleNamespace(rank=1, local_rank=0, node_rank=0, world_size=1)
    inc = SimpleNamespace(generation=1, holder="h", restart_count=0, attempt=0, node="n0")
    policy = CadencePolicy(kind="every_steps", every_steps=1000)  # type: ignore[arg-type]
    spec = SimpleNamespace(config={}, sdc=SdcPolicy(), checkpoint=CheckpointPolicy())
    return Context(env=env, incarnation=inc, spec=spec,  # type: ignore[arg-type]
                   log=SimpleNamespace(), checkpointer=_Checkpointer(),  # type: ignore[arg-type]
                   cadence=lambda start: CadenceTimer(policy, start_step=start), events=events,
                   stop=SimpleNamespace(is_set=False), heartbeat=lambda **kw: None,
                   device="cpu")


def _slow(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    time.sleep(DELAY_S)
    return tokens


def _pipeline(manifest: Path, *, slow: bool) -> DataPipeline:
    return DataPipeline(manifest, seed=3, global_batch=2, seq_len=16, workers=1,
                        prefetch_batches=1, mixture=MixtureSpec(weights=[1.0, 1.0]),
                        transform=_slow if slow else None)


def _train(ctx: Context, pipe: DataPipeline, steps: int) -> None:
    ctx.restore(data=pipe)
    for _ in ctx.steps(steps):  # the loop of examples/tiny_lm: nothing about input wait
        batch = next(pipe)
        ctx.step_done(tokens=int(batch["tokens"].size))


def test_a_slow_loader_shows_as_input_wait_in_every_step_event(
        two_source_manifest: Path) -> None:
    events = _Events()
    pipe = _pipeline(two_source_manifest, slow=True)
    _train(_context(events), pipe, 6)
    pipe.close()
    waits = [s["input_wait_s"] for s in events.steps]
    assert len(waits) == 6
    # Every batch reads at least one document, each read slowed by DELAY_S, and nothing
    # trains while it is read: each step waited at least the slowdown.
    assert min(waits) >= DELAY_S * 0.9
    assert all(w <= s["dur_s"] + 1e-6 for w, s in zip(waits, events.steps, strict=True))


def test_a_fast_loader_shows_about_no_input_wait(two_source_manifest: Path) -> None:
    events = _Events()
    pipe = _pipeline(two_source_manifest, slow=False)
    ctx = _context(events)
    ctx.restore(data=pipe)
    for _ in ctx.steps(6):
        batch = next(pipe)
        time.sleep(DELAY_S)  # compute slower than the reads: the prefetch hides them
        ctx.step_done(tokens=int(batch["tokens"].size))
    pipe.close()
    waits = [s["input_wait_s"] for s in events.steps]
    assert sorted(waits)[len(waits) // 2] < DELAY_S / 3  # the median step barely waits


def test_an_own_loader_reports_with_the_context_manager_or_the_argument() -> None:
    events = _Events()
    ctx = _context(events)
    ctx.restore()
    for step in ctx.steps(3):
        if step == 0:
            with ctx.input_wait():
                time.sleep(DELAY_S)
            ctx.step_done()
        elif step == 1:
            ctx.step_done(input_wait_s=0.5)
        else:
            ctx.step_done()
    waits = [s["input_wait_s"] for s in events.steps]
    assert waits[0] == pytest.approx(DELAY_S, abs=0.02) and waits[1] == 0.5
    assert waits[2] is None  # nothing measured it: not claimed to be zero
