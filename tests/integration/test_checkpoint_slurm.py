"""Checkpoint plane on the real Slurm testbed: a multi-node checkpoint commits on each node's own
node-local tier and drains to the shared tier; after a node is lost, the run restores from the
shared tier on other nodes and finishes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcrun.checkpoint.peer.ledger import PARTNER_DIR
from hpcrun.control.log import EntryKind
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import (
    BASELINE_STEPS,
    RunFactory,
    TestbedRun,
    baseline_run,
    first_after,
    slurm_spec,
    wait_until,
)

pytestmark = pytest.mark.slurm


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tier0_shards(testbed: Testbed, run: TestbedRun, ckpt_id: str, node: str) -> list[Path]:
    """``node``'s tier-0 shards of ``ckpt_id``, by their host path (not the partner copies it
    holds for another node, which every multi-node run with a tier 0 keeps)."""
    root = testbed.node_local_dir(node) / "hpcrun" / run.job_id / run.name
    return sorted(p for p in root.glob(f"**/{ckpt_id}/*/*.h5")
                  if PARTNER_DIR not in p.relative_to(root).parts)


def test_multi_node_checkpoint_commits_on_node_local_tiers_and_drains_to_shared(
        testbed: Testbed) -> None:
    run = baseline_run(testbed)
    rec = run.wait({"SUCCEEDED"}, timeout=120)
    nodes = list(rec.membership)
    final = [c for c in rec.checkpoints if c.step == BASELINE_STEPS]
    assert {c.tier for c in final} == {"node_local", "shared"}
    tier0 = next(c for c in final if c.tier == "node_local")
    tier1 = next(c for c in final if c.tier == "shared")
    assert tier0.slot < tier1.slot and tier0.ckpt_id == tier1.ckpt_id
    assert sorted(tier0.nodes) == sorted(nodes)
    assert sorted(rec.drained[tier0.ckpt_id]) == sorted(nodes)  # every node drained its shards
    shared_dir = run.run_dir / "ckpt" / tier0.ckpt_id
    assert (shared_dir / "manifest.json").exists()
    for index, node in enumerate(nodes):
        local = _tier0_shards(testbed, run, tier0.ckpt_id, node)
        ranks = [f"rank-{r:05d}.h5" for r in (2 * index, 2 * index + 1)]
        assert [p.name for p in local] == ranks, f"{node} holds other shards: {local}"
        assert {p.parent.name for p in local} == {node}
        drained = sorted((shared_dir / node).glob("*.h5"))
        assert [p.name for p in drained] == ranks
        assert [_digest(p) for p in drained] == [_digest(p) for p in local]
    drains = [e for e in run.valid(EntryKind.DRAINED) if e.payload["ckpt_id"] == tier0.ckpt_id]
    assert all(e.slot < tier1.slot for e in drains)  # tier 1 is committed after every drain


@pytest.mark.slow
def test_restore_after_node_crash_comes_from_the_shared_tier(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    run = runs.submit(slurm_spec(testbed, steps=1500, every_steps=20))
    run.wait_for("a checkpoint on the shared tier",
                 lambda: any(c.tier == "shared" and c.step >= 20
                             for c in run.record().checkpoints), timeout=120)
    first = run.record()
    victim = first.membership[1]  # never the batch host
    try:
        crashed = run.cli("testbed", "crash", victim, "--state-dir",
                          str(testbed.config.state_dir))
        assert crashed.returncode == 0, crashed.stderr
        rec = run.wait({"SUCCEEDED"}, timeout=300)
    finally:
        testbed.boot(victim)
    assert rec.step == 1500 and rec.requeues == 1 and rec.job_ids == (run.job_id,)
    states = run.states()
    restarted = [e for s, e in states if s == "STARTING" and e.generation > first.generation]
    resumed = first_after(states, "RUNNING", restarted[0].slot)
    assert resumed.payload["restored_tier"] == "shared"
    assert resumed.payload["restored_step"] >= 20
    allocations = [e.payload["nodes"] for e in run.valid(EntryKind.JOB) if "nodes" in e.payload]
    assert victim in allocations[0] and victim not in allocations[-1]
    restored = [e for e in run.rank_events("restored") if e["generation"] > first.generation]
    assert restored and all(e["data"]["tier"] == "shared" for e in restored)
    history = slurm.wait_for_accounting(int(run.job_id), {"NODE_FAIL", "COMPLETED"}, timeout=30)
    assert [r.state for r in history] == ["NODE_FAIL", "COMPLETED"]
    # Slurm requeued by itself; the next gang logged why, from Slurm's account of the run
    assert rec.faults[0].fault == "node_failure" and victim in rec.faults[0].detail
    # the rest: the newest checkpoint, whose tier-0 copy died with the node, was skipped
    assert {f.fault for f in rec.faults[1:]} <= {"storage_error"}
    wait_until(f"{victim} back in service", lambda: _idle(slurm, victim), timeout=60)


def _idle(slurm: JobClient, node: str) -> bool:
    out = slurm.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
    return out in ("idle", "mixed", "allocated")


def test_each_rank_restores_only_its_own_shard_bytes(slurm: JobClient, job_dir: Path,
                                                     free_port: Callable[[], int]) -> None:
    """4 ranks on 2 nodes save dim-0 sharded state and restore it on the same layout: each
    rank's measured bytes read equal its own shard's bytes, from one file, and rows are equal."""
    repo = Path(__file__).resolve().parents[2]
    (job_dir / "run").mkdir()
    out = slurm.run("srun", "-N2", "--ntasks-per-node=2",
                    f"--export=ALL,MASTER_ADDR=127.0.0.1,MASTER_PORT={free_port()},"
                    f"GLOO_SOCKET_IFNAME=lo,PYTHONPATH={repo}", sys.executable,
                    str(repo / "tests" / "integration" / "sharded_restore.py"),
                    str(job_dir / "run"), timeout=180)
    assert out.returncode == 0, f"srun failed: {out.stderr[-4000:]}"
    rows = sorted((json.loads(line) for line in out.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1, 2, 3] and len({r["node"] for r in rows}) == 2
    for r in rows:
        assert r["rows_ok"], r
        assert r["bytes_read"] == r["own_bytes"] > 0, r
        assert r["files_read"] == 1, r
