"""Reader processes: same batches for any worker count, no orphans, errors surface."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcrun.data import DataPipeline, MixtureSpec
from hpcrun.data import workers as workers_mod
from hpcrun.data.pipeline import THREAD_READERS
from hpcrun.data.workers import reader_workers
from hpcrun.errors import DataError

REPO = Path(__file__).resolve().parents[3]
MIX = MixtureSpec(weights={"web": 2.0, "code": 1.0})


def make(manifest: Path, **kw: Any) -> DataPipeline:
    kw.setdefault("mixture", MIX)
    return DataPipeline(manifest, seed=11, global_batch=4, seq_len=32, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (its parent has not reaped it yet)
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_restore_with_another_worker_count_gives_the_same_batches(
        two_source_manifest: Path) -> None:
    ref = make(two_source_manifest, workers=1)
    want = [next(ref) for _ in range(7)]
    ref.close()
    first = make(two_source_manifest, workers=2, executor="process")
    got = [next(first) for _ in range(3)]
    cursor = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = make(two_source_manifest, workers=3, executor="process", prefetch_batches=5)
    resumed.load_state_dict(cursor)
    got += [next(resumed) for _ in range(4)]
    resumed.close()
    for a, b in zip(want, got, strict=True):
        for key in ("tokens", "document", "position"):
            assert np.array_equal(a[key], b[key]), key
        assert a["batch"] == b["batch"]


def test_close_stops_every_reader_process(two_source_manifest: Path) -> None:
    p = make(two_source_manifest, workers=2, executor="process")
    next(p)
    assert p._reader is not None
    pids = p._reader.pids  # type: ignore[union-attr]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    p.close()
    assert _wait_gone(pids, timeout_s=1.0) == []


_RANK = """
import sys, time
from hpcrun.data import DataPipeline
p = DataPipeline(sys.argv[1], seed=1, global_batch=4, seq_len=32, workers=2,
                 executor="process")
next(p)
print(" ".join(map(str, p._reader.pids)), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL])
def test_a_rank_killed_by_a_signal_leaves_no_reader_behind(two_source_manifest: Path,
                                                           sig: signal.Signals) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rank = subprocess.Popen([sys.executable, "-c", _RANK, str(two_source_manifest)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert rank.stdout is not None
        pids = [int(v) for v in rank.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        os.kill(rank.pid, sig)
        rank.wait(timeout=10)
        assert _wait_gone(pids) == [], f"reader processes outlived their rank after {sig!r}"
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()


def test_a_reader_error_is_a_data_error_and_stops_the_readers(tmp_path: Path) -> None:
    from hpcrun.data import build_manifest, write_token_shards

    paths = write_token_shards(tmp_path / "d", 6, vocab=50, seed=3, min_len=20, max_len=40)
    build_manifest([str(tmp_path / "d")], tmp_path / "m.json", progress=False)
    p = DataPipeline(tmp_path / "m.json", seed=0, global_batch=2, seq_len=16, workers=2,
                     executor="process")
    for path in paths:  # the objects change after the rank verified them
        path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(DataError, match=r"reader process .* failed .*changed"):
        next(p)
    assert p._reader is not None
    assert _wait_gone(p._reader.pids, timeout_s=1.0) == []  # type: ignore[union-attr]
    p.close()


def test_worker_count_follows_the_rank_cpu_share(two_source_manifest: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_mod.os, "sched_getaffinity", lambda pid: {4, 5, 6})
    assert reader_workers() == 2
    p = make(two_source_manifest, executor="process")  # no count given: the share decides
    assert p.workers == 2
    p.close()
    t = make(two_source_manifest)  # threads: one whatever the share (more contend for the GIL)
    assert t.workers == THREAD_READERS == 1
    t.close()
    monkeypatch.setattr(workers_mod.os, "sched_getaffinity", lambda pid: {0})
    assert reader_workers() == 1
