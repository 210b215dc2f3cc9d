"""Site job setup on the real Slurm testbed: ``setup:`` lines run in the job before the agents,
on both ways in (plain ``sbatch`` of the rendered script, and submitit), and ``sbatch_extra``
reaches Slurm with the spec overriding the site."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hpcrun.launch.site import SITE_CONFIGS_ENV
from hpcrun.testbed import JobClient, Testbed
from tests.integration.helpers import REPO_ROOT, RunFactory, TestbedRun, scontrol_job, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def setup_runs(testbed: Testbed, job_dir: Path) -> Iterator[RunFactory]:
    """Runs on site ``testbed-setup``: the testbed's site plus a setup line and sbatch_extra."""
    body = yaml.safe_load((REPO_ROOT / "site_configs" / "testbed.yaml").read_text())
    body.update(name="testbed-setup",
                setup=["export HPCRUN_SETUP_PROBE=set-by-setup-$SLURM_JOB_ID"],
                sbatch_extra={"nice": 10})
    sites = job_dir / "sites"
    sites.mkdir(parents=True, exist_ok=True)
    (sites / "testbed-setup.yaml").write_text(yaml.safe_dump(body))
    factory = RunFactory(testbed, job_dir, extra_env={SITE_CONFIGS_ENV: str(sites)})
    yield factory
    factory.cleanup()


def _spec(testbed: Testbed, probe: Path, **resources: object) -> dict[str, object]:
    return slurm_spec(testbed, site="testbed-setup", steps=10, every_steps=5,
                      entrypoint="tests.integration.site_setup_entry:main",
                      config={"probe_dir": str(probe)},
                      resources={"sbatch_extra": {k: str(v) for k, v in resources.items()}})


def _every_rank_saw_the_setup(run: TestbedRun, probe: Path) -> None:
    rec = run.wait({"SUCCEEDED"}, timeout=150)
    assert rec.step == 10, rec.state_info
    seen = {p.name: p.read_text() for p in sorted(probe.glob("rank-*.txt"))}
    assert seen == {f"rank-{r}.txt": f"set-by-setup-{run.job_id}" for r in range(4)}


def test_plain_sbatch_runs_the_site_setup_and_passes_sbatch_extra(
        testbed: Testbed, setup_runs: RunFactory, slurm: JobClient, job_dir: Path) -> None:
    probe = job_dir / "probe-sbatch"
    run = setup_runs.sbatch(_spec(testbed, probe, nice=20), slurm)
    assert scontrol_job(slurm, run.job_id).get("Nice") == "20"  # the spec overrides the site
    _every_rank_saw_the_setup(run, probe)


def test_submitit_runs_the_site_setup_and_passes_sbatch_extra(
        testbed: Testbed, setup_runs: RunFactory, slurm: JobClient, job_dir: Path) -> None:
    probe = job_dir / "probe-submitit"
    run = setup_runs.submit(_spec(testbed, probe))
    assert scontrol_job(slurm, run.job_id).get("Nice") == "10"  # the site's default
    _every_rank_saw_the_setup(run, probe)
