"""Recovery time of real runs, split into phases, against the seed's restart budget.

Two tiny-example runs (2 nodes × 2 ranks), on the Slurm testbed when it is up, else on the local
backend: one with a rank crash (repaired inside the allocation) and one with a preemption
(commit, requeue, restore). :func:`hpcrun.drill.rto.rto_splits` splits each recovery from the
run log and the ranks' events: detect → requeue/wait → start → restore → first step.

The seed's budget for a restart: detect 15 s, node swap 10 s, pod init 5 s, sharded load of
30 GB at 2 GB/s 15 s, process-group init 10 s: about 55 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from benchmarks.harness import table

REPO = Path(__file__).resolve().parents[1]
TESTBED = Path(os.environ.get("HPCRUN_TESTBED_DIR", "/var/lib/hpcrun-testbed"))
BUDGET = (("detect", 15.0, "detect", "hpcrun: rank exit / heartbeat seen by the node-0 agent"),
          ("node swap", 10.0, "requeue_wait", "Slurm: requeue and queue wait (in-allocation "
                                              "restarts skip it)"),
          ("pod init + process-group init", 15.0, "start",
           "hpcrun: agents respawn ranks; interpreter, imports and torch.distributed init"),
          ("sharded load (30 GB at 2 GB/s)", 15.0, "restore", "hpcrun: restore; bytes/tier"),
          ("first step", 0.0, "first_step", "the training script (not in the seed's budget)"))


def _env() -> tuple[dict[str, str], Path, str]:
    """Environment, runs root and site: the testbed when it answers, else the local backend."""
    conf = TESTBED / "etc" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        subprocess.run(["sinfo", "-h"], env=env, capture_output=True, check=True, timeout=10)
        root = TESTBED / "shared" / "bench" / uuid.uuid4().hex[:8]
        site = "testbed"
    except (OSError, subprocess.SubprocessError):
        root = Path("/var/tmp") / f"hpcrun-bench-restart-{uuid.uuid4().hex[:8]}"
        env, site = dict(os.environ), "local"
    root.mkdir(parents=True)
    return {**env, "HPCRUN_RUNS": str(root / "runs")}, root, site


def _one(root: Path, env: dict[str, str], site: str, inject: str, name: str) -> dict[str, Any]:
    from hpcrun.control.log import RunLog
    from hpcrun.drill.rto import rto_splits
    from hpcrun.observe.events import read_events
    from hpcrun.testing.runs import hpcrun, run_dir_of, tiny_spec, wait_for_state, write_spec

    spec = tiny_spec(manifest=root / "data" / "manifest.json", site=site, steps=40,
                     every_steps=10, name=f"bench-{name}")
    out = hpcrun("submit", str(write_spec(root / f"{name}.yaml", spec)), "--inject", inject,
                 env=env, cwd=REPO, timeout=180)
    if out.returncode != 0:
        raise RuntimeError(f"submit failed: {out.stderr[-500:]}")
    run_dir = run_dir_of(Path(env["HPCRUN_RUNS"]), out.stdout)
    record = wait_for_state(run_dir, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=420)
    splits = rto_splits(RunLog(run_dir).read(), list(read_events(run_dir)))
    return {"inject": inject, "state": str(record.state),
            "recoveries": [{"cause": s.cause, "phases": dict(s.phases), "total_s": s.total_s,
                            "steps_lost": s.steps_lost} for s in splits]}


def run() -> dict[str, Any]:
    env, root, site = _env()
    try:
        subprocess.run([sys.executable, "-m", "examples.tiny_lm.prepare", str(root / "data")],
                       cwd=REPO, capture_output=True, check=True, timeout=300)
        runs = {"crash": _one(root, env, site, "crash@step=25,rank=1", "crash"),
                "preempt": _one(root, env, site, "preempt@step=12", "preempt")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"backend": site, "runs": runs}


def render(r: dict[str, Any]) -> list[str]:
    if "runs" not in r:
        return ["### Recovery time vs the restart budget", f"failed: {r.get('error')}"]
    rows = []
    for term, budget, phase, who in BUDGET:
        cells = []
        for name in ("crash", "preempt"):
            recs = r["runs"][name]["recoveries"]
            cells.append(f"{recs[0]['phases'][phase]:.1f}" if recs and phase in
                         recs[0]["phases"] else "-")
        rows.append([term, budget, *cells, who])
    totals = [f"{r['runs'][n]['recoveries'][0]['total_s']:.1f}"
              if r["runs"][n]["recoveries"] else "-" for n in ("crash", "preempt")]
    rows.append(["total", 55.0, *totals, ""])
    return [f"### Recovery time vs the restart budget (tiny example, 2 × 2 ranks, backend "
            f"{r['backend']})", "",
            *table(["term", "budget s", "rank crash, in allocation s",
                    "preemption + requeue s", "who controls it"], rows), ""]
