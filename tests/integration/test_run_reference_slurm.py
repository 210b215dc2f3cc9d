"""One name for a run on the Slurm testbed: a prefix of the run id finds the run under the
site's shared_path, and `hpcrun signal` of a Slurm run goes through scancel to its job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcrun.drill.states import committed
from hpcrun.launch.site import site_configs_dir
from hpcrun.testbed import Testbed
from hpcrun.testing.runs import hpcrun
from tests.integration.helpers import REPO_ROOT, RunFactory, paced, slurm_spec

pytestmark = pytest.mark.slurm


def test_a_slurm_run_is_found_by_prefix_and_signalled_through_its_job(
        testbed: Testbed, runs: RunFactory, job_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCRUN_RUNS", raising=False)  # only the factory's env sets it
    # paced, so the run is still training when the signal arrives
    run = runs.submit(slurm_spec(testbed, steps=200, every_steps=10, name="runref-slurm"),
                      inject=paced(0.1, 4))
    run.wait_for("a first commit", lambda: run.record().step >= 10 and committed(run.run_dir),
                 timeout=120)
    ref = run.name[:-2]
    # With $HPCRUN_RUNS unset, the site $HPCRUN_SITE names holds the runs in its shared_path.
    site = yaml.safe_load((site_configs_dir() / "testbed.yaml").read_text())
    site_file = job_dir / "testbed-here.yaml"
    site_file.write_text(yaml.safe_dump({**site, "shared_path": str(run.run_dir.parent)}))
    by_site = {k: v for k, v in run.env.items() if k != "HPCRUN_RUNS"}
    by_site["HPCRUN_SITE"] = str(site_file)
    status = hpcrun("status", ref, "--json", env=by_site, cwd=REPO_ROOT)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "RUNNING"
    assert committed(run.run_dir)[0].ckpt_id[:16] in run.cli("ckpt", "ls", ref).stdout

    sent = run.cli("signal", ref)
    assert sent.returncode == 0, sent.stderr
    assert f"to job {run.job_id} steps" in sent.stdout
    record = run.wait(["SUCCEEDED"], timeout=300)
    assert record.step == 200 and record.requeues == 1
    assert [s for s, _ in run.states()].count("PREEMPTED") == 1
