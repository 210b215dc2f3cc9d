"""Training step slowdown while a drain runs, for ``python -m benchmarks``.

One process times optimizer steps of the tiny example's model (one torch thread, like a rank of
the demo) before and while a second process, as a node agent does, drains a checkpoint committed
on tier 0 to tier 1 with the real ``drain_pending`` (cold read, O_DIRECT copy, cold read-back
and checksum comparison). The drain runs in its own process because h5py serialises HDF5 calls
under one lock per process; what remains shared is the CPU, memory bandwidth and the disk.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.ckpt_bench import llama_state, nbytes
from benchmarks.harness import drop_caches, table
from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.control.log import RunLog, new_holder

REPO = Path(__file__).resolve().parents[1]
_DRAIN = """
import sys
from pathlib import Path
from hpcrun.checkpoint import drain_pending
from hpcrun.control.log import RunLog
import time
run_dir, root, gen, holder = sys.argv[1:5]
print("ready", flush=True)
t0 = time.perf_counter()
done = drain_pending(Path(run_dir), Path(root), node="n0", log=RunLog(Path(run_dir)),
                     generation=int(gen), holder=holder, run_id="bench")
assert done, "nothing drained"
print(time.perf_counter() - t0, flush=True)
"""


class TinySteps:
    """Optimizer steps of the tiny example's model on a fixed batch."""

    def __init__(self) -> None:
        from examples.tiny_lm.model import GPTConfig, TinyGPT

        torch.manual_seed(0)
        self.model = TinyGPT(GPTConfig(vocab=256, seq_len=32, d_model=64, n_layers=2, n_heads=4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.tokens = torch.randint(0, 256, (4, 33))

    def step(self) -> float:
        import torch.nn.functional as F

        t0 = time.perf_counter()
        logits = self.model(self.tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), self.tokens[:, 1:].reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t0


def _commit_tier0(root: Path, size_gib: float) -> tuple[Path, Path, int, str, int]:
    run_dir, tier0 = root / "run", root / "tier0"
    (run_dir / "log").mkdir(parents=True)
    log, holder = RunLog(run_dir), new_holder()
    fence = log.claim(holder)
    layout = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="n0")
    ck = Checkpointer(identity=CheckpointIdentity(run_id="bench", spec_id="bench",
                                                  generation=fence.generation, holder=holder),
                      tiers=TierLayout(run_dir=run_dir, node_local_root=tier0), layout=layout,
                      log=log, fence_slot=fence.slot)
    state = llama_state(size_gib)
    res = ck.save(1, {"model": state}, blocking=True)
    ck.close()
    assert res is not None and res.committed, res
    return run_dir, tier0, fence.generation, holder, nbytes(state)


def run(size_gib: float = 1.0, baseline_steps: int = 200) -> dict[str, Any]:
    torch.set_num_threads(1)
    steps = TinySteps()
    for _ in range(20):
        steps.step()
    with tempfile.TemporaryDirectory(prefix="hpcrun-bench-drain-", dir="/var/tmp") as tmp:
        run_dir, tier0, gen, holder, size = _commit_tier0(Path(tmp), size_gib)
        how = drop_caches(tier0)
        base = [steps.step() for _ in range(baseline_steps)]
        proc = subprocess.Popen([sys.executable, "-c", _DRAIN, str(run_dir), str(tier0),
                                 str(gen), holder], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # the drain process has imported its modules: time from here
        during = []
        while proc.poll() is None:
            during.append(steps.step())
        tail = proc.stdout.read().split()
        if proc.returncode != 0 or not tail:
            raise RuntimeError(f"drain process exited {proc.returncode}")
        drain_s = float(tail[-1])
    base_med, during_med = statistics.median(base), statistics.median(during or [0.0])
    during.sort()
    return {"bytes": size, "cache_drop": how, "drain_s": drain_s,
            "drain_gbps": size / drain_s / 1e9, "baseline_step_s": base_med,
            "during_step_s": during_med, "during_p90_s": during[int(0.9 * (len(during) - 1))],
            "steps_during": len(during), "slowdown": during_med / base_med}


def render(r: dict[str, Any]) -> list[str]:
    if "slowdown" not in r:
        return ["### Step slowdown while a drain runs", f"failed: {r.get('error')}"]
    return [f"### Step slowdown while a drain runs ({r['bytes'] / 2**30:.2f} GiB tier 0 → "
            f"tier 1, in a separate process; cold start: {r['cache_drop']})", "",
            *table(["measure", "value"], [
                ["tiny-model step, no drain (median, s)", r["baseline_step_s"]],
                ["tiny-model step while draining (median, s)", r["during_step_s"]],
                ["tiny-model step while draining (p90, s)", r["during_p90_s"]],
                ["slowdown (median ratio)", r["slowdown"]],
                ["drain wall time (s) / rate (GB/s, copy + verify)",
                 f"{r['drain_s']:.2f} / {r['drain_gbps']:.2f}"],
                ["steps completed during the drain", r["steps_during"]]]), ""]
