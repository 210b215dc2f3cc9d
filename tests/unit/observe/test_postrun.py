"""The post-run manifest: built, written, published fenced, read back verified."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hpcrun.control.log import RunLog
from hpcrun.control.record import load_run_spec, read_record
from hpcrun.errors import RecordError, StaleGenerationError
from hpcrun.observe.postrun import publish_post_run, read_manifest
from tests.unit.observe.builders import make_run


def test_terminal_run_publishes_a_manifest_that_show_reads_back(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, terminal=True)
    (run_dir / "artifacts").mkdir()
    (run_dir / "artifacts" / "model.bin").write_bytes(b"weights")
    (run_dir / "ckpt" / "c10").mkdir(parents=True)
    (run_dir / "ckpt" / "c10" / "manifest.json").write_text("{}")
    rec, spec = read_record(run_dir), load_run_spec(run_dir)
    path = publish_post_run(run_dir, record=rec, spec=spec, log=RunLog(run_dir),
                            generation=rec.generation, holder=rec.holder, now=2000.0,
                            node_hour_price=1.0)
    after = read_record(run_dir)
    assert after.state == "SUCCEEDED" and after.result is not None
    m = read_manifest(run_dir, after.result)
    assert path.is_file()
    assert (m["terminal_state"], m["run_id"], m["provenance"]["spec_id"]) == (
        "SUCCEEDED", "demo-1", spec.spec_id)
    assert m["tokens"] == 7680 and m["steps"] == 30
    assert m["data"]["realized_counts"] == {"web": 2000, "code": 560}
    arts = {a["path"]: a for a in m["artifacts"]}
    assert arts["artifacts/model.bin"]["bytes"] == 7
    assert arts["artifacts/model.bin"]["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert "ckpt/c10/manifest.json" in arts
    assert [c["tier"] for c in m["checkpoints_retained"]] == ["node_local", "shared"]
    assert m["incidents"][0]["signature"] == "crash:oom"
    assert 0 < m["ettr"]["ettr"] <= 1 and m["cost"]["node_hours"] > 0


def test_a_fenced_out_incarnation_cannot_publish(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, terminal=True)
    rec, spec = read_record(run_dir), load_run_spec(run_dir)
    RunLog(run_dir).claim("newer")
    with pytest.raises(StaleGenerationError):
        publish_post_run(run_dir, record=rec, spec=spec, log=RunLog(run_dir),
                         generation=rec.generation, holder=rec.holder, now=2000.0)


def test_a_tampered_manifest_is_refused(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, terminal=True)
    rec, spec = read_record(run_dir), load_run_spec(run_dir)
    path = publish_post_run(run_dir, record=rec, spec=spec, log=RunLog(run_dir),
                            generation=rec.generation, holder=rec.holder, now=2000.0)
    path.write_text(path.read_text().replace("SUCCEEDED", "FAILED"))
    with pytest.raises(RecordError, match="modified after publication"):
        read_manifest(run_dir, read_record(run_dir).result)


def test_no_manifest_before_the_end(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    rec, spec = read_record(run_dir), load_run_spec(run_dir)
    with pytest.raises(RecordError, match="terminal state"):
        publish_post_run(run_dir, record=rec, spec=spec, log=RunLog(run_dir),
                         generation=rec.generation, holder=rec.holder, now=2000.0)
    with pytest.raises(RecordError, match="no published post-run manifest"):
        read_manifest(run_dir, rec.result)
