"""Restoring a lost node's shards from its partner vs reading them from node-local storage,
for ``python -m benchmarks`` (``--only partner``) or alone (``python -m benchmarks.suite_partner
[--size-gib 0.5] [--repeats 3]``).

One checkpoint (the Llama-shaped bf16 state of ``--size-gib``) is committed on node n0's tier 0.
A holder agent's partner server (node n1, in its own process, as on a real node) receives n0's
shards through the real push (:func:`~hpcrun.checkpoint.peer.push.push_round`). Then, cold
(page cache dropped before each), side by side per repeat:

- *node-local read*: the shard file read past the page cache (what a restore reads from tier 0);
- *node-local restore*: ``Checkpointer.restore`` on n0 into the state's tensors (the newest of
  two commits, so read straight into them);
- *restore from the partner*: ``Checkpointer.restore`` on a replacement n2 whose tier 0 is
  empty, reading the lost node's shard from the holder by byte range straight into the state's
  tensors (the peer tier, :mod:`hpcrun.checkpoint.peer.read`, what a spare's ranks do after a swap).

The target compares restoring from the partner with restoring from node-local storage
(>= 0.8x the rate: the same work, another source); the rate is also shown against the raw
node-local read of the shard file.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.ckpt_bench import llama_state, nbytes
from benchmarks.harness import Samples, drop_caches, ratio, table, timed, verdict
from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.checkpoint.rawio import read_file_cold
from hpcrun.control.log import RunLog, new_holder

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.8
_HOLDER = """
import sys
from pathlib import Path
from hpcrun.control.log import RunLog
from hpcrun.checkpoint.peer.server import PartnerServer
run_dir, root = Path(sys.argv[1]), Path(sys.argv[2])
with PartnerServer(run_dir, node="n1", host="127.0.0.1", node_local_root=root,
                   log=RunLog(run_dir)):
    print("ready", flush=True)
    sys.stdin.read()
"""


def _layout(node: str) -> Layout:
    return Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node=node)


class Bench:
    """A run directory with one committed tier-0 checkpoint of n0 and a fence per step."""

    def __init__(self, root: Path, size_gib: float) -> None:
        self.root, self.run_dir = root, root / "run"
        (self.run_dir / "log").mkdir(parents=True)
        self.log = RunLog(self.run_dir)
        self.state = llama_state(size_gib)
        self.bytes = nbytes(self.state)
        ck = self.checkpointer("n0")
        # two commits, as in a run past its first checkpoint (keep_last >= 2): the newest is
        # read straight into the tensors, the older one being there to refill them if it failed
        for step in (1, 2):
            res = ck.save(step, {"model": self.state}, blocking=True)
            assert res is not None and res.committed, res
        ck.close()
        self.ckpt_id = res.ckpt_id

    def tier0(self, node: str) -> Path:
        return self.root / f"nvme-{node}"

    def checkpointer(self, node: str, *, peers: bool = False) -> Checkpointer:
        from hpcrun.checkpoint.peer.read import PeerShards

        holder = new_holder()
        fence = self.log.claim(holder)
        return Checkpointer(identity=CheckpointIdentity(
            run_id="bench", spec_id="bench", generation=fence.generation, holder=holder),
            tiers=TierLayout(run_dir=self.run_dir, node_local_root=self.tier0(node)),
            layout=_layout(node), log=self.log, fence_slot=fence.slot,
            peers=PeerShards(run_dir=self.run_dir, node=node, gang=(node, "n1"),
                             node_local_root=self.tier0(node), log=self.log) if peers else None)

    def restore(self, node: str, *, peers: bool = False) -> float:
        """A restore on ``node`` (through the peer tier: from the holder, n2's tier 0 empty)."""
        if peers:
            shutil.rmtree(self.tier0(node), ignore_errors=True)
        ck = self.checkpointer(node, peers=peers)
        try:
            t0 = time.perf_counter()
            res = ck.restore({"model": self.state})
            took = time.perf_counter() - t0
        finally:
            ck.close()
        assert res is not None and res.tier == ("peer" if peers else "node_local"), res
        return took

    def push(self) -> None:
        """n0's shards to the holder n1, through the real push."""
        from hpcrun.checkpoint.peer.push import PushTarget, push_round

        fence = self.log.claim(holder := new_holder())
        done = push_round(PushTarget(run_dir=self.run_dir, node="n0", partner="n1",
                                     node_local_root=self.tier0("n0"),
                                     generation=fence.generation, holder=holder), self.log)
        assert done == self.ckpt_id, done

    def shard(self) -> Path:
        return next(p for p in self.tier0("n0").rglob("rank-*.h5") if self.ckpt_id in str(p))


def run(size_gib: float = 0.5, repeats: int = 3) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hpcrun-bench-partner-", dir="/var/tmp") as tmp:
        b = Bench(Path(tmp), size_gib)
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(b.run_dir),
                                   str(b.tier0("n1"))], cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            b.push()
            return _measure(b, repeats)
        finally:
            holder.communicate("", timeout=30)


def _measure(b: Bench, repeats: int) -> dict[str, Any]:
    s = Samples()
    how = ""
    shard_bytes = b.shard().stat().st_size
    for _ in range(repeats):
        how = drop_caches(b.root)
        s.add("local_read_s", timed(lambda: read_file_cold(b.shard())))
        drop_caches(b.root)
        s.add("local_restore_s", b.restore("n0"))
        drop_caches(b.root)
        s.add("peer_restore_s", b.restore("n2", peers=True))
    med = s.medians()
    out: dict[str, Any] = {"bytes": shard_bytes, "state_bytes": b.bytes, "cache_drop": how,
                           "samples": s.values, **med}
    out["local_read_gbps"] = shard_bytes / med["local_read_s"] / 1e9
    out["peer_restore_gbps"] = shard_bytes / med["peer_restore_s"] / 1e9
    out["peer_vs_local_restore"] = ratio(med["local_restore_s"], med["peer_restore_s"])
    out["peer_restore_vs_local_read"] = ratio(med["local_read_s"], med["peer_restore_s"])
    return out


def render(r: dict[str, Any]) -> list[str]:
    if "peer_restore_s" not in r:
        return ["### Partner restore vs node-local read", f"failed: {r.get('error')}"]
    rows = [
        ["node-local read of the shard file (cold)", r["local_read_s"], r["local_read_gbps"]],
        ["node-local restore into the tensors (cold)", r["local_restore_s"],
         r["bytes"] / r["local_restore_s"] / 1e9],
        ["replacement: restore from the partner's copy (peer tier, cold)",
         r["peer_restore_s"], r["peer_restore_gbps"]]]
    return [f"### Partner restore vs node-local read ({r['bytes'] / 2**30:.2f} GiB shard; cold "
            f"start: {r['cache_drop']})", "",
            *table(["path", "seconds (median)", "GB/s"], rows), "",
            "samples (s): " + "; ".join(f"{k} " + ", ".join(f"{v:.3f}" for v in vs)
                                        for k, vs in r["samples"].items()), "",
            f"- restore from the partner / node-local restore ≥ {TARGET}: "
            f"{r['peer_vs_local_restore']:.2f}, "
            f"{verdict(r['peer_vs_local_restore'], TARGET, at_least=True)}",
            f"- restore from the partner / raw node-local read of the file: "
            f"{r['peer_restore_vs_local_read']:.2f}x the rate", ""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_partner")
    p.add_argument("--size-gib", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    print("\n".join(render(run(a.size_gib, a.repeats))))


if __name__ == "__main__":
    main()
