"""Recovery time of real runs, split into phases, against the seed's restart budget.

Tiny-example runs (2 nodes × 2 ranks), on the Slurm testbed when it is up (unless
``HPCRUN_BENCH_BACKEND=local``), else on the local backend: a rank crash (repaired inside the
allocation) with warm rank processes and with ``HPCRUN_WARM=0`` (cold), alternated, ``repeats``
times each, and one preemption (commit, requeue, restore). :func:`hpcrun.drill.rto.rto_splits`
splits each recovery from the run log and the ranks' events: detect → requeue/wait → start →
restore → first step, and the start phase into its parts (:mod:`hpcrun.runtime.rank.startup`);
the tables show medians.

The seed's budget for a restart: detect 15 s, node swap 10 s, pod init 5 s, sharded load of
30 GB at 2 GB/s 15 s, process-group init 10 s: about 55 s.
"""

from __future__ import annotations

import os
import shutil
import statistics
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
        if os.environ.get("HPCRUN_BENCH_BACKEND") == "local":
            raise OSError("the local backend was asked for")
        subprocess.run(["sinfo", "-h"], env=env, capture_output=True, check=True, timeout=10)
        root = TESTBED / "shared" / "bench" / uuid.uuid4().hex[:8]
        site = "testbed"
    except (OSError, subprocess.SubprocessError):
        root = Path("/var/tmp") / f"hpcrun-bench-restart-{uuid.uuid4().hex[:8]}"
        env, site = dict(os.environ), "local"
    root.mkdir(parents=True)
    return {**env, "HPCRUN_RUNS": str(root / "runs")}, root, site


def _one(root: Path, env: dict[str, str], site: str, inject: str, name: str, *,
         steps: int = 40, every_steps: int = 10) -> dict[str, Any]:
    """One run with ``inject``; its state and every recovery's phases and start parts."""
    from hpcrun.control.log import RunLog
    from hpcrun.drill.rto import rto_splits
    from hpcrun.observe.events import read_events
    from hpcrun.testing.runs import hpcrun, run_dir_of, tiny_spec, wait_for_state, write_spec

    spec = tiny_spec(manifest=root / "data" / "manifest.json", site=site, steps=steps,
                     every_steps=every_steps, name=f"bench-{name}")
    out = hpcrun("submit", str(write_spec(root / f"{name}.yaml", spec)), "--inject", inject,
                 env=env, cwd=REPO, timeout=180)
    if out.returncode != 0:
        raise RuntimeError(f"submit failed: {out.stderr[-500:]}")
    run_dir = run_dir_of(Path(env["HPCRUN_RUNS"]), out.stdout)
    record = wait_for_state(run_dir, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=420)
    splits = rto_splits(RunLog(run_dir).read(), list(read_events(run_dir)))
    return {"inject": inject, "state": str(record.state),
            "recoveries": [{"cause": s.cause, "phases": dict(s.phases), "total_s": s.total_s,
                            "start_parts": dict(s.start_parts), "steps_lost": s.steps_lost}
                           for s in splits]}


MODES = (("warm", {"HPCRUN_WARM": "1"}), ("cold", {"HPCRUN_WARM": "0"}))
"""Rank crash runs: warm rank processes (the default) and cold spawns."""
CRASH = "crash@step=900,rank=1"
"""Late enough (several seconds of steps) for the warm pool, refilled once the gang has
stepped, to have imported: a crash in a real run comes long after the start."""
CRASH_STEPS, CRASH_EVERY = 960, 100


def run(repeats: int = 3) -> dict[str, Any]:
    env, root, site = _env()
    try:
        subprocess.run([sys.executable, "-m", "examples.tiny_lm.prepare", str(root / "data")],
                       cwd=REPO, capture_output=True, check=True, timeout=300)
        crash: dict[str, list[dict[str, Any]]] = {mode: [] for mode, _ in MODES}
        for i in range(repeats):  # alternated, so both see the same load
            for mode, extra in MODES:
                crash[mode].append(_one(root, {**env, **extra}, site, CRASH, f"{mode}{i}",
                                        steps=CRASH_STEPS, every_steps=CRASH_EVERY))
        runs = {"crash": crash["warm"][0], "crash_cold": crash["cold"][0],
                "preempt": _one(root, env, site, "preempt@step=12", "preempt")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"backend": site, "runs": runs, "repeats": repeats,
            "crash_medians": {mode: medians(crash[mode]) for mode in crash}}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median seconds of each phase, start part and the total over the first recovery of each
    run (runs without one are left out)."""
    firsts = [r["recoveries"][0] for r in runs if r["recoveries"]]

    def med(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    phases = {p for f in firsts for p in f["phases"]}
    parts = {p for f in firsts for p in f.get("start_parts", {})}
    return {"n": len(firsts),
            "total_s": med([f["total_s"] for f in firsts]),
            "totals": [round(f["total_s"], 2) for f in firsts],
            "phases": {p: med([f["phases"][p] for f in firsts if p in f["phases"]])
                       for p in sorted(phases)},
            "start_parts": {p: med([f["start_parts"][p] for f in firsts
                                    if p in f.get("start_parts", {})]) for p in sorted(parts)}}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_crash(r: dict[str, Any]) -> list[str]:
    """Rank crash, warm vs cold: medians of each phase and of each part of the start phase."""
    from hpcrun.runtime.rank.startup import PARTS

    m = r.get("crash_medians")
    if not m:
        return []
    warm, cold = m["warm"], m["cold"]
    rows = [[p, _cell(warm["phases"].get(p)), _cell(cold["phases"].get(p))]
            for p in ("detect", "requeue_wait", "start", "restore", "first_step")]
    rows += [[f"start: {p}", _cell(warm["start_parts"].get(p)),
              _cell(cold["start_parts"].get(p))] for p in PARTS]
    rows.append(["total (crash → first validated step)", _cell(warm["total_s"]),
                 _cell(cold["total_s"])])
    return [f"### Rank crash repaired in the allocation: warm vs cold (medians of "
            f"{warm['n']} and {cold['n']} runs, backend {r['backend']})", "",
            *table(["phase", "warm s", "cold s"], rows), "",
            f"totals: warm {warm['totals']}, cold {cold['totals']}", ""]


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
                    "preemption + requeue s", "who controls it"], rows), "",
            *render_crash(r)]
