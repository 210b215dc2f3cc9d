"""The post-run manifest: built, written, published fenced, read back verified."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hpcrun.control.cancel import cancel_run
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run, load_run_spec, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.control.watch import watch_once
from hpcrun.errors import RecordError, StaleGenerationError
from hpcrun.observe.postrun import post_run_publisher, publish_post_run, read_manifest
from hpcrun.scheduler.slurm import SlurmClient
from hpcrun.testing import FakeClock
from tests.unit.control.fake_cluster import FakeCluster, Job
from tests.unit.observe.builders import make_run

NOW = 1_700_000_000.0


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


# ------------------------------------------------ every path that ends a run publishes one


@pytest.fixture
def slurm_run(tmp_path: Path) -> Path:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f", "retry": {"jitter": False}})
    run_dir = create_run(tmp_path, spec, run_id="t-1", owner="alice")
    (run_dir / "job.sh").write_text("#!/bin/bash\nsrun hpcrun agent\n")
    log = RunLog(run_dir)
    log.append(EntryKind.JOB, generation=-1, holder="", payload={"job_id": "101"})
    fence = log.claim("agent-1")
    for state in ("STARTING", "RUNNING"):
        log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                    payload={"state": state})
    return run_dir


def _published(run_dir: Path) -> dict:
    record = read_record(run_dir)
    manifest = read_manifest(run_dir, record.result)
    assert manifest["terminal_state"] == record.state
    assert manifest["generation"] == record.generation  # under the fence that ended it
    return manifest


def test_cancel_publishes_a_cancelled_manifest(slurm_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="RUNNING")
    cancel_run(slurm_run, slurm=SlurmClient(cluster), user="alice", clock=clock,
               on_end=post_run_publisher(clock=clock))
    manifest = _published(slurm_run)
    assert manifest["terminal_state"] == "CANCELLED" and manifest["created_ts"] == NOW
    assert manifest["job_ids"] == ["101"]


def test_a_job_cancelled_outside_hpcrun_gets_its_manifest_from_the_watch_pass(
        slurm_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="CANCELLED", exit="0:15")
    watch_once(slurm_run, SlurmClient(cluster), clock, on_end=post_run_publisher(clock=clock))
    assert _published(slurm_run)["terminal_state"] == "CANCELLED"


def test_a_user_error_found_by_the_watch_pass_publishes_a_failed_manifest(
        slurm_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="FAILED", exit="2:0", nodes="n1",
                              fields={"EndTime": "2023-11-14T00:00:00"})
    watch_once(slurm_run, SlurmClient(cluster), clock, on_end=post_run_publisher(clock=clock),
               node_settle_s=0)
    manifest = _published(slurm_run)
    assert manifest["terminal_state"] == "FAILED"
    assert [i["fault"] for i in manifest["incidents"]] == ["user_error"]


def test_without_a_publisher_the_watch_pass_ends_the_run_without_a_manifest(
        slurm_run: Path) -> None:
    cluster, clock = FakeCluster(), FakeClock(NOW)
    cluster.jobs["101"] = Job(state="CANCELLED", exit="0:15")
    watch_once(slurm_run, SlurmClient(cluster), clock)
    assert read_record(slurm_run).state == "CANCELLED"
    with pytest.raises(RecordError, match="no published post-run manifest"):
        read_manifest(slurm_run, read_record(slurm_run).result)
