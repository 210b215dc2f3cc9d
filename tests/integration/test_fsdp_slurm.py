"""examples/fsdp_lm on the real Slurm testbed: an FSDP2 run over 2 nodes x 1 rank, preempted,
rank-crashed and node-crashed, ends bitwise identical to the same run uninterrupted, with the
SDC checks on (the replica check finds no replicas and notes it; it never faults)."""

from __future__ import annotations

import pytest

from hpcrun.control.log import EntryKind
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.testbed import Testbed
from tests.integration.helpers import RunFactory, slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 30
FAULTS = "preempt@step=6;crash@step=14,rank=1,restart=1;nodecrash@step=22,rank=1,restart=2"


def test_interrupted_fsdp_run_is_bitwise_identical_on_the_testbed(
        testbed: Testbed, runs: RunFactory) -> None:
    spec = slurm_spec(testbed, nodes=2, tasks_per_node=1, steps=STEPS, every_steps=5,
                      entrypoint="examples.fsdp_lm.train:main", data={"contract": "bitwise"},
                      sdc={"every_steps": 5}, config={"parallel": "fsdp"})
    ref = runs.submit(spec)
    run = runs.submit(spec, inject=FAULTS)
    assert run.wait({"SUCCEEDED"}, timeout=600).step == STEPS
    assert ref.wait({"SUCCEEDED"}, timeout=300).step == STEPS
    faults = [str(e.payload.get("fault")) for e in run.valid(EntryKind.FAULT)]
    assert "sdc" not in faults and "user_error" not in faults, faults
    assert any(e.payload.get("event") == "replica_check_off" for e in run.valid(EntryKind.NOTE))
    a = load_state(ref.run_dir, find_committed(ref.run_dir))
    b = load_state(run.run_dir, find_committed(run.run_dir))
    assert diff_states(a, b) == []
