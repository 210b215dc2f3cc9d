"""Ranks inside a real container on the Slurm testbed, the scenario of
``test_container_local.py``: the agents stay on the host (they call scontrol, sacct and scancel)
and start every rank through Charliecloud's ``ch-run``; a 2-node run of the tiny example is
preempted, requeued by its agent and resumed, a rank crashes inside the container and is
restarted in the allocation, and the run ends bitwise identical to the same run without a
container.

The image (:mod:`tests.integration.container_helpers`) lies in the shared directory, so every
node sees it; its mount points include the testbed's node-local tier
(``testbed.node_local_path``, which each node's mount namespace binds to its own directory) and
the shared directory, both mounted by the site, so a path that names the job id needs no mount
point of its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from hpcrun.control.record import read_record
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.launch.site import SITE_CONFIGS_ENV
from hpcrun.observe.events import read_events
from hpcrun.testbed import Testbed
from tests.integration.container_helpers import (
    CH_RUN,
    HOST_MOUNTS,
    NO_CH_RUN,
    build_image,
    ch_env,
    container_site,
    interpreter_dirs,
)
from tests.integration.helpers import REPO_ROOT, RunFactory, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(CH_RUN is None, reason=NO_CH_RUN)]

STEPS = 24
FAULTS = "preempt@step=6;crash@step=14,rank=1,restart=1"
def _site(testbed: Testbed, job_dir: Path) -> tuple[Path, Path]:
    image = job_dir / "image"
    shared, node_local = testbed.shared_dir, Path(testbed.node_local_path)  # each node's own
    build_image(image, [REPO_ROOT, *interpreter_dirs(), node_local, shared])
    base = yaml.safe_load((REPO_ROOT / "site_configs" / "testbed.yaml").read_text())
    body = container_site(base, name="testbed-ch", image=image,
                          node_local=base["node_local_path"])
    body["container"]["mounts"] = [*HOST_MOUNTS, f"{node_local}:{node_local}",
                                   f"{shared}:{shared}"]
    body["env"] = {**base.get("env", {}), **ch_env()}
    sites = job_dir / "sites"
    sites.mkdir(parents=True, exist_ok=True)
    (sites / "testbed-ch.yaml").write_text(yaml.safe_dump(body))
    return sites, image


def test_ranks_in_charliecloud_resume_and_restart_bitwise_on_slurm(
        testbed: Testbed, job_dir: Path) -> None:
    sites, image = _site(testbed, job_dir)
    spec = slurm_spec(testbed, steps=STEPS, every_steps=5, tasks_per_node=1,
                      data={"contract": "bitwise"})
    for name in ("host", "inside"):
        (job_dir / name).mkdir()
    host = RunFactory(testbed, job_dir / "host")
    inside = RunFactory(testbed, job_dir / "inside", extra_env={SITE_CONFIGS_ENV: str(sites)})
    try:
        with ThreadPoolExecutor(2) as pool:
            ref_f = pool.submit(host.submit, spec)
            cut_f = pool.submit(inside.submit, {**spec, "site": "testbed-ch"}, inject=FAULTS)
            ref, cut = ref_f.result(), cut_f.result()
        for run in (ref, cut):
            rec = run.wait({"SUCCEEDED"}, timeout=300)
            assert rec.step == STEPS, rec.state_info
        rec = read_record(cut.run_dir)
        assert (rec.requeues, rec.restarts) == (1, 1), (rec.requeues, rec.restarts)
        faults = [f.fault for f in rec.faults]
        assert "process_crash" in faults and "user_error" not in faults, faults

        starts = [e for e in read_events(cut.run_dir) if e.kind == "rank_start"]
        assert len({e.generation for e in starts}) >= 3, starts
        root = image.stat()  # the image directory is every rank's /, whatever its mount path
        assert {e.data.get("image_root_id") for e in starts} == {
            f"{root.st_dev}:{root.st_ino}"}, starts
        assert all("image_root_id" not in e.data for e in read_events(ref.run_dir)
                   if e.kind == "rank_start")

        a = load_state(ref.run_dir, find_committed(ref.run_dir))
        b = load_state(cut.run_dir, find_committed(cut.run_dir))
        assert a.step == b.step == STEPS and diff_states(a, b) == []
    finally:
        host.cleanup()
        inside.cleanup()
