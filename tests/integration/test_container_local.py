"""Ranks inside a real container on the local backend: the agents stay on the host and start
every rank (cold or warm) through Charliecloud's ``ch-run``. A 2-node run of the tiny example is
preempted, requeued and resumed, then a rank crashes inside the container and is restarted in the
allocation, and the run ends bitwise identical to the same run without a container.

The image is a skeleton directory whose userland is the host's, bound in
(:mod:`tests.integration.container_helpers` says why); the proof that a rank ran inside is its
own: each ``rank_start`` event records the directory mounted at the rank's ``/``, which is the
image's only inside ``ch-run``'s mount namespace.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from hpcrun.control.record import read_record
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.observe.events import read_events
from hpcrun.runtime.rank.startup import start_parts
from tests.integration.container_helpers import (
    CH_RUN,
    NO_CH_RUN,
    build_image,
    ch_env,
    container_site,
    interpreter_dirs,
)
from tests.integration.local_helpers import REPO_ROOT, local_spec, submit, valid_entries

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CH_RUN is None, reason=NO_CH_RUN)]

STEPS = 24
FAULTS = "preempt@step=6;crash@step=14,rank=1,restart=1"


def _site(tmp_path: Path) -> Path:
    image = build_image(tmp_path / "image", [REPO_ROOT, *interpreter_dirs()])
    base = yaml.safe_load((REPO_ROOT / "site_configs" / "local.yaml").read_text())
    sites = tmp_path / "sites"
    sites.mkdir()
    body = container_site(base, name="local-ch", image=image, node_local=tmp_path / "nl")
    (sites / "local-ch.yaml").write_text(yaml.safe_dump(body))
    return sites


def _first_start_s(run: Path) -> float | None:
    """The ``process`` part of the first incarnation's start, median over its ranks: from the
    hand-off to the rank's code running, the container's own start included (printed, not
    asserted: speed targets live in benchmarks/)."""
    events = list(read_events(run))
    first = min((e.generation for e in events if e.kind == "startup"), default=None)
    return None if first is None else start_parts(events, first).get("process")


def test_ranks_in_charliecloud_resume_and_restart_bitwise_like_the_host(tmp_path: Path) -> None:
    sites = _site(tmp_path)
    spec = local_spec(steps=STEPS, every_steps=5, data={"contract": "bitwise"})
    inside = {**spec, "site": "local-ch"}
    # HPCRUN_WARM=1: the restart takes a warm process started through ch-run (on a machine
    # with fewer than 8 cores the agents would keep no pool for 2 x 2 ranks)
    env = {"HPCRUN_SITE_CONFIGS": str(sites), "HPCRUN_WARM": "1", **ch_env()}
    with ThreadPoolExecutor(2) as pool:
        ref_f = pool.submit(submit, tmp_path / "host", spec)
        cut_f = pool.submit(submit, tmp_path / "inside", inside, inject=FAULTS, env=env)
        ref, cut = ref_f.result(), cut_f.result()

    for run in (ref, cut):
        rec = read_record(run)
        assert (str(rec.state), rec.step) == ("SUCCEEDED", STEPS), rec.state_info
    rec = read_record(cut)
    # the preemption requeued the run; the crash inside the container restarted it in place
    assert (rec.requeues, rec.restarts) == (1, 1), (rec.requeues, rec.restarts)
    faults = [e.payload.get("fault") for e in valid_entries(cut, "fault")]
    assert "process_crash" in faults and "user_error" not in faults, faults

    # Every rank of every incarnation ran with the image at its /; the host's ranks did not.
    starts = [e for e in read_events(cut) if e.kind == "rank_start"]
    assert len({e.generation for e in starts}) >= 3, starts
    image = (tmp_path / "image").stat()
    assert {(e.data.get("image_root"), e.data.get("image_root_id")) for e in starts} == {
        (str(tmp_path / "image"), f"{image.st_dev}:{image.st_ino}")}, starts
    assert all("image_root_id" not in e.data for e in read_events(ref) if e.kind == "rank_start")

    a, b = load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut))
    assert a.step == b.step == STEPS and diff_states(a, b) == []
    print(f"first start, process part (median over ranks): host {_first_start_s(ref)} s, "
          f"in ch-run {_first_start_s(cut)} s")
