"""Helpers for whole runs on the embedded local backend (no Slurm, no root).

Runs go through the real CLI (``python -m hpcrun.cli.main``) from the repository root, with
``HPCRUN_RUNS`` pointing at the test's own directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcrun.control.log import LogEntry, RunLog
from hpcrun.control.record import RunRecord, read_record
from hpcrun.testing.runs import hpcrun, run_dir_of, tiny_spec, write_spec
from hpcrun.vocab import TERMINAL

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout under test (``examples.tiny_lm.train`` is imported from here)."""

_DATA: list[Path] = []


def tiny_manifest() -> Path:
    """The tiny_lm dataset, generated once per test session into a temporary directory."""
    if not _DATA:
        data = Path(tempfile.mkdtemp(prefix="hpcrun-tiny-data-")) / "data"
        done = subprocess.run([sys.executable, "-m", "examples.tiny_lm.prepare", str(data)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, f"examples.tiny_lm.prepare failed: {done.stderr}"
        _DATA.append(data / "manifest.json")
    return _DATA[0]


def local_spec(**overrides: Any) -> dict[str, Any]:
    """A tiny local spec: 2 nodes x 1 rank (``tiny_spec`` keywords override)."""
    overrides.setdefault("tasks_per_node", 1)
    return tiny_spec(manifest=tiny_manifest(), site="local", **overrides)


def submit(root: Path, spec: Mapping[str, Any], *, inject: str | None = None,
           env: Mapping[str, str] | None = None, wait: bool = True,
           name: str = "run.yaml") -> Path:
    """``hpcrun submit --backend local`` (``--wait`` by default); return the run directory."""
    root.mkdir(parents=True, exist_ok=True)
    path = write_spec(root / name, spec)
    args = ["submit", str(path), "--backend", "local", *(["--wait"] if wait else []),
            *(["--inject", inject] if inject else [])]
    out = hpcrun(*args, env={"HPCRUN_RUNS": str(root), **(env or {})}, cwd=REPO_ROOT)
    assert out.stdout.strip(), f"submit printed nothing: {out.stderr[-2000:]}"
    return run_dir_of(root, out.stdout)


def cli(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return hpcrun(*args, env={"HPCRUN_RUNS": str(root)}, cwd=REPO_ROOT, timeout=timeout)


def wait_until(run_dir: Path, predicate: Any, *, timeout: float, what: str) -> RunRecord:
    """Poll the record until ``predicate(record)``; fail with the state when it never holds."""
    deadline = time.monotonic() + timeout
    record = read_record(run_dir)
    while time.monotonic() < deadline:
        record = read_record(run_dir)
        if predicate(record):
            return record
        if record.state in TERMINAL:
            break
        time.sleep(0.3)
    raise AssertionError(f"{what}: run is {record.state} at step {record.step}")


def valid_entries(run_dir: Path, kind: str | None = None) -> list[LogEntry]:
    """Log entries that count under generation fencing."""
    from hpcrun.control.fencing import fold_fences

    _, valid = fold_fences(RunLog(run_dir).read())
    return [e for e in valid if kind is None or e.kind == kind]


def outcome(run_dir: Path, tail: int = 15) -> str:
    """A run's end as a failing assertion should show it: ``hpcrun status`` and the last lines
    of every rank's and agent's log (a run that ended FAILED says why)."""
    status = cli(run_dir.parent, "status", run_dir.name)
    parts = [status.stdout.strip(), status.stderr.strip()]
    for log in sorted((run_dir / "logs").glob("*/*.out")):
        if log.name.startswith(("rank-", "agent")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {log.relative_to(run_dir)}\n" + "\n".join(lines))
    return "\n".join(p for p in parts if p)


def states(run_dir: Path) -> list[str]:
    return [str(e.payload.get("state")) for e in valid_entries(run_dir, "state")]


def run_processes(run_dir: Path) -> list[int]:
    """PIDs of live processes whose command line or environment names this run."""
    out = []
    needle = str(run_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            mine = any(needle in (proc / f).read_bytes() for f in ("cmdline", "environ"))
            if mine and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(proc.name))
        except OSError:
            continue
    return out
