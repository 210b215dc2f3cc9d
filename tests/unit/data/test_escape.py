"""A manifest whose object path escapes the dataset's root is refused by every reader.

The forged manifests here are *resealed*: their ``dataset_id`` is recomputed after the edit, so
the seal matches and only the path rule can refuse them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash

from hpcrun.control.payload import canonical_json
from hpcrun.data.dataset import Dataset, load_manifest
from hpcrun.data.manifest import canonical_utf8_json, object_path_escape, source_root
from hpcrun.data.pipeline import DataPipeline
from hpcrun.errors import DataError
from hpcrun.testing.runs import hpcrun
from tests.unit.launch.admission_cases import small_dataset

ESCAPES = {
    "relative": "../../etc/passwd",
    "dotdot": "{root}/../../../etc/passwd",
    "elsewhere": "/etc/passwd",
    "double-slash": "/{root}/doc_000001.npy",
}


def reseal(raw: dict[str, object]) -> str:
    """The manifest's JSON with ``dataset_id`` recomputed over the edited content."""
    raw["dataset_id"] = _id_of(raw)
    return json.dumps(raw, sort_keys=True, indent=1)


def _id_of(raw: dict[str, object]) -> str:
    """``ds-<xxh3-128>`` of the canonical JSON of everything but the stored id (as hpcrun
    computes it), so a forger can reseal any edit."""
    body = {k: v for k, v in raw.items() if k != "dataset_id"}
    return "ds-" + xxhash.xxh3_128_hexdigest(canonical_utf8_json(body).encode())


def forged(tmp_path: Path, kind: str) -> Path:
    """A copy of a good manifest whose second object's path escapes as ``kind``, resealed."""
    good = small_dataset(tmp_path)
    raw = json.loads(good.read_text())
    objects = raw["sources"][0]["objects"]
    root = str(Path(objects[0]["path"]).parent)
    objects[1]["path"] = ESCAPES[kind].format(root=root)
    out = good.with_name("forged.json")
    out.write_text(reseal(raw))
    return out


def test_the_rule_accepts_what_data_build_writes_and_nothing_outside() -> None:
    root = "/data/web"
    assert object_path_escape("/data/web/doc_1.npy", root) is None
    for bad in ("../../etc/passwd", "doc_1.npy", "/data/web/../../etc/passwd",
                "/data/web/./doc_1.npy", "/data//web/doc_1.npy", "/etc/passwd",
                "/data/web/sub/doc_1.npy", "/data/web/doc\x00.npy"):
        assert object_path_escape(bad, root) is not None, bad
    paths = ["/d/a.npy", "/d/b.npy", "/etc/passwd"]
    assert source_root(paths) == "/d"  # the directory most objects are in, not the forged one


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_a_resealed_escaping_manifest_is_refused_when_loaded(tmp_path: Path, kind: str) -> None:
    path = forged(tmp_path, kind)
    raw = json.loads(path.read_text())
    assert raw["dataset_id"] == _id_of(raw)  # the seal matches: only the path rule refuses it
    with pytest.raises(DataError, match="escapes the dataset's root"):
        load_manifest(path)


def test_data_inspect_refuses_it_in_one_line(tmp_path: Path) -> None:
    path = forged(tmp_path, "relative")
    out = hpcrun("data", "inspect", str(path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "'../../etc/passwd' escapes the dataset's root" in out.stderr


def test_the_loaders_refuse_it(tmp_path: Path) -> None:
    path = forged(tmp_path, "relative")
    with pytest.raises(DataError, match="escapes the dataset's root"):
        Dataset.open(path, verify="size")
    with pytest.raises(DataError, match="escapes the dataset's root"):
        DataPipeline(str(path), seed=0, global_batch=2, seq_len=4, replica=0, num_replicas=1)


def test_submits_data_check_refuses_it_as_an_escape(tmp_path: Path) -> None:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.admission import VerifyData
    from hpcrun.launch.admit import probe_data

    path = forged(tmp_path, "relative")
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:main",
                              "data": {"manifest": str(path)}})
    findings = probe_data(spec, VerifyData.SAMPLE)
    lines = [f.line() for f in findings]
    assert any("escapes the dataset's root" in line for line in lines), lines
    assert not any(type(f).__name__ == "Passed" for f in findings), lines


def test_the_dataset_digest_input_keeps_non_ascii_paths_as_characters() -> None:
    value = {"path": "/d/\u00e9t\u00e9.npy", "a": [1, 2.5]}
    assert canonical_utf8_json(value) == '{"a":[1,2.5],"path":"/d/\u00e9t\u00e9.npy"}'
    assert canonical_json(value) == b'{"a":[1,2.5],"path":"/d/\\u00e9t\\u00e9.npy"}'
