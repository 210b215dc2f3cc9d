"""Checkpoint plane on the real Slurm testbed: a multi-node checkpoint commits on each node's own
node-local tier and drains to the shared tier; after a node is lost, its partner drains the lost
node's copy of the newest commit, and the run restores that commit from the shared tier on other
nodes and finishes.
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
    paced,
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


def _newest_tier0(run: TestbedRun) -> tuple[str, int, int]:
    """(ckpt id, step, newest tier-1 step) of the newest tier-0 commit."""
    commits = run.valid(EntryKind.COMMIT)
    local = [e for e in commits if e.payload["tier"] == "node_local"]
    shared = [int(e.payload["step"]) for e in commits if e.payload["tier"] == "shared"]
    return (str(local[-1].payload["ckpt_id"]) if local else "",
            int(local[-1].payload["step"]) if local else -1, max(shared, default=-1))


def _copy_complete(run: TestbedRun, ckpt_id: str, owner: str) -> bool:
    return any(e.payload.get("event") == "partner_copy" and e.payload["ckpt_id"] == ckpt_id
               and e.payload["owner"] == owner and e.payload["complete"]
               for e in run.valid(EntryKind.NOTE))


@pytest.mark.slow
def test_a_node_crash_loses_no_commit_whose_shards_survive_on_the_partner(
        testbed: Testbed, runs: RunFactory, slurm: JobClient, job_dir: Path) -> None:
    """2 nodes x 2 ranks, no spare. Drains to tier 1 are held back (a failing shared tier), so
    the newest commit is on tier 0 only, with the second node's shards copied to its partner.
    The second node loses power: the allocation outlives it, the survivor drains its own shards
    and the lost node's copy to tier 1 before the requeue, and the next allocation restores
    that newest commit from tier 1, not the older one tier 1 had."""
    hold = job_dir / "hold-drains"
    run = runs.submit(slurm_spec(testbed, steps=240, every_steps=40),
                      inject=paced(0.2, 4) + f";storage@mode=fail,while={hold},ops=rename")
    run.wait_for("a checkpoint on the shared tier",
                 lambda: _newest_tier0(run)[2] >= 40, timeout=180)
    hold.touch()
    first = run.record()
    victim = first.membership[1]  # never the batch host
    ckpt_id, step, _ = run.wait_for(
        "a newer commit on tier 0 only, its copy on the partner",
        lambda: ((n := _newest_tier0(run))[1] > n[2] and _copy_complete(run, n[0], victim)
                 and n), timeout=180)
    try:
        crashed = run.cli("testbed", "crash", victim, "--state-dir",
                          str(testbed.config.state_dir))
        assert crashed.returncode == 0, crashed.stderr
        at_crash = _newest_tier0(run)
        hold.unlink()
        assert at_crash[:2] == (ckpt_id, step) and at_crash[2] < step, \
            "a commit landed between the check and the crash: the test saw nothing"
        rec = run.wait({"SUCCEEDED"}, timeout=400)
    finally:
        hold.unlink(missing_ok=True)
        testbed.boot(victim)
    assert rec.step == 240 and rec.requeues == 1 and rec.job_ids == (run.job_id,)
    assert rec.faults[0].fault == "node_failure" and victim in rec.faults[0].detail
    salvage = [e for e in run.valid(EntryKind.NOTE) if e.payload.get("event") == "salvage"]
    assert [e.payload["lost"] for e in salvage] == [[victim]]
    drained = [e for e in run.valid(EntryKind.DRAINED) if e.payload["ckpt_id"] == ckpt_id]
    assert victim in {e.payload["node"] for e in drained if e.slot > salvage[0].slot}
    states = run.states()
    restarted = [e for s, e in states if s == "STARTING" and e.generation > first.generation]
    resumed = first_after(states, "RUNNING", restarted[0].slot)
    # no committed step lost: the newest commit, not the older one tier 1 had at the crash
    assert (resumed.payload["restored_step"], resumed.payload["restored_tier"]) == \
        (step, "shared")
    allocations = [e.payload["nodes"] for e in run.valid(EntryKind.JOB) if "nodes" in e.payload]
    assert victim in allocations[0] and victim not in allocations[-1]
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
