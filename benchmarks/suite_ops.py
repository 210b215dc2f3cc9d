"""Operations comparisons for ``python -m benchmarks``: ``hpcrun status`` and sbatch.

- status: a run directory with 10,000 step events over 8 ranks and a busy log; the status view
  read in-process (first read, then repeated reads), the event parse alone, and the whole
  ``hpcrun status --no-reconcile`` command (a fresh interpreter each time);
- sbatch: ``render_sbatch`` of the example spec on the testbed site (pure); when the Slurm
  testbed is up, ``sbatch --parsable --hold`` of that script (then ``scancel``): the submit
  overhead a user pays per job. Without the testbed only the render is reported.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Samples, table, timed, verdict

REPO = Path(__file__).resolve().parents[1]
STATUS_TARGET_S = 0.150


def status(repeats: int, events: int = 10_000) -> dict[str, Any]:
    from benchmarks.status_latency import build_run
    from hpcrun.control.record import read_record
    from hpcrun.observe.collect import collect_status
    from hpcrun.observe.events import sorted_events

    s = Samples()
    with tempfile.TemporaryDirectory(prefix="hpcrun-bench-status-") as tmp:
        run_dir = build_run(Path(tmp), events=events, ranks=8, log_entries=200)
        read_record(run_dir)  # the first status of a run writes the record snapshot
        s.add("first_view_s", timed(lambda: collect_status(run_dir)))
        for _ in range(repeats):
            s.add("view_s", timed(lambda: collect_status(run_dir)))
            s.add("events_all_s", timed(lambda: sorted_events(run_dir)))
        cmd = [sys.executable, "-m", "hpcrun.cli.main", "status", str(run_dir), "--no-reconcile"]
        for _ in range(max(3, repeats // 2)):
            t = timed(lambda: subprocess.run(cmd, cwd=REPO, capture_output=True, check=True,
                                             timeout=120))
            s.add("cli_s", t)
        s.add("python_startup_s", timed(lambda: subprocess.run(
            [sys.executable, "-c", "pass"], check=True)))
    return {"events": events, "repeats": repeats, "medians": s.medians(), "samples": s.values}


def _testbed_env() -> dict[str, str] | None:
    conf = Path(os.environ.get("HPCRUN_TESTBED_DIR", "/var/lib/hpcrun-testbed")) / "etc" / \
        "slurm.conf"
    if not conf.exists():
        return None
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        subprocess.run(["sinfo", "-h"], env=env, capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return env


def sbatch(repeats: int) -> dict[str, Any]:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.sbatch import render_sbatch
    from hpcrun.launch.site import load_site
    from hpcrun.testing.runs import tiny_spec

    spec = RunSpec.from_dict(tiny_spec(manifest=REPO / "examples/tiny_lm/data/manifest.json",
                                       site="testbed"))
    site = load_site("testbed")
    run_dir = Path(tempfile.gettempdir()) / "hpcrun-bench-sbatch"
    script = render_sbatch(spec, site, run_dir=run_dir, op_id="bench")
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        render_sbatch(spec, site, run_dir=run_dir, op_id="bench")
    out: dict[str, Any] = {"render_s": (time.perf_counter() - t0) / n, "submit_s": None,
                           "submit": "testbed not up: render only"}
    env = _testbed_env()
    if env is not None:
        out.update(_submit_held(script, env, repeats))
    return out


def _submit_held(script: str, env: dict[str, str], repeats: int) -> dict[str, Any]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        job = subprocess.run(["sbatch", "--parsable", "--hold"], input=script, text=True,
                             env=env, capture_output=True, check=True, timeout=60)
        times.append(time.perf_counter() - t0)
        subprocess.run(["scancel", job.stdout.strip().split(";")[0]], env=env,
                       capture_output=True, check=False, timeout=60)
    return {"submit_s": statistics.median(times), "submit_samples": times,
            "submit": "sbatch --parsable --hold on the Slurm testbed, then scancel"}


def run(repeats: int) -> dict[str, Any]:
    return {"status": status(repeats), "sbatch": sbatch(max(3, repeats))}


def render(r: dict[str, Any]) -> list[str]:
    if "status" not in r:
        return ["### Operations", f"failed: {r.get('error')}"]
    st, sb = r["status"]["medians"], r["sbatch"]
    view = st.get("view_s")
    return ["### Operations", "", *table(["measure", "median", "note"], [
        [f"status view, {r['status']['events']:,} events: first read (s)",
         st.get("first_view_s"), "record snapshot written by an earlier status"],
        ["status view, repeated (s)", view, "parse every event, then gang steps + ETTR"],
        ["all 10,000 events parsed and sorted (s)", st.get("events_all_s"),
         "the parse share of the view"],
        ["`hpcrun status --no-reconcile` command (s)", st.get("cli_s"),
         f"includes a Python start of {st.get('python_startup_s', 0):.3f} s"],
        ["sbatch render (s)", sb["render_s"], "pure: spec + site → script"],
        ["sbatch submit (s)", sb.get("submit_s"), sb["submit"]],
    ]), "", f"- status view < 150 ms with 10,000 events: "
            f"{verdict(view, STATUS_TARGET_S, at_least=False)}", ""]
