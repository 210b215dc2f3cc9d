"""`make demo`: train the tiny example end to end, preempt it once, watch it come back.

    python -m examples.tiny_lm.demo [--backend local|slurm]

Prepares the dataset, submits `run.yaml`, delivers one preemption mid-run (scheduled on the
local backend; `hpcrun signal` on Slurm), and waits until the run ends. Then it prints the run's
timeline from its log (states, generations, commits) and `hpcrun status`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from examples.tiny_lm.prepare import prepare
from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.testing.runs import run_dir_of, wait_for_state
from hpcrun.vocab import TERMINAL

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PREEMPT_AT = 120


def hpcrun(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "hpcrun.cli.main", *args], env=env, cwd=REPO,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"demo: `hpcrun {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def spec_for(backend: str, manifest: Path, workdir: Path) -> Path:
    spec = yaml.safe_load((HERE / "run.yaml").read_text())
    spec["data"]["manifest"] = str(manifest)
    spec["site"] = "testbed" if backend == "slurm" else "local"
    path = workdir / f"run-{backend}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def timeline(run_dir: Path) -> list[str]:
    """The run's story from its log: fences, states, commits (void entries left out)."""
    _, valid = fold_fences(RunLog(run_dir).read())
    t0 = valid[0].ts if valid else 0.0
    lines = []
    for e in valid:
        p = e.payload
        if e.kind == EntryKind.FENCE:
            what = f"generation {e.generation} claimed ({e.holder.split('.')[0]}, "
            what += f"{e.holder.split('.')[1]})"
        elif e.kind == EntryKind.STATE:
            what = f"{p.get('state')}: {p.get('reason', '')}"
        elif e.kind == EntryKind.COMMIT:
            what = f"checkpoint step {p.get('step')} committed on {p.get('tier')}"
        else:
            continue
        lines.append(f"  +{e.ts - t0:6.1f}s  g{e.generation}  {what}")
    return lines


def signal_when_at(run_dir: Path, step: int, env: dict[str, str]) -> None:
    from hpcrun.control.record import read_record

    while read_record(run_dir).step < step and str(read_record(run_dir).state) not in TERMINAL:
        time.sleep(0.5)
    hpcrun("signal", run_dir.name, env=env)


def next_steps(run_dir: Path, runs: Path) -> str:
    """The commands to look at the run afterwards, with the runs root they need."""
    env = "" if os.environ.get("HPCRUN_RUNS") else f"HPCRUN_RUNS={runs} "
    py = ".venv/bin/" if (REPO / ".venv" / "bin" / "hpcrun").exists() else ""
    return (f"demo: look at the run again with\n"
            f"  {env}{py}hpcrun status {run_dir.name}\n"
            f"  {env}{py}hpcrun report {run_dir.name} -o {run_dir.name}.html")


def main() -> None:
    p = argparse.ArgumentParser(prog="make demo")
    p.add_argument("--backend", choices=("local", "slurm"), default="local")
    a = p.parse_args()
    runs = Path(os.environ.get("HPCRUN_RUNS", Path.home() / "hpcrun-runs"))
    env = {**os.environ, "HPCRUN_RUNS": str(runs)}
    if a.backend == "slurm":
        hpcrun("testbed", "up", env=env)
        env["SLURM_CONF"] = "/var/lib/hpcrun-testbed/etc/slurm.conf"
    print("demo: preparing the dataset (generated, no downloads)")
    manifest = prepare(HERE / "data")
    runs.mkdir(parents=True, exist_ok=True)
    spec = spec_for(a.backend, manifest, runs)
    started = time.monotonic()
    args = ["submit", str(spec), "--backend", a.backend]
    if a.backend == "local":
        args += ["--inject", f"preempt@step={PREEMPT_AT}"]
    run_dir = run_dir_of(runs, hpcrun(*args, env=env))
    print(f"demo: submitted {run_dir.name}; a preemption arrives near step {PREEMPT_AT}")
    if a.backend == "slurm":
        signal_when_at(run_dir, PREEMPT_AT, env)
    record = wait_for_state(run_dir, TERMINAL, timeout=900)
    print(f"demo: {record.state} after {time.monotonic() - started:.0f} s; the run's log:")
    print("\n".join(timeline(run_dir)))
    print(hpcrun("status", run_dir.name, "--no-reconcile", env=env))
    print(next_steps(run_dir, runs))
    sys.exit(0 if str(record.state) == "SUCCEEDED" else 1)


if __name__ == "__main__":
    main()
