"""docs/quickstart.md section 6 on the Slurm testbed: the quickstart project, outside git, on
site ``testbed``, preempted by ``hpcrun signal`` and resumed from its stop commit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcrun.testbed import Testbed
from hpcrun.testing.runs import run_dir_of, wait_for_state
from tests.integration.local_helpers import valid_entries, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def _sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr[-3000:]}"
    return done.stdout


def test_the_quickstart_project_on_slurm_is_preempted_and_resumed(
        testbed: Testbed, job_dir: Path) -> None:
    project, runs = job_dir / "myproject", job_dir / "runs"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "data"))
    env = {**os.environ, **testbed.env, "HPCRUN_RUNS": str(runs),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    _sh([sys.executable, "make_data.py", "data/docs"], project, env)
    _sh(["hpcrun", "data", "build", "docs=data/docs", "-o", "data/manifest.json",
         "--no-progress"], project, env)
    spec = yaml.safe_load((project / "run.yaml").read_text())
    spec["site"] = "testbed"
    spec["config"]["steps"] = 2000  # long enough for the signal to land mid-run
    (project / "run.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = _sh(["hpcrun", "submit", "run.yaml"], project, env)
    assert "slurm job" in out
    run_dir = run_dir_of(runs, out)
    wait_until(run_dir, lambda r: r.step >= 60, timeout=300, what="a first commit")
    _sh(["hpcrun", "signal", run_dir.name[:-2]], project, env)  # a prefix of the id
    record = wait_for_state(run_dir, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=900)
    assert (str(record.state), record.step, record.requeues) == ("SUCCEEDED", 2000, 1)
    running = [e.payload for e in valid_entries(run_dir, "state")
               if e.payload["state"] == "RUNNING"]
    assert running[1]["restored_step"] >= 60
    assert (run_dir / "code" / "train_hpcrun.py").read_bytes() == \
        (project / "train_hpcrun.py").read_bytes()
