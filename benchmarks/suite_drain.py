"""Training step slowdown while a drain runs, for ``python -m benchmarks``.

One process times optimizer steps of the tiny example's model (one torch thread, like a rank of
the demo, leaving its heartbeat every half second as a rank does) before and while a second
process, as a node's drainer does, drains a checkpoint committed on tier 0 to tier 1 with the
real ``drain_pending`` (cold read, O_DIRECT copy, cold read-back and checksum comparison). Two
drains of the same size run side by side: *unpaced* (normal priority, full speed: the final
drain round of an incarnation) and *background* (the drainer process's setting: lowest CPU and
I/O priority, copies paced by the step periods read from the heartbeats). The background
drainer watches the heartbeats for two seconds first, as a drainer that is up between
checkpoints has. The drain runs in its own process because h5py serialises HDF5 calls under one
lock per process; what remains shared is the CPU, memory bandwidth and the disk.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.ckpt_bench import llama_state, nbytes
from benchmarks.harness import drop_caches, table, verdict
from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.control.log import RunLog, new_holder
from hpcrun.observe.heartbeat import RankHeartbeat
from hpcrun.runtime.node.drainpace import drain_heartbeat_dir

REPO = Path(__file__).resolve().parents[1]
_DRAIN = """
import sys
from pathlib import Path
from hpcrun.checkpoint import drain_pending
from hpcrun.control.log import RunLog
import time
run_dir, root, gen, holder, mode, hb = sys.argv[1:7]
pacer = None
if mode == "background":
    from hpcrun.checkpoint.pacing import run_in_background
    from hpcrun.runtime.node.drainpace import HeartbeatPeriods
    _, pacer = run_in_background(HeartbeatPeriods(Path(hb)))
    time.sleep(2.0)
print("ready", flush=True)
t0 = time.perf_counter()
done = drain_pending(Path(run_dir), Path(root), node="n0", log=RunLog(Path(run_dir)),
                     generation=int(gen), holder=holder, run_id="bench")
assert done, "nothing drained"
extra = [pacer.rate, pacer.backoffs] if pacer else [0, 0]
print(*extra, time.perf_counter() - t0, flush=True)
"""


class TinySteps:
    """Optimizer steps of the tiny example's model on a fixed batch, with a rank's heartbeat."""

    def __init__(self) -> None:
        self.beat: RankHeartbeat | None = None
        self.n = 0
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
        self.n += 1
        if self.beat is not None:
            self.beat.beat(self.n)
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


def _drain_while_stepping(steps: TinySteps, root: Path, size_gib: float, mode: str,
                          baseline_steps: int) -> dict[str, Any]:
    run_dir, tier0, gen, holder, size = _commit_tier0(root, size_gib)
    hb = drain_heartbeat_dir(tier0, run_dir.name, "n0")
    steps.beat = RankHeartbeat(hb, rank=0, min_interval_s=0.5)
    gc.collect()
    how = drop_caches(tier0)
    base = [steps.step() for _ in range(baseline_steps)]
    proc = subprocess.Popen([sys.executable, "-c", _DRAIN, str(run_dir), str(tier0), str(gen),
                             holder, mode, str(hb)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = ""
    while not line:  # keep training (and beating) while the drainer starts up
        steps.step()
        line = proc.stdout.readline() if _ready(proc) else ""
    during = []
    while proc.poll() is None:
        during.append(steps.step())
    tail = proc.stdout.read().split()
    if proc.returncode != 0 or len(tail) < 3:
        raise RuntimeError(f"{mode} drain process exited {proc.returncode}")
    rate, backoffs, drain_s = float(tail[-3]), int(tail[-2]), float(tail[-1])
    base_med, during_med = statistics.median(base), statistics.median(during or [0.0])
    base.sort()
    during.sort()
    return {"bytes": size, "cache_drop": how, "drain_s": drain_s,
            "drain_gbps": size / drain_s / 1e9, "baseline_step_s": base_med,
            "baseline_p90_s": base[int(0.9 * (len(base) - 1))],
            "during_step_s": during_med, "during_p90_s": during[int(0.9 * (len(during) - 1))],
            "steps_during": len(during), "slowdown": during_med / base_med,
            "slowdown_p90": during[int(0.9 * (len(during) - 1))] / base_med,
            "final_rate_mib_s": rate / 2**20, "backoffs": backoffs}


def _ready(proc: subprocess.Popen[str]) -> bool:
    import select

    assert proc.stdout is not None
    return bool(select.select([proc.stdout], [], [], 0)[0])


def run(size_gib: float = 1.0, baseline_steps: int = 300) -> dict[str, Any]:
    torch.set_num_threads(1)
    steps = TinySteps()
    for _ in range(20):
        steps.step()
    out: dict[str, Any] = {}
    for mode in ("unpaced", "background"):
        with tempfile.TemporaryDirectory(prefix="hpcrun-bench-drain-", dir="/var/tmp") as tmp:
            out[mode] = _drain_while_stepping(steps, Path(tmp), size_gib, mode, baseline_steps)
    return out


def _rows(r: dict[str, Any]) -> list[list[Any]]:
    u, b = r["unpaced"], r["background"]
    return [
        ["tiny-model step, no drain (median / p90, ms)",
         f"{u['baseline_step_s'] * 1e3:.2f} / {u['baseline_p90_s'] * 1e3:.2f}",
         f"{b['baseline_step_s'] * 1e3:.2f} / {b['baseline_p90_s'] * 1e3:.2f}"],
        ["tiny-model step while draining (median / p90, ms)",
         f"{u['during_step_s'] * 1e3:.2f} / {u['during_p90_s'] * 1e3:.2f}",
         f"{b['during_step_s'] * 1e3:.2f} / {b['during_p90_s'] * 1e3:.2f}"],
        ["slowdown, median (target ≤ 1.05)", u["slowdown"], b["slowdown"]],
        ["slowdown, p90 while draining / median without (target ≤ 1.5)", u["slowdown_p90"],
         b["slowdown_p90"]],
        ["drain wall time (s) / rate (GB/s, copy + verify)",
         f"{u['drain_s']:.2f} / {u['drain_gbps']:.2f}",
         f"{b['drain_s']:.2f} / {b['drain_gbps']:.3f}"],
        ["background pacer: final rate (MiB/s of I/O) / back-offs", "-",
         f"{b['final_rate_mib_s']:.0f} / {b['backoffs']}"],
        ["steps completed during the drain", u["steps_during"], b["steps_during"]]]


def render(r: dict[str, Any]) -> list[str]:
    if "background" not in r:
        return ["### Step slowdown while a drain runs", f"failed: {r.get('error')}"]
    b = r["background"]
    return [f"### Step slowdown while a drain runs ({b['bytes'] / 2**30:.2f} GiB tier 0 → "
            f"tier 1, in a separate process; cold start: {b['cache_drop']})", "",
            *table(["measure", "unpaced, normal priority", "background drainer"], _rows(r)),
            "", f"- background drain, median slowdown ≤ 1.05: {b['slowdown']:.3f}, "
            f"{verdict(b['slowdown'], 1.05, at_least=False)}; p90 ≤ 1.5: "
            f"{b['slowdown_p90']:.2f}, {verdict(b['slowdown_p90'], 1.5, at_least=False)}", ""]
