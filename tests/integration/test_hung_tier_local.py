"""A preemption while tier 1 hangs (every shared-tier operation of the drains, bytes included,
blocks in the kernel): the gang still stops at a step boundary and requeues within its grace,
its stop commit whole on tier 0 with its partner copy, and the next allocation resumes from it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpcrun.control.log import EntryKind
from hpcrun.testing.runs import wait_for_state
from tests.integration.local_helpers import cli, local_spec, submit, valid_entries, wait_until

STEPS = 400


def _commits(run: Path, tier: str) -> list[dict[str, object]]:
    return [e.payload for e in valid_entries(run, EntryKind.COMMIT) if e.payload["tier"] == tier]


def _copied(run: Path, ckpt_id: object) -> set[object]:
    """Owners of ``ckpt_id`` whose shards a partner holds complete."""
    return {e.payload["owner"] for e in valid_entries(run, EntryKind.NOTE)
            if e.payload.get("event") == "partner_copy" and e.payload["ckpt_id"] == ckpt_id
            and e.payload["complete"]}


def test_a_preemption_under_a_hung_tier_1_requeues_within_its_grace_losing_no_commit(
        tmp_path: Path) -> None:
    hung = tmp_path / "hung-ost"
    pace = ";".join(f"slow@step=1,rank={r},seconds=0.05,every=1" for r in (0, 1))
    run = submit(tmp_path / "runs", local_spec(steps=STEPS, every_steps=20),
                 inject=f"{pace};storage@mode=stall,while={hung}", wait=False)
    wait_until(run, lambda r: any(c.tier == "shared" for c in r.checkpoints), timeout=240,
               what="a checkpoint on tier 1")
    os.mkfifo(hung)  # from now on every drain operation blocks, as on a hung OST
    try:
        floor = max(int(c["step"]) for c in _commits(run, "shared"))
        wait_until(run, lambda r: max(c.step for c in r.checkpoints) >= floor + 40,
                   timeout=240, what="newer commits on tier 0 only")
        started = time.monotonic()
        out = cli(tmp_path / "runs", "signal", run.name)
        assert out.returncode == 0, out.stderr
        wait_until(run, lambda r: str(r.state) in ("REQUEUED", "STARTING", "RUNNING")
                   and r.requeues == 1, timeout=120, what="the requeue")
        took = time.monotonic() - started
    finally:
        writer = os.open(hung, os.O_WRONLY | os.O_NONBLOCK)  # the tier answers again
        hung.unlink()
        os.close(writer)
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=400)
    assert (str(record.state), record.step, record.requeues) == ("SUCCEEDED", STEPS, 1)
    print(f"\nhung tier 1: signal -> requeued in {took:.1f} s")
    # the local site's grace is 0 s: the final drains' operations get their 5 s floor (not the
    # site's 300 s deadline) and the blocked background drain its 2 s (not 30 s)
    assert took < 45, f"the preemption waited on the hung tier for {took:.0f} s"
    stop = _commits(run, "node_local")
    preempted = [e for e in valid_entries(run, EntryKind.STATE)
                 if e.payload["state"] == "PREEMPTED"]
    stop_commit = [c for c in stop if c["generation"] == preempted[0].generation][-1]
    assert int(stop_commit["step"]) > floor, "the stop commit is newer than tier 1's"
    assert _copied(run, stop_commit["ckpt_id"]) == set(stop_commit["nodes"])  # type: ignore[arg-type]
    running = [e.payload for e in valid_entries(run, EntryKind.STATE)
               if e.payload["state"] == "RUNNING"]
    assert running[1]["restored_step"] == stop_commit["step"], "no committed step lost"
    timeouts = [e.payload for e in valid_entries(run, EntryKind.FAULT)
                if e.payload["fault"] == "storage_timeout"]
    assert timeouts and all(f.get("background") for f in timeouts), \
        "the hung tier is reported, as a background fault"
