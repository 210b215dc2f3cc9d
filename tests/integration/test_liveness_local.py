"""Liveness over the network on the local backend: a run with a hot spare whose whole shared
tier stalls for 10 s (``fsstall``, the ``shared-fs-stall`` drill's fault) loses no node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrun.control.record import read_record
from hpcrun.runtime.node.netbeat import endpoint_path
from tests.integration.local_helpers import local_spec, outcome, submit, valid_entries

STEPS = 30


@pytest.mark.slow
def test_a_stalled_shared_tier_loses_no_node_of_a_run_with_a_hot_spare(tmp_path: Path) -> None:
    spec = local_spec(steps=STEPS, every_steps=10, resources={"spare_nodes": 1},
                      config={"ledger": True})
    run_dir = submit(tmp_path / "runs", spec, inject="fsstall@step=15,seconds=10")
    rec = read_record(run_dir)
    assert rec.state == "SUCCEEDED", outcome(run_dir)
    assert rec.step == STEPS and rec.restarts == 0 and rec.requeues == 0
    assert rec.quarantined == (), "no healthy node is quarantined"
    job = next(e for e in valid_entries(run_dir, "job") if "nodes" in e.payload)
    assert len(job.payload["nodes"]) == 3 and len(rec.membership) == 2, "a gang and a spare"
    for node in job.payload["nodes"]:  # every agent published its beat endpoint, once
        body = json.loads(endpoint_path(run_dir, node).read_text())
        assert body["node"] == node and body["host"] == "127.0.0.1"
    faults = [e.payload for e in valid_entries(run_dir, "fault")]
    assert [f["signature"] for f in faults] == ["storage:stall"], faults
    assert faults[0]["background"] is True and "took" in faults[0]["detail"]
    injected = [e.payload for e in valid_entries(run_dir, "note")
                if e.payload.get("event") == "fault_injected"]
    assert injected == [{"event": "fault_injected", "fault": "shared-fs-stall",
                         "node": rec.membership[0], "step": 15}]
    after = [e.payload["step"] for e in valid_entries(run_dir, "commit")
             if e.payload["step"] > 15]
    assert after and max(after) == STEPS, "training and its commits went on after the stall"
