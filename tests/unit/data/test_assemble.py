"""Whole-batch assembly: every object format gives the tokens a per-document read gives."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrun.data import DataPipeline, build_manifest, write_token_shards
from hpcrun.data.assemble import SLICE_DTYPE, assemble, place_segments
from hpcrun.data.dataset import Dataset
from hpcrun.data.loader import ReadAhead


@pytest.fixture(scope="module")
def mixed_formats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One source per format: per-document .npy, 2-D .npy, 1-D HDF5 + offsets, 2-D HDF5,
    chunked HDF5 (no flat map), JSON Lines."""
    root = tmp_path_factory.mktemp("fmt")
    write_token_shards(root / "docs", 9, vocab=300, seed=4, min_len=3, max_len=50)
    (root / "rows").mkdir()
    np.save(root / "rows" / "r.npy", (np.arange(12 * 7) % 251).reshape(12, 7).astype(np.uint16))
    lens = np.random.default_rng(1).integers(1, 40, size=15)
    for name, kw in (("flat", {}), ("chunked", {"chunks": (16,)})):
        (root / name).mkdir()
        with h5py.File(root / name / "a.h5", "w") as f:
            f.create_dataset("tokens", data=(np.arange(lens.sum()) * 7 % 997).astype(">i4"),
                             **kw)
            f["offsets"] = np.concatenate([[0], np.cumsum(lens)])
    (root / "grid").mkdir()
    with h5py.File(root / "grid" / "g.h5", "w") as f:
        f["tokens"] = np.arange(5 * 9).reshape(5, 9).astype(np.int64)
    with open(root / "j.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"tokens": list(range(i, 2 * i + 3))}) + "\n")
    sources = [f"{n}={root / n}" for n in ("docs", "rows", "flat", "chunked", "grid")]
    build_manifest([*sources, f"json={root / 'j.jsonl'}"], root / "m.json", progress=False)
    return root / "m.json"


def _reference(ds: Dataset, table: np.ndarray, rows: int, seq_len: int) -> np.ndarray:
    """The row-by-row, document-by-document assembly the loader used to do."""
    out = np.full((rows, seq_len), -7, dtype=np.int64)
    fill = [0] * rows
    for seg in table:
        r, off, n = int(seg["row"]), int(seg["offset"]), int(seg["length"])
        out[r, fill[r]:fill[r] + n] = ds.read(int(seg["source"]), int(seg["record"]))[off:off + n]
        fill[r] += n
    return out


@pytest.mark.parametrize("packing", ["concat", "none"])
def test_every_format_assembles_the_tokens_a_document_read_gives(mixed_formats: Path,
                                                                  packing: str) -> None:
    pipe = DataPipeline(mixed_formats, seed=2, global_batch=6, seq_len=23, replica=1,
                        num_replicas=2, packing=packing, workers=1, pad_id=-7)
    ds = pipe.dataset
    seen = set()
    for k in range(30):
        batch = next(pipe)
        table = next(t for t in pipe._batch_tasks(k)).table
        seen.update(table["source"].tolist())
        assert np.array_equal(batch["tokens"], _reference(ds, table, 3, 23)), k
    pipe.close()
    assert seen == set(range(6))  # every format was exercised


def test_segments_land_after_each_other_in_their_row() -> None:
    table = np.zeros(4, dtype=SLICE_DTYPE)
    table["row"], table["length"] = [0, 0, 1, 1], [3, 5, 8, 2]
    dest, doc = place_segments(table, seq_len=8)
    assert dest.tolist() == [0, 3, 8, 16] and doc.tolist() == [0, 1, 0, 1]


def test_a_short_object_is_a_data_error(tmp_path: Path) -> None:
    write_token_shards(tmp_path / "d", 1, vocab=50, seed=3, min_len=30, max_len=30)
    build_manifest([str(tmp_path / "d")], tmp_path / "m.json", progress=False)
    ds = Dataset.open(tmp_path / "m.json")
    table = np.zeros(1, dtype=SLICE_DTYPE)
    table["offset"], table["length"] = 25, 10  # past the 30 tokens of the only record
    from hpcrun.errors import DataError

    with pytest.raises(DataError, match="changed since the manifest"):
        assemble(ds, table, rows=1, seq_len=10, pad_id=0)


def test_a_pipeline_dropped_without_close_stops_its_planner(mixed_formats: Path) -> None:
    import gc
    import time

    pipe = DataPipeline(mixed_formats, seed=2, global_batch=2, seq_len=8, workers=1)
    next(pipe)
    assert pipe._ahead is not None
    planner = pipe._ahead._thread
    assert planner.is_alive()
    del pipe
    gc.collect()
    deadline = time.monotonic() + 2
    while planner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not planner.is_alive()


def test_read_ahead_is_ordered_bounded_and_raises_in_place() -> None:
    made: list[int] = []

    def items() -> object:
        for i in range(5):
            made.append(i)
            yield i
        raise ValueError("planning failed")

    ahead = ReadAhead(items(), depth=2)
    import time

    time.sleep(0.2)
    assert len(made) <= 3  # two queued and one in hand, never more
    assert [next(ahead) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="planning failed"):
        next(ahead)
    ahead.close()


def test_long_segments_of_shards_are_the_tokens_a_document_read_gives(tmp_path: Path) -> None:
    (tmp_path / "rows").mkdir()
    np.save(tmp_path / "rows" / "r.npy", (np.arange(9 * 300) % 4093).reshape(9, 300)
            .astype(np.int32))
    lens = np.random.default_rng(2).integers(80, 400, size=12)
    (tmp_path / "flat").mkdir()
    with h5py.File(tmp_path / "flat" / "a.h5", "w") as f:
        f["tokens"] = (np.arange(lens.sum()) * 3 % 1021).astype("<u2")
        f["offsets"] = np.concatenate([[0], np.cumsum(lens)])
    build_manifest([f"rows={tmp_path / 'rows'}", f"flat={tmp_path / 'flat'}"],
                   tmp_path / "m.json", progress=False)
    pipe = DataPipeline(tmp_path / "m.json", seed=1, global_batch=4, seq_len=700, workers=1)
    for k in range(12):
        batch = next(pipe)
        table = next(t for t in pipe._batch_tasks(k)).table
        assert table["length"].mean() >= 64  # the slice-by-slice path
        assert np.array_equal(batch["tokens"], _reference(pipe.dataset, table, 4, 700)), k
    pipe.close()
