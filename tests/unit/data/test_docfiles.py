"""Documents stored one per .npy file: read with pread into the batch, the same tokens as a
document read, with a bounded number of open descriptors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hpcrun.data import DataPipeline, build_manifest
from hpcrun.data.assemble import SLICE_DTYPE, assemble
from hpcrun.data.dataset import Dataset
from hpcrun.data.docfiles import HEAD_BYTES
from hpcrun.errors import DataError

_DTYPES = ("<i4", "<u2", ">i4", "<i8", "<u1")


@pytest.fixture(scope="module")
def one_per_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One source of one-document .npy files in several dtypes, a 2-D single-row file and a
    document longer than the first read of a file."""
    root = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(5)
    (root / "d").mkdir()
    for i in range(20):
        dt = np.dtype(_DTYPES[i % len(_DTYPES)])
        hi = min(250, np.iinfo(dt).max)
        np.save(root / "d" / f"doc_{i:03d}.npy",
                rng.integers(0, hi, size=int(rng.integers(1, 90))).astype(dt))
    np.save(root / "d" / "row.npy", np.arange(37, dtype=np.int32).reshape(1, 37))
    big = HEAD_BYTES // 4 * 3  # int32 tokens well past the first read
    np.save(root / "d" / "zbig.npy", (np.arange(big) % 1009).astype(np.int32))
    build_manifest([str(root / "d")], root / "m.json", progress=False)
    return root / "m.json"


def _by_document(ds: Dataset, table: np.ndarray, rows: int, seq_len: int) -> np.ndarray:
    out = np.zeros((rows, seq_len), dtype=np.int64)
    fill = [0] * rows
    for seg in table:
        r, off, n = int(seg["row"]), int(seg["offset"]), int(seg["length"])
        out[r, fill[r]:fill[r] + n] = ds.read(int(seg["source"]), int(seg["record"]))[off:off + n]
        fill[r] += n
    return out


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_preads_give_the_tokens_a_document_read_gives(one_per_file: Path,
                                                      executor: str) -> None:
    seq_len = 4096  # rows long enough to take whole pieces of the big document
    pipe = DataPipeline(one_per_file, seed=3, global_batch=4, seq_len=seq_len, workers=1,
                        executor=executor)
    ds = Dataset.open(one_per_file)
    files = ds.document_files(0)
    assert files is not None and bool(files.single.all())  # every object takes the pread path
    for k in range(40):
        batch = next(pipe)
        table = next(t for t in _tasks(pipe, k)).table
        assert np.array_equal(batch["tokens"], _by_document(ds, table, 4, seq_len)), k
    pipe.close()
    ds.close()


def _tasks(pipe: DataPipeline, k: int):  # type: ignore[no-untyped-def]
    return pipe._batch_tasks(k)


def test_open_descriptors_stay_bounded_and_close_releases_them(one_per_file: Path) -> None:
    ds = Dataset.open(one_per_file)
    files = ds.document_files(0)
    assert files is not None
    files.max_open = 3
    n = len(ds.manifest.sources[0].objects)
    table = np.zeros(n, dtype=SLICE_DTYPE)
    table["row"] = np.arange(n)
    table["record"] = np.arange(n)
    table["length"] = 1
    assemble(ds, table, rows=n, seq_len=1, pad_id=0)
    worker = threading.Thread(target=assemble, args=(ds, table),
                              kwargs={"rows": n, "seq_len": 1, "pad_id": 0})
    worker.start()
    worker.join()
    assert files.open_count() <= 2 * 3  # each reader thread keeps at most max_open
    ds.close()
    assert files.open_count() == 0


def test_a_document_file_cut_short_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "doc.npy"
    np.save(path, np.arange(5000, dtype=np.int32))
    build_manifest([str(tmp_path / "d")], tmp_path / "m.json", progress=False)
    ds = Dataset.open(tmp_path / "m.json")
    path.write_bytes(path.read_bytes()[:-400])  # changed after it was verified
    table = np.zeros(1, dtype=SLICE_DTYPE)
    table["offset"], table["length"] = 4900, 100
    with pytest.raises(DataError, match=r"doc\.npy.*changed since the manifest"):
        assemble(ds, table, rows=1, seq_len=100, pad_id=0)
    ds.close()


def test_restarted_readers_do_not_pile_up_descriptors(one_per_file: Path) -> None:
    pipe = DataPipeline(one_per_file, seed=3, global_batch=4, seq_len=256, workers=1)
    files = pipe.dataset.document_files(0)
    assert files is not None
    objects = len(files.paths)
    for _ in range(6):  # each restore restarts the reader on a new thread
        state = pipe.state_dict()
        for _ in range(8):
            next(pipe)
        pipe.load_state_dict(state)
    next(pipe)
    # One reader thread is alive; those that ended had their descriptors closed.
    assert 0 < files.open_count() <= objects
    pipe.close()
    assert files.open_count() == 0
