"""The GPU path on the embedded local backend, on a machine without GPUs: a node that sees fewer
GPUs than the run needs ends the incarnation at once with a ``node_failure`` naming the node and
both counts (never a hang in the first collective)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from hpcrun.control.record import read_record
from tests.integration.local_helpers import local_spec, submit, valid_entries


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs to see")
def test_a_node_without_its_gpus_is_a_node_failure_not_a_hang(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    site = yaml.safe_load((Path(__file__).parents[2] / "site_configs" / "local.yaml").read_text())
    (sites / "local-gpu.yaml").write_text(yaml.safe_dump({**site, "name": "local-gpu",
                                                          "gpus_per_node": 2}))
    spec = local_spec(steps=5, nodes=1,
                      resources={"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 2,
                                 "time_limit_min": 10},
                      retry={"max_attempts": {"node_failure": 0}, "backoff_base_s": 1,
                             "backoff_cap_s": 1})
    spec["site"] = "local-gpu"
    run = submit(tmp_path, spec, env={"HPCRUN_SITE_CONFIGS": str(sites),
                                      "CUDA_VISIBLE_DEVICES": ""})
    record = read_record(run)
    assert str(record.state) == "FAILED", record.state_info
    faults = [e.payload for e in valid_entries(run, "fault")]
    assert [f["fault"] for f in faults] == ["node_failure"], faults
    assert faults[0]["detail"].startswith("node local0 sees 0 GPU(s) but the run needs 2 per "
                                          "node"), faults[0]
    assert not list((run / "logs").rglob("rank-*.out")), "no rank was started"


def test_ranks_start_with_the_specs_backend_and_timeouts(tmp_path: Path) -> None:
    """The spec's dist section reaches every rank through its agent; rank_start records it."""
    from hpcrun.observe.events import read_events

    spec = local_spec(steps=4, every_steps=2, nodes=2,
                      dist={"backend": "gloo", "step_timeout_s": 45})
    run = submit(tmp_path, spec)
    assert str(read_record(run).state) == "SUCCEEDED", read_record(run).state_info
    starts = [e for e in read_events(run) if e.kind == "rank_start"]
    assert sorted(e.rank for e in starts) == [0, 1]
    for e in starts:
        assert (e.data["backend"], e.data["device"], e.data["cpus"]) == ("gloo", "cpu", None)
        assert (e.data["step_timeout_s"], e.data["pg_init_timeout_s"],
                e.data["checkpoint_timeout_s"]) == (45, 300, 600)
