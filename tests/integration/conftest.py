"""Integration tests on the real Slurm testbed (``hpcrun testbed``).

The testbed is brought up once per pytest session, the first time a test asks for it, and
brought down at the end (unless it was already up when the session started, or
``HPCRUN_TESTBED_KEEP=1`` is set). It needs root: without root the tests that use it are skipped;
as root a failed bring-up FAILS them. ``HPCRUN_TESTBED_DIR`` picks the state directory.

Lanes: under pytest-xdist, worker ``gwK`` uses testbed lane K (``hpcrun testbed up --lane K``:
a cluster of its own with its own state dir, ports and job ids), so the testbed tests run in as
many clusters side by side as there are workers (``tests/suite.sh`` brings the lanes up first,
and down at the end; the lanes share munged, which the last lane down stops).
``HPCRUN_TESTBED_LANE`` overrides.

Cluster: 4 nodes ``node1..node4`` (4 CPUs each, all on 127.0.0.1), partitions ``batch``
(default, preemptible, PriorityTier=1, GraceTime=15 s) and ``high`` (PriorityTier=2, never
preempted), accounting on (``sacct`` works), ``cred_expire=5`` so a requeued job runs again
~7 s later. Jobs run as root with the submitting environment (``--export=ALL``).

Fixtures:
    testbed (session): the :class:`hpcrun.testbed.Testbed`. ``testbed.env`` is what to add to a
        client's environment (SLURM_CONF); ``testbed.nodes``; ``testbed.shared_dir`` (same path
        on host and nodes: the "parallel filesystem"); ``testbed.node_local_path`` (the path a
        job sees for its node's own storage, ``/scratch/local``); ``testbed.node_local_dir(node)``
        (its host path); ``testbed.crash(node)`` / ``testbed.boot(node)`` (boot it again in
        your test's cleanup so later tests have all nodes).
    slurm (function): a :class:`hpcrun.testbed.JobClient` bound to the testbed:
        ``slurm.submit(script_text, *sbatch_args) -> job_id``,
        ``slurm.wait_for_state(job_id, {"COMPLETED"}, timeout=60) -> state`` (raises at once on
        an unwanted terminal state), ``slurm.state(job_id)``, ``slurm.history(job_id)`` (sacct
        records, one per run of a requeued job), ``slurm.wait_for_accounting(job_id, states,
        timeout=...)``, ``slurm.run("scontrol", ...)``. Jobs it submitted that are still queued
        or running when the test ends are cancelled.
    wait_for_state (function): ``slurm.wait_for_state``.
    job_dir (function): a fresh directory under the shared dir, for scripts, markers, outputs.
    free_port (function): a callable returning a TCP port free on 127.0.0.1 right now (all
        nodes share 127.0.0.1, so every multi-node job needs its own port).

Every test using these is marked ``@pytest.mark.slurm`` (and ``@pytest.mark.slow`` when it waits
for grace times or node failures; ``make test-quick`` runs ``-m "not slow"``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpcrun.errors import HpcrunError
from hpcrun.testbed import JobClient, Testbed
from hpcrun.testbed.config import LANE_ENV, default_lane, default_state_dir, lane_config
from hpcrun.testbed.jobs import TERMINAL_STATES
from hpcrun.testing.net import free_port as _free_port

if TYPE_CHECKING:
    from tests.integration.helpers import RunFactory

KEEP_ENV = "HPCRUN_TESTBED_KEEP"


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """The running testbed, for the whole session."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root (it starts munged, slurmctld and slurmd in "
                    "namespaces); run the slurm tests as root")
    tb = Testbed(lane_config(default_state_dir(os.environ), _lane()))
    try:
        result = tb.up()
    except HpcrunError as exc:
        pytest.fail(f"testbed bring-up failed: {exc}", pytrace=False)
    yield tb
    if result.cold and os.environ.get(KEEP_ENV) != "1":
        tb.down()


def _lane() -> int:
    """This session's testbed lane: ``$HPCRUN_TESTBED_LANE``, else the xdist worker's number."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if os.environ.get(LANE_ENV) or not worker.startswith("gw"):
        return default_lane(os.environ)
    return int(worker.removeprefix("gw"))


class _TrackingJobClient(JobClient):
    """A JobClient that remembers what it submitted, so teardown can cancel leftovers."""

    def __init__(self, env: dict[str, str], output_dir: Path) -> None:
        super().__init__(env, output_dir=output_dir)
        self.submitted: list[int] = []

    def submit(self, script: str, *sbatch_args: str) -> int:
        job_id = super().submit(script, *sbatch_args)
        self.submitted.append(job_id)
        return job_id


@pytest.fixture
def slurm(testbed: Testbed) -> Iterator[JobClient]:
    out = testbed.shared_dir / "tests" / "job-output"  # never the cwd (the repository)
    out.mkdir(parents=True, exist_ok=True)
    client = _TrackingJobClient(testbed.env, out)
    yield client
    leftovers = [j for j in client.submitted if client.state(j) not in TERMINAL_STATES]
    if leftovers:
        client.run("scancel", *map(str, leftovers))


@pytest.fixture
def wait_for_state(slurm: JobClient) -> Callable[..., str]:
    return slurm.wait_for_state


@pytest.fixture
def job_dir(testbed: Testbed, request: pytest.FixtureRequest) -> Path:
    path = testbed.shared_dir / "tests" / f"{request.node.name[:60]}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def free_port() -> Callable[[], int]:
    return _free_port


@pytest.fixture
def runs(testbed: Testbed, job_dir: Path) -> Iterator[RunFactory]:
    """Submit hpcrun runs on the testbed; any run still live at the end is fenced and cancelled."""
    from tests.integration.helpers import RunFactory

    factory = RunFactory(testbed, job_dir)
    yield factory
    factory.cleanup()

