"""Global batches: resume contracts, world-size independence, cursor validation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpcrun.data import DATA_ALGORITHM_VERSION, DataPipeline, Dataset, MixtureSpec
from hpcrun.data.batches import DocStream
from hpcrun.data.mixture import Mixture
from hpcrun.data.packing import PackState
from hpcrun.errors import DataError
from hpcrun.protocols import CursorEnvelope, Stateful

G, L, TOTAL = 4, 32, 40
MIX = MixtureSpec(weights={"web": 2.0, "code": 1.0})


def make(manifest: Path, **kw: Any) -> DataPipeline:
    kw.setdefault("mixture", MIX)
    return DataPipeline(manifest, seed=11, global_batch=G, seq_len=L, **kw)


def run_global(manifest: Path, start_state: dict[str, Any] | None, stop: int,
               replicas: int) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """Consume batches up to ``stop`` on ``replicas`` replicas; return global tokens, ledger,
    and the cursor (as a checkpoint would store it: through JSON)."""
    pipes = [make(manifest, replica=r, num_replicas=replicas, workers=2) for r in range(replicas)]
    for p in pipes:
        if start_state is not None:
            p.load_state_dict(start_state)
    tokens, ledger = [], []
    k = pipes[0].state_dict()["state"]["position"]["batch"]
    while k < stop:
        tokens.append(np.concatenate([next(p)["tokens"] for p in pipes]))
        ledger.append(pipes[0].sample_ids(k))
        k += 1
    state = json.loads(json.dumps(pipes[0].state_dict()))
    assert all(p.state_dict() == pipes[0].state_dict() for p in pipes)
    for p in pipes:
        p.close()
    return tokens, ledger, state


@pytest.fixture(scope="module")
def uninterrupted(two_source_manifest: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    tokens, ledger, _ = run_global(two_source_manifest, None, TOTAL, 1)
    return tokens, ledger


def _interesting_breaks(manifest: Path) -> tuple[int, int]:
    """A batch that starts mid-document and one right after a source epoch boundary."""
    p = make(manifest)
    mid_pack = epoch_edge = -1
    last_epochs = None
    for k in range(1, TOTAL):
        next(p)
        st = p.state_dict()["state"]
        if mid_pack < 0 and st["position"]["pack"]["offset"] > 0 and k > 2:
            mid_pack = k
        if last_epochs is not None and st["epochs"] != last_epochs and epoch_edge < 0:
            epoch_edge = k
        last_epochs = st["epochs"]
    p.close()
    assert mid_pack > 0 and epoch_edge > 0
    return mid_pack, epoch_edge


def test_sample_ledger_survives_many_interruptions_and_world_sizes(
        two_source_manifest: Path, uninterrupted: tuple[list[np.ndarray], list[np.ndarray]]
) -> None:
    mid_pack, epoch_edge = _interesting_breaks(two_source_manifest)
    breaks = sorted({3, mid_pack, epoch_edge, epoch_edge + 1, 29, TOTAL})
    tokens: list[np.ndarray] = []
    ledger: list[np.ndarray] = []
    state = None
    for i, stop in enumerate(breaks):
        part_tokens, part_ledger, state = run_global(two_source_manifest, state, stop,
                                                     replicas=(1, 2, 4)[i % 3])
        tokens += part_tokens
        ledger += part_ledger
    want_tokens, want_ledger = uninterrupted
    assert len(ledger) == TOTAL
    for k in range(TOTAL):
        assert np.array_equal(ledger[k], want_ledger[k]), f"batch {k} consumed other samples"
        assert np.array_equal(tokens[k], want_tokens[k]), f"batch {k} differs"
    ids = np.concatenate([b["sample_id"] for b in ledger])
    assert ids.min() >= 0 and ids.max() < 34


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_world_size_and_worker_count_leave_the_global_batch_unchanged(
        two_source_manifest: Path, replicas: int,
        uninterrupted: tuple[list[np.ndarray], list[np.ndarray]]) -> None:
    pipes = [make(two_source_manifest, replica=r, num_replicas=replicas, workers=1 + r)
             for r in range(replicas)]
    for k in range(6):
        got = np.concatenate([next(p)["tokens"] for p in pipes])
        assert np.array_equal(got, uninterrupted[0][k])
    for p in pipes:
        p.close()


def test_process_workers_give_the_same_batches(two_source_manifest: Path,
                                               uninterrupted: tuple[list[np.ndarray], Any]
                                               ) -> None:
    p = make(two_source_manifest, workers=2, executor="process")
    for k in range(3):
        assert np.array_equal(next(p)["tokens"], uninterrupted[0][k])
    p.close()


def test_cursor_counts_only_delivered_batches(two_source_manifest: Path) -> None:
    p = make(two_source_manifest, prefetch_batches=3)
    assert isinstance(p, Stateful)
    first = next(p)
    assert p._reader is not None and p._reader.inflight > 0  # batches 1.. are prefetched
    env = CursorEnvelope.from_dict(p.state_dict())
    assert env.kind == "hpcrun.data.cursor" and env.algorithm_version == DATA_ALGORITHM_VERSION
    assert env.state["position"]["batch"] == 1
    second = next(p)
    q = make(two_source_manifest)
    q.load_state_dict(env.to_dict())
    assert np.array_equal(next(q)["tokens"], second["tokens"])
    assert first["batch"] == 0 and second["batch"] == 1
    p.close()
    q.close()


def test_restore_refuses_other_data_version_or_layout(two_source_manifest: Path) -> None:
    p = make(two_source_manifest)
    next(p)
    sd = p.state_dict()
    for field, value, needle in [("dataset_id", "ds-other", "ds-other"),
                                 ("algorithm_version", 99, "algorithm_version=99")]:
        with pytest.raises(DataError, match=needle) as err:
            make(two_source_manifest).load_state_dict(sd | {field: value})
        assert p.dataset_id in str(err.value)  # both sides are printed
    other = DataPipeline(two_source_manifest, seed=12, global_batch=G, seq_len=L, mixture=MIX)
    with pytest.raises(DataError, match="layout differs"):
        other.load_state_dict(sd)
    bad = json.loads(json.dumps(sd))
    bad["state"]["position"]["pack"]["offset"] += 1
    with pytest.raises(DataError, match="does not match"):
        make(two_source_manifest).load_state_dict(bad)
    p.close()


@pytest.mark.parametrize("packing", ["concat", "none"])
def test_restore_check_accepts_every_true_position_and_no_neighbour(
        two_source_manifest: Path, packing: str) -> None:
    order = make(two_source_manifest, packing=packing)._order
    mixture = order.stream.mixture
    for k in range(60):
        state = order.state_at(k)
        assert state is not None and order.mismatch(state) is None
        d, off = state.pack.draw, state.pack.offset
        wrong = [replace(state, batch=k + 1),
                 replace(state, pack=PackState(draw=d, offset=off + 1))]
        if k:
            wrong.append(replace(state, batch=k - 1))
        for step in (-1, 1):
            if d + step >= 0:  # another draw, with that draw's own mixture state
                wrong.append(replace(state, pack=PackState(draw=d + step, offset=off),
                                     mix=mixture.state_at(d + step)))
        for w in wrong:
            assert order.mismatch(w) is not None, (k, w)


def test_each_epoch_covers_every_sample_exactly_once(two_source_manifest: Path) -> None:
    ds = Dataset.open(two_source_manifest)
    stream = DocStream(ds.sources[:1], Mixture([1], mode="exact", seed=0), seed=3, salt="x")
    docs = stream.docs(0, 3 * 23)
    for e in range(3):
        ids = docs["sample_id"][e * 23:(e + 1) * 23]
        assert sorted(ids.tolist()) == list(range(23))
        assert set(docs["epoch"][e * 23:(e + 1) * 23].tolist()) == {e}
    assert not np.array_equal(docs["sample_id"][:23], docs["sample_id"][23:46])


def test_transform_randomness_comes_from_the_sample(two_source_manifest: Path) -> None:
    def noise(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return tokens + rng.integers(0, 1000, size=tokens.size)

    a = make(two_source_manifest, transform=noise, workers=1)
    b = make(two_source_manifest, transform=noise, workers=4, num_replicas=2, replica=1)
    batches = [next(a)["tokens"] for _ in range(3)]
    assert all(np.array_equal(next(b)["tokens"], x[2:]) for x in batches)
    a.close()
    b.close()


def test_packed_rows_mark_documents_and_positions(two_source_manifest: Path) -> None:
    p = make(two_source_manifest, as_torch=True)
    batch = next(p)
    assert batch["tokens"].dtype == torch.int64 and batch["tokens"].shape == (G, L)
    led = p.sample_ids(0)
    row0 = led[led["row"] == 0]
    ds = Dataset.open(two_source_manifest)
    expect = np.concatenate([ds.read_sample(int(s["sample_id"]))[s["offset"]:s["offset"] +
                                                                 s["length"]] for s in row0])
    assert batch["tokens"][0].tolist() == expect.tolist()
    assert batch["document"][0].max().item() == row0.size - 1
    assert batch["position"][0, 0].item() == row0["offset"][0]
    p.close()


def test_finite_stream_stops_cleanly(two_source_manifest: Path) -> None:
    spec = MixtureSpec(weights=[1.0, 1.0], exhaustion="stop")  # type: ignore[arg-type]
    p = make(two_source_manifest, mixture=spec, packing="none")
    n = sum(1 for _ in p)
    assert n == (2 * 11) // G  # the small source (11 docs) stops the stream
    m = p.metrics.summary()
    assert m["batches"] == n and m["time_to_batch_p99_s"] >= m["time_to_batch_p50_s"]
    check = p.metrics.rate_check(tokens_per_step=G * L, target_step_time_s=1e-9)
    assert not check.ok and "MISSES" in check.describe()
    p.close()


def test_global_batch_must_divide_by_replicas(two_source_manifest: Path) -> None:
    with pytest.raises(DataError, match="divisible"):
        make(two_source_manifest, num_replicas=3)
