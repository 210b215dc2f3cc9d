"""Manifest build, dataset ID, formats, filters, and run-time verification of objects."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.data.build import BuildOptions, build_manifest
from hpcrun.data.dataset import Dataset, Verify
from hpcrun.data.manifest import DatasetManifest
from hpcrun.data.synthetic import write_token_shards
from hpcrun.errors import DataError
from hpcrun.testing.runs import hpcrun
from tests.unit.launch.admission_cases import BROKEN, broken_manifest, small_dataset


def _npy_source(root: Path, n: int = 6, seed: int = 0) -> Path:
    write_token_shards(root / "npy", n, vocab=100, seed=seed, min_len=2, max_len=20)
    return root / "npy"


def test_build_is_deterministic_and_id_tracks_content(tmp_path: Path) -> None:
    src = _npy_source(tmp_path)
    a = build_manifest([str(src)], tmp_path / "a.json", progress=False)
    b = build_manifest([str(src)], tmp_path / "b.json", progress=True)
    assert a.dataset_id == b.dataset_id and a.dataset_id.startswith("ds-")
    np.save(src / "doc_000000.npy", np.array([1, 2, 3], dtype=np.int32))
    c = build_manifest([str(src)], tmp_path / "c.json", progress=False)
    assert c.dataset_id != a.dataset_id


def test_manifest_round_trips_and_detects_tampering(tmp_path: Path) -> None:
    m = build_manifest([f"toy={_npy_source(tmp_path)}"], tmp_path / "m.json", progress=False)
    text = (tmp_path / "m.json").read_text()
    assert DatasetManifest.from_json(text) == m
    raw = json.loads(text)
    raw["sources"][0]["objects"][0]["nbytes"] += 1
    with pytest.raises(DataError, match="does not match its content"):
        DatasetManifest.from_json(json.dumps(raw))
    with pytest.raises(DataError, match="not a valid"):
        DatasetManifest.from_json("{}")


def test_every_format_reads_back_the_same_tokens(tmp_path: Path) -> None:
    docs = [np.arange(n, dtype=np.int64) + 10 * n for n in (3, 5, 1, 4)]
    (tmp_path / "j.jsonl").write_text("".join(json.dumps({"tokens": d.tolist()}) + "\n"
                                              for d in docs))
    with h5py.File(tmp_path / "r.h5", "w") as f:
        f["tokens"] = np.concatenate(docs)
        f["offsets"] = np.cumsum([0] + [d.size for d in docs])
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f["tokens"] = np.stack([np.arange(4) + i for i in range(3)])
    np.save(tmp_path / "rows.npy", np.stack([np.arange(6) * i for i in range(2)]))
    args = [f"j={tmp_path / 'j.jsonl'}", f"r={tmp_path / 'r.h5'}", f"g={tmp_path / 'g.h5'}",
            f"rows={tmp_path / 'rows.npy'}"]
    build_manifest(args, tmp_path / "m.json", progress=False)
    ds = Dataset.open(tmp_path / "m.json")
    for src in (0, 1):
        assert [ds.read(src, i).tolist() for i in range(4)] == [d.tolist() for d in docs]
    assert ds.read(2, 2).tolist() == [2, 3, 4, 5]
    assert ds.read(3, 1).tolist() == (np.arange(6)).tolist()
    assert ds.sources[0].lengths.tolist() == [3, 5, 1, 4]
    assert ds.read_sample(4 + 3).tolist() == docs[3].tolist()  # second source's base is 4


def test_text_jsonl_uses_the_byte_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"text": "hé"}\n{"text": "ok"}\n')
    build_manifest([str(tmp_path / "t.jsonl")], tmp_path / "m.json", progress=False)
    ds = Dataset.open(tmp_path / "m.json")
    assert ds.read(0, 0).tolist() == list("hé".encode())


def test_filter_and_exact_dedup_define_the_logical_records(tmp_path: Path) -> None:
    src = tmp_path / "s"
    src.mkdir()
    for i, doc in enumerate([[1, 2, 3], [9], [1, 2, 3], [4, 5, 6, 7]]):
        np.save(src / f"d{i}.npy", np.array(doc))
    opts = BuildOptions(min_tokens=2, dedup="exact")
    m = build_manifest([str(src)], tmp_path / "m.json", opts, progress=False)
    assert m.sources[0].records == 2 and m.sources[0].dedup == "exact"
    ds = Dataset.open(tmp_path / "m.json")
    assert [ds.read(0, i).tolist() for i in range(2)] == [[1, 2, 3], [4, 5, 6, 7]]


def test_missing_or_changed_object_names_object_and_digests(tmp_path: Path) -> None:
    src = _npy_source(tmp_path)
    m = build_manifest([str(src)], tmp_path / "m.json", progress=False)
    obj = m.sources[0].objects[1]
    np.save(obj.path, np.array([7, 7, 7, 7, 7], dtype=np.int32))
    with pytest.raises(DataError) as err:
        Dataset.open(tmp_path / "m.json")
    msg = str(err.value)
    assert obj.path in msg and obj.digest in msg and "found xxh3-128:" in msg
    Path(obj.path).unlink()
    for verify in (Verify.FULL, Verify.SIZE):
        with pytest.raises(DataError, match=f"{obj.path}.*missing.*{obj.digest}"):
            Dataset.open(tmp_path / "m.json", verify=verify)


def test_index_cache_is_verified_before_use(tmp_path: Path) -> None:
    build_manifest([str(_npy_source(tmp_path))], tmp_path / "m.json", progress=False)
    index = next((tmp_path / "m.index").iterdir())
    arrays = dict(np.load(index))
    arrays["lengths"] = arrays["lengths"] + 1
    np.savez(index, **arrays)
    with pytest.raises(DataError, match="changed: expected digest"):
        Dataset.open(tmp_path / "m.json")
    shutil.rmtree(tmp_path / "m.index")
    with pytest.raises(DataError, match="missing or unreadable"):
        Dataset.open(tmp_path / "m.json")


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl.gz").write_bytes(b"")
    with pytest.raises(DataError, match="compressed"):
        build_manifest([str(tmp_path / "x.jsonl.gz")], tmp_path / "m.json", progress=False)
    with pytest.raises(DataError, match="does not exist"):
        build_manifest([str(tmp_path / "nope")], tmp_path / "m.json", progress=False)


def test_cli_build_and_inspect(tmp_path: Path) -> None:
    src = _npy_source(tmp_path)
    runner = CliRunner()
    out = runner.invoke(cli, ["data", "build", f"toy={src}", "-o", str(tmp_path / "m.json"),
                              "--no-progress", "--workers", "2", "--tokenizer", "synthetic"])
    assert out.exit_code == 0, out.output
    ds_id = out.output.split()[0]
    shown = runner.invoke(cli, ["data", "inspect", str(tmp_path / "m.json")])
    assert shown.exit_code == 0 and ds_id in shown.output and "toy" in shown.output
    assert "synthetic" in shown.output


def test_a_field_of_the_wrong_type_is_one_line_naming_it(tmp_path: Path) -> None:
    build_manifest([f"toy={_npy_source(tmp_path)}"], tmp_path / "m.json", progress=False)
    good = json.loads((tmp_path / "m.json").read_text())
    cases = [
        (["sources", 0, "objects", 0, "digest"], 5,
         "sources[0].objects[0].digest: expected a string, found an integer"),
        (["sources", 0, "records"], True, "sources[0].records: expected an integer, found "
                                          "true/false"),
        (["sources", 0], 1, "sources[0]: expected an object, found an integer"),
        (["tokenizer"], [], "tokenizer: expected an object, found a list"),
    ]
    for path, value, message in cases:
        raw = json.loads(json.dumps(good))
        node = raw
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(DataError, match=re.escape(f"m.json: {message}")):
            DatasetManifest.from_json(json.dumps(raw), origin="m.json")
    del good["sources"]
    with pytest.raises(DataError, match="sources is missing; expected a list"):
        DatasetManifest.from_json(json.dumps(good))


@pytest.mark.parametrize("kind", [*sorted(BROKEN), "not-utf8"])
def test_data_inspect_of_a_broken_manifest_is_one_line_never_a_traceback(
        tmp_path: Path, kind: str) -> None:
    good = small_dataset(tmp_path)
    if kind == "not-utf8":
        bad = tmp_path / "binary.json"
        bad.write_bytes(b"\xff\xfe\x00garbage")
    else:
        bad = broken_manifest(good, kind)
    out = hpcrun("data", "inspect", str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"hpcrun: error: {bad}: ")
    assert "Traceback" not in out.stderr
    if kind != "not-utf8":
        assert BROKEN[kind] in out.stderr
