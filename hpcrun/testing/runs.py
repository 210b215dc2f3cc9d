"""Helpers to drive whole runs in tests: write a spec, submit it, wait for a state.

They use the real CLI in a subprocess (``python -m hpcrun.cli.main``) and read the real run
record, so a test sees exactly what a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hpcrun.errors import WaitTimeoutError


def tiny_spec(*, manifest: Path, site: str = "local", nodes: int = 2, tasks_per_node: int = 2,
              steps: int = 40, every_steps: int = 10, **overrides: Any) -> dict[str, Any]:
    """A test-sized spec of ``examples/tiny_lm`` (seconds per run, one thread per rank)."""
    spec: dict[str, Any] = {
        "name": "tiny-lm-test",
        "entrypoint": "examples.tiny_lm.train:main",
        "site": site,
        "resources": {"nodes": nodes, "tasks_per_node": tasks_per_node, "time_limit_min": 10},
        "checkpoint": {"cadence": "every_steps", "every_steps": every_steps, "keep_last": 2},
        "data": {"manifest": str(manifest), "seed": 1234, "global_batch": 8,
                 "contract": "exact-order"},
        "retry": {"backoff_base_s": 1, "backoff_cap_s": 2},
        "budgets": {"max_requeues": 5},
        "config": {"steps": steps, "seq_len": 16, "vocab": 256, "d_model": 32, "n_layers": 1,
                   "n_heads": 2, "lr": 0.003, "seed": 0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def write_spec(path: Path, spec: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(spec), sort_keys=False))
    return path


def hpcrun(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the hpcrun CLI in a subprocess; returns the completed process (never raises)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpcrun.cli.main", *args], env=full_env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def run_dir_of(runs_root: Path, submit_stdout: str) -> Path:
    """The run directory named by ``hpcrun submit``'s first output word."""
    run_id = submit_stdout.strip().split()[0]
    path = runs_root / run_id
    return path.resolve() if path.is_symlink() else path


def wait_for_state(run_dir: Path, states: Iterable[str], *, timeout: float,
                   poll_s: float = 0.5) -> Any:
    """Poll the run record until its state is one of ``states``; return the record."""
    from hpcrun.control.record import read_record

    wanted = set(states)
    deadline = time.monotonic() + timeout
    record = read_record(run_dir)
    while time.monotonic() < deadline:
        record = read_record(run_dir)
        if str(record.state) in wanted:
            return record
        time.sleep(poll_s)
    raise WaitTimeoutError(f"run {run_dir.name} is {record.state} (step {record.step}) after "
                           f"{timeout:.0f} s; wanted one of {sorted(wanted)}; read its "
                           "logs/ and `hpcrun status` for why it is stuck")
