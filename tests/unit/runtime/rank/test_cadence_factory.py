"""An incarnation's cadence starts from the site's MTBF prior and the run's earlier
interruptions, not from a fixed 6 h and zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.checkpoint.cadence import posterior_mtbf
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import CheckpointPolicy, RunSpec
from hpcrun.launch.site import SiteConfig, save_site_snapshot
from hpcrun.runtime.rank.worker import cadence_factory
from hpcrun.testing.fakes import FakeClock


def test_the_timer_of_a_requeued_run_knows_the_site_and_the_first_incarnation(
        tmp_path: Path) -> None:
    spec = RunSpec(name="demo", entrypoint="examples.demo:main",
                   checkpoint=CheckpointPolicy(cadence="young"))  # type: ignore[arg-type]
    clock = FakeClock(start=1000.0)
    run_dir = create_run(tmp_path, spec, run_id="demo-1", clock=clock)
    save_site_snapshot(run_dir, SiteConfig(name="preemptible", node_local_path="/tmp/x",
                                           shared_path=str(tmp_path), mtbf_prior_h=2.0))
    log = RunLog(run_dir, clock=clock)
    first = log.claim("h1")
    pub = {"generation": first.generation, "holder": "h1"}
    log.publish(EntryKind.STATE, payload={"state": "STARTING"}, **pub)
    clock.advance(600)
    log.append(EntryKind.FAULT, payload={"fault": "preemption", "signature": "preemption"},
               **pub)
    clock.advance(60)
    log.claim("h2")  # the second incarnation's fence; its timer is built now

    timer = cadence_factory(run_dir, spec.checkpoint, RunLog(run_dir))(0)
    assert timer.policy.prior_mtbf_s == 7200.0  # the site's mtbf_prior_h, not 6 h
    assert timer.mtbf_s == pytest.approx(posterior_mtbf(7200.0, exposure_s=600.0,
                                                        interruptions=1))
