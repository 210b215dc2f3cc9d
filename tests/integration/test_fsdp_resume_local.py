"""examples/fsdp_lm on the local backend: an FSDP2 run (2 nodes x 1 rank) and an FSDP2 + TP run
(2 nodes x 2 ranks, TP inside each node), preempted, rank-crashed and node-crashed (node 1's
agent and ranks SIGKILLed at once), end with checkpoints bitwise identical to the same run
uninterrupted, with the SDC checks on by default (the replica check knows the mesh and never
fails them)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcrun.control.record import read_record
from hpcrun.drill.states import diff_states, find_committed, load_state
from tests.integration.local_helpers import cli, local_spec, submit, valid_entries

STEPS = 20
FAULTS = "preempt@step=5;nodecrash@step=11,rank={last},restart=1;crash@step=15,rank=1,restart=2"


def _spec(parallel: str, ranks: int) -> dict:
    return local_spec(entrypoint="examples.fsdp_lm.train:main", nodes=2,
                      tasks_per_node=ranks // 2, steps=STEPS, every_steps=4,
                      data={"contract": "bitwise"}, sdc={"every_steps": 4},
                      config={"parallel": parallel})


@pytest.mark.slow
@pytest.mark.parametrize(("parallel", "ranks"), [("fsdp", 2), ("tp", 4)])
def test_interrupted_sharded_run_matches_the_uninterrupted_one(tmp_path: Path, parallel: str,
                                                               ranks: int) -> None:
    spec = _spec(parallel, ranks)
    with ThreadPoolExecutor(2) as pool:
        ref_f = pool.submit(submit, tmp_path / "reference", spec)
        cut_f = pool.submit(submit, tmp_path / "interrupted", spec,
                            inject=FAULTS.format(last=ranks - 1))
        ref, cut = ref_f.result(), cut_f.result()
    for run in (ref, cut):
        rec = read_record(run)
        assert (str(rec.state), rec.step) == ("SUCCEEDED", STEPS), rec.state_info
        assert not [e for e in valid_entries(run, "fault")
                    if e.payload.get("fault") in ("sdc", "user_error")]
        # no two ranks hold the same shard: every incarnation that trained says so exactly
        # once, and the check is off
        noted = sorted(e.generation for e in valid_entries(run, "note")
                       if e.payload.get("event") == "replica_check_off")
        trained = sorted({e.generation for e in valid_entries(run, "state")
                          if e.payload.get("state") == "RUNNING"})
        assert noted and noted == trained, (noted, trained)
    cut_faults = [e.payload.get("fault") for e in valid_entries(cut, "fault")]
    assert "node_failure" in cut_faults, cut_faults
    assert read_record(cut).generation >= 4  # the preemption, the crash and the node loss
    a, b = load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut))
    assert a.step == b.step == STEPS and any("model/" in k for k in a.ranks[0].tensors)
    assert diff_states(a, b) == []
    out = cli(tmp_path, "ckpt", "diff", str(ref), str(cut))
    assert out.returncode == 0, out.stdout + out.stderr
