"""Constructed events for observe tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcrun.protocols import Event


def ev(kind: str, ts: float, step: int = 0, *, rank: int = 0, gen: int = 1, node: str = "n0",
       **data: Any) -> Event:
    """An instant event at ``ts``."""
    return Event(kind=kind, ts=ts, run_id="r1", generation=gen, step=step, rank=rank, node=node,
                 data=data)


def span(kind: str, start: float, end: float, step: int = 0, **kw: Any) -> Event:
    """A span event from ``start`` to ``end`` (ts is its end)."""
    return ev(kind, end, step, start_ts=start, dur_s=end - start, **kw)


def step(n: int, start: float, end: float, *, input_wait_s: float = 0.0, tokens: int = 100,
         **kw: Any) -> Event:
    """A ``step`` event of step ``n``."""
    return span("step", start, end, n, input_wait_s=input_wait_s, tokens=tokens, **kw)


def two_generation_log() -> list[Event]:
    """Gen 1: startup, 5 steps, a checkpoint stage, then preempted. Gen 2: restore, 2 replays."""
    g1 = [
        ev("state", 0.0, gen=1, state="STARTING", nodes=2),
        span("admission", 5.0, 10.0, gen=1),
        step(1, 10.0, 20.0, input_wait_s=1.0, gen=1),
        step(2, 20.0, 30.0, input_wait_s=1.0, gen=1),
        step(3, 30.0, 40.0, input_wait_s=1.0, gen=1),
        span("ckpt_stage", 40.0, 45.0, 3, gen=1),
        span("ckpt_write", 45.0, 50.0, 3, gen=1),            # background: not exposed
        step(4, 45.0, 55.0, gen=1),
        step(5, 55.0, 65.0, gen=1),
        ev("fault", 65.0, 5, gen=1, fault="preemption"),
        ev("state", 70.0, 5, gen=1, state="PREEMPTED"),
    ]
    g2 = [
        ev("state", 1000.0, gen=2, state="STARTING", nodes=2),
        span("restore", 1000.0, 1020.0, 3, gen=2),
        step(4, 1020.0, 1030.0, gen=2),
        step(5, 1030.0, 1040.0, gen=2),
        step(6, 1040.0, 1050.0, input_wait_s=2.0, gen=2),
        span("collective", 1050.0, 1052.0, 6, gen=2),
    ]
    return g1 + g2


def runtime_two_generation_log() -> list[Event]:
    """The rank events the runtime writes (``hpcrun.runtime.rank.worker``, ``context``) for a run of
    2 ranks on 2 nodes. Gen 1: rank start, a restore that finds nothing, 5 steps with an async
    checkpoint stage after step 3, then the node dies (no event after step 5). Gen 2: rank
    start, the restore of step 3, steps 4 and 5 replayed, step 6, the final stop agreement and
    commit (its blocking stage inside)."""
    g1 = [span("restore", 9.0, 10.0), step(1, 10.0, 20.0, input_wait_s=1.0),
          step(2, 20.0, 30.0, input_wait_s=1.0), step(3, 30.0, 40.0, input_wait_s=1.0),
          span("ckpt_stage", 40.0, 45.0, 3, blocking=False), ev("checkpoint", 45.0, 3),
          step(4, 45.0, 55.0), step(5, 55.0, 65.0)]
    g2 = [span("restore", 1002.0, 1020.0, 3), ev("restored", 1020.0, 3, tier="shared"),
          step(4, 1020.0, 1030.0), step(5, 1030.0, 1040.0),
          step(6, 1040.0, 1050.0, input_wait_s=2.0),
          span("collective", 1050.0, 1052.0, 6, what="stop_agreement"),
          span("ckpt_stage", 1052.0, 1055.0, 6, blocking=True), ev("checkpoint", 1055.0, 6),
          span("ckpt_commit", 1052.0, 1056.0, 6, reason="final")]
    out = []
    for gen, t0, body in ((1, 5.0, g1), (2, 1000.0, g2)):
        for rank in (0, 1):
            head = [ev("rank_start", t0, backend="gloo", device="cpu"),
                    ev("startup", t0 + 1.0, marks={"process": t0 - 1.0})]
            out += [replace(e, generation=gen, rank=rank, node=f"n{rank}") for e in head + body]
    return out


def make_run(root: Path, *, slow_rank: int | None = 3, n_steps: int = 30,
             terminal: bool = False) -> Path:
    """A real run directory: spec, fenced log, events of 4 ranks on 2 nodes, heartbeats, logs.

    The run started at t=1000 (steps of 1 s, rank ``slow_rank`` takes 2 s) with a checkpoint
    committed on node_local at step 10 and shared at step 10 (drained), and one fault.
    """
    from hpcrun.control.log import EntryKind, RunLog
    from hpcrun.control.record import create_run
    from hpcrun.control.spec import CheckpointPolicy, RunSpec
    from hpcrun.observe.events import EventWriter, event_path
    from hpcrun.observe.heartbeat import HeartbeatAggregator, write_rank_heartbeat
    from hpcrun.testing.fakes import FakeClock

    spec = RunSpec(name="demo", entrypoint="examples.demo:main",
                   checkpoint=CheckpointPolicy(rpo_s=600.0))
    clock = FakeClock(start=1000.0)
    run_dir = create_run(root, spec, run_id="demo-1", clock=clock)
    log = RunLog(run_dir, clock=clock)
    fence = log.claim("h1")
    pub = {"generation": fence.generation, "holder": "h1"}
    log.append(EntryKind.JOB, payload={"job_id": "4242", "backend": "slurm"}, **pub)
    log.publish(EntryKind.STATE, payload={"state": "STARTING"}, **pub)
    log.publish(EntryKind.STATE, payload={"state": "RUNNING"}, **pub)
    nodes = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}
    for rank, node in nodes.items():
        w = EventWriter(event_path(run_dir, node=node, rank=rank), run_id="demo-1",
                        generation=fence.generation, rank=rank, node=node, clock=clock)
        t = 1000.0
        for s in range(1, n_steps + 1):
            dur = 2.0 if rank == slow_rank else 1.0
            w.emit("step", s, start_ts=t, dur_s=dur, tokens=64, input_wait_s=0.1)
            t += 2.0
        w.close()
        write_rank_heartbeat(root / "local" / node, rank=rank, step=n_steps,
                             ts=1000.0 + 2 * n_steps, step_time_s=1.0, pid=100 + rank)
        out = run_dir / "logs" / node / f"rank-{rank:05d}.out"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(f"rank {rank} step {s} loss 1.{s}\n" for s in range(1, n_steps + 1)))
    clock.advance(2 * n_steps)
    for node in ("n0", "n1"):
        HeartbeatAggregator(run_dir, node=node, hb_dir=root / "local" / node,
                            generation=fence.generation, clock=clock).poll()
    for tier in ("node_local", "shared"):
        log.publish(EntryKind.COMMIT, payload={"ckpt_id": "c10", "step": 10, "tier": tier,
                                               "manifest": "ckpt/c10/manifest.json"}, **pub)
    log.publish(EntryKind.PROGRESS, payload={"step": n_steps, "tokens": 64 * 4 * n_steps}, **pub)
    log.publish(EntryKind.CURSOR, payload={"step": 10, "cursor": {"state": {
        "epoch": 0, "position": 2560, "realized_counts": {"web": 2000, "code": 560}}}}, **pub)
    log.append(EntryKind.FAULT, payload={"fault": "process_crash", "node": "n1", "rank": 3,
                                         "step": 7, "signature": "crash:oom",
                                         "detail": "exited 137"}, **pub)
    if terminal:
        log.publish(EntryKind.STATE, payload={"state": "SUCCEEDED"}, **pub)
    return run_dir
