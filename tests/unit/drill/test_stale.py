"""The stale-worker drill's stale writer: a frozen node's pending drain after a newer fence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout, fold_checkpoints
from hpcrun.control.log import EntryKind, RunLog, new_holder
from hpcrun.drill.contracts import Evidence, after_newer_fence, check_contracts, not_held
from hpcrun.drill.matrix import DrillFault, row_for
from hpcrun.drill.stale import drain_as_stale
from hpcrun.errors import ArgumentError

NODE = "node0"


def _commit_on_tier0(run_dir: Path, nvme: Path, log: RunLog) -> tuple[str, object]:
    holder = new_holder()
    fence = log.claim(holder)
    ident = CheckpointIdentity(run_id="run1", spec_id="spec1", dataset_id="ds1",
                               generation=fence.generation, holder=holder)
    layout = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node=NODE)
    ck = Checkpointer(identity=ident, tiers=TierLayout(run_dir=run_dir, node_local_root=nvme),
                      layout=layout, log=log, fence_slot=fence.slot)
    try:
        model = torch.nn.Linear(8, 4)
        return ck.save(3, {"model": model}, blocking=True).ckpt_id, fence
    finally:
        ck.close()


def test_the_frozen_nodes_drain_after_a_newer_fence_is_void_and_never_counted(
        tmp_path: Path) -> None:
    run_dir, nvme = tmp_path / "run", tmp_path / "nvme"
    (run_dir / "log").mkdir(parents=True)
    log = RunLog(run_dir)
    ckpt_id, fence = _commit_on_tier0(run_dir, nvme, log)
    with pytest.raises(ArgumentError, match="would not be stale"):
        drain_as_stale(run_dir, nvme, node=NODE, fence=fence)  # type: ignore[arg-type]
    newer = log.claim(new_holder())  # the job runs on elsewhere
    write = drain_as_stale(run_dir, nvme, node=NODE, fence=fence)  # type: ignore[arg-type]
    [drained] = write.entries
    assert drained.kind == EntryKind.DRAINED and drained.slot > newer.slot
    assert drained.payload["ckpt_id"] == ckpt_id and "void" in write.refused
    assert after_newer_fence(log.read()) == [drained]
    assert NODE not in fold_checkpoints(log.read())[0].drained  # never counted
    assert (run_dir / "ckpt" / ckpt_id).is_dir()  # the bytes were copied all the same
    ev = Evidence(run_id="run1", state="SUCCEEDED", entries=tuple(log.read()))
    got = {r.name: r for r in check_contracts(ev, row_for(DrillFault.STALE_WORKER))}
    assert got["stale"].ok is True and "none counted" in got["stale"].detail


def test_no_stale_write_at_all_fails_the_stale_contract() -> None:
    from tests.unit.drill.test_contracts import _e, _preempted

    row = row_for(DrillFault.STALE_WORKER)
    ev = _preempted()  # two generations, nothing written after the newer fence
    got = {r.name: r for r in check_contracts(ev, row)}
    assert got["stale"].ok is False and got["stale"].detail.startswith("no evidence")
    assert any(line.startswith("stale:") for line in not_held(check_contracts(ev, row), row))
    late = replace(ev, entries=[*ev.entries, _e(20, "drained", 1, 131.0, ckpt_id="c", node="n0")])
    assert {r.name: r.ok for r in check_contracts(late, row)}["stale"] is True
    assert {r.name: r.ok for r in check_contracts(ev, row_for("preempt-signal"))}["stale"] is None
