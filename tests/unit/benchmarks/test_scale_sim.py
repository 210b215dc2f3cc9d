"""The scale simulation counts what the real save path does, and the harness writes results."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import harness
from benchmarks.scale.__main__ import render
from benchmarks.scale.memfs import MemStorage
from benchmarks.scale.sim import ScaleConfig, simulate

SAME = ("files", "dirs", "datasets", "seam_ops_commit", "bypass_ops", "metadata_ops_per_rank",
        "sub_manifest_bytes", "top_manifest_bytes", "shard_files_per_rank_max",
        "max_opens_of_one_shard")


def test_replayed_shard_writes_count_the_same_operations_as_real_hdf5_writes() -> None:
    real = simulate(ScaleConfig(ranks=16, tensors=12, real_files=True))
    synthetic = simulate(ScaleConfig(ranks=16, tensors=12, real_files=False))
    assert {k: real[k] for k in SAME} == {k: synthetic[k] for k in SAME}
    # every rank opened only its own shard on restore, observed through the real read path
    assert real["observed_files_per_rank_max"] == 1
    assert real["observed_max_ranks_per_file"] == 1
    assert real["dirs"] == real["nodes"] + 2  # checkpoint dir, manifests/, one per node
    assert real["files"] == 16 + 2 + 1  # shards, sub-manifests, top manifest


def test_operations_per_rank_stay_constant_as_the_gang_grows() -> None:
    small = simulate(ScaleConfig(ranks=8, tensors=4))
    large = simulate(ScaleConfig(ranks=256, tensors=4))
    assert large["metadata_ops_per_rank"] <= 1.05 * small["metadata_ops_per_rank"]
    assert large["dirs"] == large["nodes"] + 2
    text = render([small, large])
    assert "NOT met" not in text.split("coordinator")[0]


def test_memstorage_keeps_sizes_and_lists_like_a_directory() -> None:
    mem = MemStorage(keep=lambda p: p.endswith(".json"))
    mem.makedirs("/r/ckpt/a")
    assert mem.create_exclusive("/r/ckpt/a/m.json", b"{}")
    assert not mem.create_exclusive("/r/ckpt/a/m.json", b"{}")
    mem.put("/r/ckpt/a/.x.tmp", 10)
    mem.rename("/r/ckpt/a/.x.tmp", "/r/ckpt/a/x.h5")
    assert mem.listdir("/r/ckpt/a") == ["m.json", "x.h5"]
    assert mem.size("/r/ckpt/a/x.h5") == 10 and mem.read_bytes("/r/ckpt/a/m.json") == b"{}"
    assert mem.dirs_created == 3


def test_results_are_written_as_json_and_markdown(tmp_path: Path) -> None:
    s = harness.Samples()
    for v in (3.0, 1.0, 2.0):
        s.add("x", v)
    assert s.median("x") == 2.0 and harness.ratio(4.0, s.median("x")) == 2.0
    assert harness.verdict(0.7, 0.8, at_least=True) == "NOT met"
    js, md = harness.write_results(s.values, "| a |", tmp_path)
    assert json.loads(js.read_text()) == {"x": [3.0, 1.0, 2.0]}
    assert md.read_text() == "| a |\n" and js.stem == md.stem
