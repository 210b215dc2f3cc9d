"""`hpcrun ckpt verify` on a real finished run of the local backend: a healthy run passes even
after retention removed old checkpoints and most commits are node-local only; a damaged copy
of it fails, naming the checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hpcrun.checkpoint.hierarchy import read_node_shards
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from tests.integration.local_helpers import cli, local_spec, submit


def test_verify_passes_a_healthy_run_and_fails_a_damaged_copy(tmp_path: Path) -> None:
    run = submit(tmp_path / "runs", local_spec(steps=60, every_steps=5))
    assert str(read_record(run).state) == "SUCCEEDED"
    gc = cli(tmp_path / "runs", "ckpt", "gc", str(run), "--keep-last", "2")
    assert gc.returncode == 0 and "removed retired checkpoint" in gc.stdout, gc.stderr
    ckpts = fold_checkpoints(RunLog(run).read())
    local_only = [c for c in ckpts if c.tiers == {"node_local"}]
    assert len(ckpts) == 12 and local_only, [sorted(c.tiers) for c in ckpts]

    ok = cli(tmp_path / "runs", "ckpt", "verify", str(run))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "FAILED" not in ok.stdout and "retired" in ok.stdout
    newest = ckpts[-1].ckpt_id
    assert f"{newest} [shared] ok" in ok.stdout
    assert f"{newest} [node_local:local0] ok" in ok.stdout

    copy = tmp_path / "copy" / run.name
    shutil.copytree(run, copy)
    shard = sorted((copy / "ckpt" / newest).rglob("rank-*.h5"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) * 2 // 3] ^= 1
    shard.write_bytes(bytes(data))
    bad = cli(tmp_path / "copy", "ckpt", "verify", str(copy))
    assert bad.returncode != 0
    assert f"{newest} [shared] FAILED" in bad.stdout
    assert f"1 of 12 checkpoints failed: {newest}" in bad.stderr


def test_a_sha256_spec_writes_sha256_shards_that_verify_and_restore(tmp_path: Path) -> None:
    """``checkpoint.checksum: sha256`` reaches every shard and manifest; verify and a restore
    read the algorithm from the manifest."""
    spec = local_spec(steps=20, every_steps=5, checkpoint={"checksum": "sha256"})
    run = submit(tmp_path / "runs", spec, inject="crash@step=12,rank=1")
    record = read_record(run)
    assert (str(record.state), record.restarts) == ("SUCCEEDED", 1)  # restored once
    newest = fold_checkpoints(RunLog(run).read())[-1]
    manifest = json.loads((run / newest.manifest).read_text())
    assert manifest["checksum"] == "sha256"
    shards = [s for node in dict.fromkeys(manifest["nodes"])
              for s in read_node_shards(run, newest.ckpt_id, manifest, node)]
    digests = [d.checksum for s in shards for d in s.datasets]
    assert digests and all(d.startswith("sha256:") and len(d) == 7 + 64 for d in digests)
    ok = cli(tmp_path / "runs", "ckpt", "verify", str(run))
    assert ok.returncode == 0 and f"{newest.ckpt_id} [shared] ok" in ok.stdout, ok.stdout
