"""Real 4-process gloo gang on two emulated nodes: tiers, drain, resharding 4 → 2 → 4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcrun.checkpoint import Tier, fold_checkpoints
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.testing.net import free_port

ROOT = Path(__file__).resolve().parents[3]


def test_two_node_commit_drain_and_reshard(run_dir: Path, tmp_path: Path) -> None:
    tier0, out = tmp_path / "tier0", tmp_path / "out"
    out.mkdir()
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.unit.checkpoint.dist_worker",
                               str(r), str(port), str(run_dir), str(tier0), str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(4)]
    logs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(logs)[-4000:]

    b = [json.loads((out / f"rank-{r}-B.json").read_text()) for r in range(2)]
    c = [json.loads((out / f"rank-{r}-C.json").read_text()) for r in range(4)]
    # 4 → 2: replicated model and dim-0 rows identical; node b's shards came from tier 1.
    assert all(x["step"] == 10 and x["model_ok"] and x["rows_ok"] for x in b)
    assert [x["nrows"] for x in b] == [19, 18] and {x["tier"] for x in b} == {"shared"}
    # 2 → 4: identical again, read from node a's tier 0 (not drained, still local there).
    assert all(x["step"] == 20 and x["model_ok"] and x["rows_ok"] for x in c)
    assert [x["nrows"] for x in c] == [10, 9, 9, 9] and {x["tier"] for x in c} == {"node_local"}

    entries = RunLog(run_dir).read()
    first = fold_checkpoints(entries)[0]
    assert first.tiers == {Tier.NODE_LOCAL, Tier.SHARED} and first.drained == {"a", "b"}
    assert len([e for e in entries if e.kind == EntryKind.DRAINED]) == 2
    # every rank wrote about a quarter of the replicated bytes
    shards = sorted((run_dir / "ckpt" / first.ckpt_id).rglob("rank-*.h5"))
    sizes = [p.stat().st_size for p in shards]
    assert len(shards) == 4 and max(sizes) < 1.6 * min(sizes)


def test_same_layout_restore_reads_only_each_ranks_own_shard(tmp_path: Path) -> None:
    """4 gloo ranks on 2 emulated nodes (the testbed test's script, without Slurm)."""
    port, run = free_port(), tmp_path / "run"
    run.mkdir()
    procs = [subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "integration" / "sharded_restore.py"), str(run)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SLURM_PROCID": str(r), "SLURM_NTASKS": "4",
             "SLURMD_NODENAME": f"n{r // 2}", "SLURM_NODEID": str(r // 2),
             "SLURM_LOCALID": str(r % 2), "SLURM_NNODES": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}) for r in range(4)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(outs)[-4000:]
    rows = [json.loads(next(x for x in o.splitlines() if x.startswith("{"))) for o in outs]
    assert all(r["rows_ok"] and r["bytes_read"] == r["own_bytes"] > 0 and r["files_read"] == 1
               for r in rows), rows
