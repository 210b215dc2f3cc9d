"""A project outside git runs, and requeues, from the snapshot submit took of it (local backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcrun.control.record import read_record
from hpcrun.launch.codever import content_digest
from hpcrun.testing.runs import run_dir_of, wait_for_state

MAIN = '''import time

import torch


def main(ctx):
    model = torch.nn.Linear(2, 1)
    ctx.restore(model=model)
    for _ in ctx.steps(int(ctx.config["steps"])):
        time.sleep(0.05)
        ctx.step_done(loss=1.0)
'''

SPEC = {"name": "codever", "entrypoint": "main:main", "site": "local",
        "resources": {"nodes": 1, "tasks_per_node": 1, "time_limit_min": 5},
        "checkpoint": {"cadence": "every_steps", "every_steps": 10, "keep_last": 2},
        "retry": {"backoff_base_s": 1, "backoff_cap_s": 1}, "config": {"steps": 40}}


def test_a_requeue_runs_the_code_as_submitted_not_as_edited_since(tmp_path: Path) -> None:
    project, runs = tmp_path / "project", tmp_path / "runs"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "run.yaml").write_text(json.dumps(SPEC))
    env = {**os.environ, "HPCRUN_RUNS": str(runs),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["hpcrun", "submit", "run.yaml", "--backend", "local",
                           "--inject", "preempt@step=15"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    # The project changes under the run: a requeue that imported it from disk would fail.
    (project / "main.py").write_text("raise SystemExit('edited after submit')\n")
    run_dir = run_dir_of(runs, done.stdout)
    record = wait_for_state(run_dir, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=300)
    assert (str(record.state), record.step, record.requeues) == ("SUCCEEDED", 40, 1), \
        record.state_info
    snapshot = run_dir / "code"
    assert (snapshot / "main.py").read_text() == MAIN
    files = [(p.relative_to(snapshot).as_posix(), p.read_bytes())
             for p in sorted(snapshot.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    code = json.loads((run_dir / "spec.json").read_text())["spec"]["code"]
    assert code == {"commit": None, "dirty": False, "snapshot": "code",
                    "content": content_digest(files)}
    assert str(read_record(run_dir).state) == "SUCCEEDED"
