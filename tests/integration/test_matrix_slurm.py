"""The remaining fault-matrix rows on the real Slurm testbed (``docs/recovery.md``).

Rows covered here and nowhere else in ``tests/integration``: a stale worker on a frozen node, a
storage error on the shared tier during the drain, a world-size change at restore, a rank
killed inside a checkpoint (staging, shard write, between shard write and manifest publish),
and a truncated and a bit-flipped shard of the newest checkpoint.
Each run is 2 nodes x 1 rank, so ``global_batch`` (8) divides the 1-, 2- and 4-rank layouts.
Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcrun.control.log import EntryKind, LogEntry
from hpcrun.data.batches import replica_rows
from hpcrun.data.pipeline import DataPipeline
from hpcrun.drill.contracts import after_newer_fence, check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import DrillFault, injection, row_for
from hpcrun.drill.stale import drain_as_stale
from hpcrun.drill.states import committed, load_state
from hpcrun.testbed import JobClient, Testbed
from hpcrun.testbed.daemons import is_alive
from tests.integration.helpers import (
    RunFactory,
    TestbedRun,
    first_after,
    slurm_spec,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EVERY = 10
"""Checkpoint cadence (steps) of every run here."""


def _spec(testbed: Testbed, *, steps: int, ledger: bool = False) -> dict[str, Any]:
    return slurm_spec(testbed, nodes=2, tasks_per_node=1, steps=steps, every_steps=EVERY,
                      config={"ledger": ledger})


def _pace(seconds: float) -> str:
    """Every rank sleeps ``seconds`` per step in every incarnation (keeps a run observable)."""
    return ";".join(f"slow@step=1,rank={r},seconds={seconds},every=1" for r in (0, 1))


def _fences(run: TestbedRun) -> list[LogEntry]:
    return [e for e in run.entries() if e.kind == EntryKind.FENCE]


def _slurmd_pid(testbed: Testbed, node: str) -> int:
    """The pid of the testbed's own slurmd of ``node`` (from its pid file, checked alive)."""
    found = [s for s in testbed.status().daemons if s.name == f"slurmd@{node}"]
    assert found and found[0].running and found[0].pid, f"no running slurmd for {node}: {found}"
    pid = int(found[0].pid)
    assert is_alive(pid, "slurmd"), f"pid {pid} is not {node}'s slurmd"
    return pid


def _wait_for_shared_checkpoint(run: TestbedRun) -> None:
    run.wait_for("a checkpoint on the shared tier", lambda: any(
        c.tier == "shared" for c in run.record().checkpoints), timeout=120)


def _committed_before(run: TestbedRun, step: int, slot: int) -> bool:
    return any(e.payload.get("step") == step and e.slot < slot
               for e in run.valid(EntryKind.COMMIT))


# -- stale worker ------------------------------------------------------------------------------

def _tier0_root(testbed: Testbed, node: str, run_id: str) -> Path:
    """Host path of ``node``'s tier-0 root for ``run_id`` (the site's per-job directory)."""
    found = [p.parent.parent for p in testbed.node_local_dir(node).glob(f"hpcrun/*/{run_id}/ckpt")]
    assert len(found) == 1, f"{node}'s tier 0 of {run_id}: {found}"
    return found[0]


def test_stale_worker_on_a_frozen_node_publishes_only_void_entries(
        testbed: Testbed, runs: RunFactory, slurm: JobClient) -> None:
    """Freeze the supervising node's slurmd while its drain to the shared tier fails.

    Slurm declares the node down and requeues the job elsewhere, under a newer fence. The frozen
    node still holds its undrained share of the checkpoints; once the newer fence is up and the
    shared tier is back, that share is drained and published under the old generation (the
    drill's stale writer, :func:`~hpcrun.drill.stale.drain_as_stale`: the frozen agent's own
    retries end within the drain's bounded wait, which may come before the fence). The log
    tells the writer to stop, the entries are void and nothing counts them; the ``stale``
    contract fails the row when no such write was made.
    """
    steps = 150
    flag = runs.runs_root / "shared-tier-down"
    row = row_for(DrillFault.STALE_WORKER)
    # The frozen node's ranks keep training until Slurm declares it down (30-60 s): paced at
    # 1 s a step in the first incarnation only, the old gang cannot reach the last step before
    # the new fence (the new incarnation would then restore the final commit and have nothing
    # left to run); the next incarnation runs unpaced.
    first_pace = ";".join(f"slow@step=1,rank={r},seconds=1.0" for r in (0, 1))
    run = runs.submit(_spec(testbed, steps=steps, ledger=True),
                      inject=f"{first_pace};storage@mode=fail,while={flag}")
    _wait_for_shared_checkpoint(run)
    first = run.record()
    victim = first.membership[0]  # the batch host and supervisor: its agent outlives the gang
    fence = next(f for f in _fences(run) if f.generation == first.generation)
    pid = _slurmd_pid(testbed, victim)
    started = time.monotonic()
    try:
        flag.touch()
        os.kill(pid, signal.SIGSTOP)
        new_fence = run.wait_for("a newer fence (the job requeued elsewhere)", lambda: next(
            (f for f in _fences(run) if f.generation > first.generation), None), timeout=120)
        declared_s = time.monotonic() - started
        own = [e for e in run.entries()
               if e.generation == first.generation and e.slot > new_fence.slot]
        flag.unlink()  # the shared tier is back: the frozen node's share drains
        write = drain_as_stale(run.run_dir, _tier0_root(testbed, victim, first.run_id),
                               node=victim, fence=fence)
    finally:
        flag.unlink(missing_ok=True)
        if is_alive(pid, "slurmd"):
            os.kill(pid, signal.SIGCONT)
        slurm.run("scontrol", "update", f"nodename={victim}", "state=resume")
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    entries = run.entries()
    stale = after_newer_fence(entries)
    print(f"\nstale worker: {victim} frozen, new fence after {declared_s:.1f} s; the frozen "
          f"agent wrote {len(own)} entries after it, the stale writer "
          f"{[(e.slot, e.kind) for e in write.entries]}; {len(stale)} stale entries: "
          f"{sorted({(e.kind, e.payload.get('event')) for e in stale}, key=str)}")
    drained = [e for e in write.entries if e.kind == EntryKind.DRAINED]
    assert drained, f"the frozen node had no pending drain to publish: {write}"
    assert write.refused and "void" in write.refused, "the log accepted a stale publish"
    assert {e.slot for e in write.entries} <= {e.slot for e in stale}
    assert all(e.payload.get("node") in (victim, None) for e in stale)
    results = check_contracts(collect(run.run_dir, victim_rank=None), row)
    print("; ".join(f"{r.name} {r.mark}: {r.detail}" for r in results if r.ok is not None))
    failed = not_held(results, row)
    assert not failed, f"drill contracts failed: {failed}"
    assert rec.step == steps and rec.requeues >= 1
    states = run.states()
    restarted = first_after(states, "STARTING", new_fence.slot)
    resumed = first_after(states, "RUNNING", restarted.slot)
    restored = resumed.payload["restored_step"]
    assert restored >= EVERY and _committed_before(run, restored, new_fence.slot)
    allocations = [e.payload["nodes"] for e in run.valid(EntryKind.JOB) if "nodes" in e.payload]
    assert victim in allocations[0] and victim not in allocations[-1]
    wait_until(f"{victim} back in service", lambda: slurm.run(
        "sinfo", "-h", "-n", victim, "-o", "%T").stdout.strip() in ("idle", "mixed", "allocated"),
        timeout=60)


# -- storage error on the shared tier during the drain ------------------------------------------

def _status(run: TestbedRun) -> dict[str, Any]:
    done = run.cli("status", run.name, "--json", "--no-reconcile", timeout=60)
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    return body


def _cadence_s(run: TestbedRun) -> float:
    """Median seconds between two tier-0 commits of the run."""
    ts = sorted(e.ts for e in run.valid(EntryKind.COMMIT) if e.payload.get("tier") == "node_local")
    return statistics.median(b - a for a, b in itertools.pairwise(ts))


def test_drain_storage_error_keeps_training_and_reports_rpo_exposure(
        testbed: Testbed, runs: RunFactory) -> None:
    steps = 200
    flag = runs.runs_root / "shared-tier-down"
    run = runs.submit(_spec(testbed, steps=steps),
                      inject=f"{_pace(0.08)};storage@mode=fail,while={flag}")
    _wait_for_shared_checkpoint(run)
    flag.touch()
    window_start, step_before = time.time(), run.record().step
    exposures = []
    while time.time() - window_start < 12:
        exposures.append(_status(run)["rpo_exposure_s"])
    flag.unlink()
    window_end, step_after = time.time(), run.record().step
    rec = run.wait({"SUCCEEDED"}, timeout=180)
    notes = [e for e in run.valid(EntryKind.NOTE) if e.payload.get("event") == "drain_error"]
    cadence = _cadence_s(run)
    print(f"\ndrain error: window {window_end - window_start:.1f} s, steps {step_before} -> "
          f"{step_after}, {len(notes)} drain_error notes, exposure max "
          f"{max(exposures):.1f} s (cadence {cadence:.1f} s)")
    assert step_after >= step_before + 2 * EVERY, "training stalled during the drain failure"
    assert rec.step == steps and rec.requeues == 0 and rec.restarts == 0
    assert len({e.generation for e in _fences(run)}) == 1
    assert notes and all(window_start - 1 <= e.ts <= window_end + 3 for e in notes)
    assert max(exposures) > max(2 * cadence, 5.0)
    drained_after = [e for e in run.valid(EntryKind.DRAINED) if e.ts > window_end]
    assert drained_after, "no drain succeeded after the window"
    shared = [c for c in rec.checkpoints if c.tier == "shared"]
    assert shared[-1].step == steps
    for c in shared:
        if (run.run_dir / "ckpt" / c.ckpt_id).exists():  # older ones are pruned (keep_last)
            verified = run.cli("ckpt", "verify", str(run.run_dir), c.ckpt_id)
            assert verified.returncode == 0, f"{c.ckpt_id}: {verified.stdout}{verified.stderr}"


@pytest.mark.slow
def test_a_stalled_shared_tier_is_a_storage_timeout_not_a_hang(
        testbed: Testbed, runs: RunFactory) -> None:
    """The drain's shared-tier operations block in the kernel (a FIFO nobody writes, as on a
    hung mount): each becomes a ``storage_timeout`` fault within the site's deadline, training
    goes on, and the drain catches up once the tier answers again."""
    steps = 260
    fifo = runs.runs_root / "shared-tier-stalled"
    run = runs.submit(_spec(testbed, steps=steps),
                      inject=f"{_pace(0.08)};storage@mode=stall,while={fifo},ops=makedirs+rename")
    _wait_for_shared_checkpoint(run)
    os.mkfifo(fifo)
    window_start, step_before = time.time(), run.record().step
    try:
        timeouts = run.wait_for("a storage_timeout fault", lambda: [
            e for e in run.valid(EntryKind.FAULT)
            if e.payload.get("fault") == "storage_timeout"], timeout=90)
        step_after = run.record().step
    finally:
        _unstall(fifo)
    window = time.time() - window_start
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    print(f"\nstalled shared tier: {len(timeouts)} storage_timeout faults in {window:.1f} s, "
          f"steps {step_before} -> {step_after}")
    assert timeouts[0].payload["background"] is True
    assert "deadline" in timeouts[0].payload["detail"]
    assert step_after > step_before + EVERY, "training stalled with the shared tier"
    assert rec.step == steps and rec.requeues == 0 and rec.restarts == 0
    tail = [(e.payload.get("step"), e.payload.get("tier")) for e in run.valid(EntryKind.COMMIT)]
    print(f"last commits (step, tier): {tail[-4:]}")
    assert [c for c in rec.checkpoints if c.tier == "shared"][-1].step == steps


def _unstall(fifo: Path) -> None:
    """The tier answers again: wake the operations blocked opening the FIFO (a writer opens
    it), and remove it so later operations pass at once."""
    try:
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody is blocked on it
    except OSError:
        writer = None
    fifo.unlink()
    if writer is not None:
        os.close(writer)


# -- world-size change ----------------------------------------------------------------------------

def _next_global_batch(run_dir: Path, ckpt: Any, spec: dict[str, Any],
                       world_size: int) -> tuple[set[int], np.ndarray, np.ndarray]:
    """Restore ``ckpt`` onto ``world_size`` ranks; the next batch index, tokens and sample IDs.

    Each rank's data pipeline is rebuilt from the cursor the checkpoint plane restored for it;
    the global batch is its replicas' rows concatenated in rank order.
    """
    state = load_state(run_dir, ckpt, world_size=world_size)
    data, seq_len = spec["data"], spec["config"]["seq_len"] + 1
    batches, tokens, ids = set(), [], np.empty(0)
    for rs in state.ranks:
        pipe = DataPipeline(data["manifest"], seed=data["seed"],
                            global_batch=data["global_batch"], seq_len=seq_len,
                            replica=rs.rank, num_replicas=world_size, workers=1)
        try:
            pipe.load_state_dict(rs.meta["data"])
            batch = next(pipe)
            k = int(batch["batch"])
            rows = replica_rows(data["global_batch"], rs.rank, world_size)
            assert len(np.asarray(batch["tokens"])) == len(rows)
            batches.add(k)
            tokens.append(np.asarray(batch["tokens"]))
            ids = pipe.sample_ids(k)
        finally:
            pipe.close()
    return batches, np.concatenate(tokens), ids


def test_world_size_change_keeps_the_global_sample_order(
        testbed: Testbed, runs: RunFactory) -> None:
    steps = 30
    spec = _spec(testbed, steps=steps, ledger=True)
    run = runs.submit(spec)
    run.wait({"SUCCEEDED"}, timeout=180)
    drill = run.cli("drill", "--restore", run.name, timeout=300)
    print(f"\n{drill.stdout}")
    assert drill.returncode == 0, f"restore drill failed:\n{drill.stdout}{drill.stderr}"
    assert "→ 1 ranks" in drill.stdout and "→ 4 ranks" in drill.stdout
    ckpt = [c for c in committed(run.run_dir) if "shared" in c.tiers][-1]
    ledger = [json.loads(line) for line in (run.run_dir / "ledger.jsonl").read_text().splitlines()]
    last = max((line for line in ledger if line["step"] < ckpt.step), key=lambda x: x["step"])
    saved_batches, saved_tokens, saved_ids = _next_global_batch(run.run_dir, ckpt, spec, 2)
    assert saved_batches == {last["batch"] + 1}  # the cursor is right after the saved step
    for world in (1, 4):
        batches, tokens, ids = _next_global_batch(run.run_dir, ckpt, spec, world)
        assert batches == saved_batches, f"{world} ranks resume at batch {batches}"
        assert np.array_equal(ids["sample_id"], saved_ids["sample_id"])
        assert np.array_equal(tokens, saved_tokens), f"{world} ranks read another global batch"


# -- a rank killed inside a checkpoint ------------------------------------------------------------

@pytest.mark.parametrize("fault", [DrillFault.KILL_STAGING, DrillFault.KILL_SHARD_WRITE,
                                   DrillFault.KILL_BEFORE_MANIFEST])
def test_rank_killed_inside_a_checkpoint_recovers_from_the_previous_commit(
        testbed: Testbed, runs: RunFactory, fault: DrillFault) -> None:
    steps, at = 40, EVERY + EVERY // 2  # the save at step 20 is killed; step 10 is committed
    row = row_for(fault)
    inject = injection(row, at=at, world_size=2, tasks_per_node=1)
    run = runs.submit(_spec(testbed, steps=steps, ledger=True), inject=inject)
    rec = run.wait({"SUCCEEDED"}, timeout=240)
    fences = _fences(run)
    assert rec.step == steps and rec.restarts >= 1 and len(fences) >= 2
    states = run.states()
    resumed = first_after(states, "RUNNING", fences[1].slot)
    assert resumed.payload["restored_step"] == EVERY, "not the previous committed checkpoint"
    torn = [e for e in run.valid(EntryKind.COMMIT)
            if e.generation == fences[0].generation and e.payload.get("step") == 2 * EVERY]
    assert not torn, f"the killed save committed: {torn}"
    results = check_contracts(collect(run.run_dir, victim_rank=None), row)
    failed = not_held(results, row)
    print(f"\n{fault}: {inject}; " + "; ".join(f"{r.name} {r.mark}" for r in results))
    assert not failed, f"drill contracts failed: {failed}"


# -- corrupt shards ----------------------------------------------------------------------------

def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[:len(data) // 2]))
    else:
        data[len(data) * 2 // 3] ^= 0xFF
        path.write_bytes(bytes(data))


def test_corrupt_shards_of_the_newest_checkpoint_restore_the_previous_one(
        testbed: Testbed, runs: RunFactory) -> None:
    """The stop checkpoint's shards are damaged on both tiers (one truncated, one bit-flipped)
    between the requeue and the restore: it is never loaded, the previous one is."""
    steps = 200  # ~20 s of steps left when the first shared checkpoint shows, even loaded
    run = runs.submit(_spec(testbed, steps=steps, ledger=True), inject=_pace(0.1))
    _wait_for_shared_checkpoint(run)
    sent = run.cli("signal", run.name)
    assert sent.returncode == 0, sent.stderr
    run.wait_for("the requeue", lambda: any(
        e.payload.get("event") == "requeue_sent" for e in run.valid(EntryKind.NOTE)),
        timeout=120)
    # the next incarnation reads its restore point ~15 s from now (queue, start-up): in time
    checkpoints = run.record().checkpoints
    newest = [c for c in checkpoints if c.tier == "shared"][-1]  # the stop commit
    previous = max(c.step for c in checkpoints if c.step < newest.step)  # on either tier
    copies = sorted(run.run_dir.glob(f"ckpt/{newest.ckpt_id}/*/rank-*.h5")) + sorted(
        p for node in testbed.nodes
        for p in testbed.node_local_dir(node).rglob(f"{newest.ckpt_id}/**/rank-*.h5"))
    assert {p.name for p in copies} == {"rank-00000.h5", "rank-00001.h5"}, copies
    for path in copies:
        _damage(path, "truncate" if path.name == "rank-00000.h5" else "flip")

    rec = run.wait({"SUCCEEDED"}, timeout=240)
    assert rec.step == steps
    second = _fences(run)[1]
    resumed = first_after(run.states(), "RUNNING", second.slot)
    assert resumed.payload["restored_step"] == previous
    skipped = [e.payload for e in run.valid(EntryKind.FAULT)
               if e.payload.get("signature") == "ckpt:verify"]
    assert skipped and {p["ckpt_id"] for p in skipped} == {newest.ckpt_id}, skipped
    assert all(p.get("background") for p in skipped)  # an incident: training went on
    results = check_contracts(collect(run.run_dir, victim_rank=None),
                              row_for(DrillFault.CORRUPT_SHARD))
    failed = not_held(results, row_for(DrillFault.CORRUPT_SHARD))
    assert not failed, f"drill contracts failed: {failed}"
