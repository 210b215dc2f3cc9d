"""How long `hpcrun status` takes to read a run: record (snapshot + log tail) and 10,000 events.

Target: under 150 ms for a run with 10,000 events (the reconcile pass against Slurm is separate
and bounded by its own timeout). Usage::

    python benchmarks/status_latency.py [--events 10000] [--ranks 8] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.observe.collect import collect_status
from hpcrun.observe.events import EventWriter, event_path, sorted_events
from hpcrun.observe.heartbeat import HeartbeatAggregator, write_rank_heartbeat


def build_run(root: Path, *, events: int, ranks: int, log_entries: int) -> Path:
    """A run directory with ``events`` step events over ``ranks`` ranks and a busy log."""
    run_dir = create_run(root, RunSpec(name="bench", entrypoint="bench.main:main"),
                         run_id="bench-1")
    log = RunLog(run_dir)
    fence = log.claim("h")
    pub = {"generation": fence.generation, "holder": "h"}
    log.publish(EntryKind.STATE, payload={"state": "STARTING"}, **pub)
    log.publish(EntryKind.STATE, payload={"state": "RUNNING"}, **pub)
    steps = events // ranks
    for i in range(log_entries):
        log.publish(EntryKind.PROGRESS, payload={"step": i, "tokens": 1000 * i}, **pub)
    t0 = time.time() - steps
    for rank in range(ranks):
        node = f"node{rank // 4:03d}"
        with EventWriter(event_path(run_dir, node=node, rank=rank), run_id="bench-1",
                         generation=fence.generation, rank=rank, node=node,
                         max_queue=steps + 1) as w:
            for s in range(steps):
                w.emit("step", s, start_ts=t0 + s, dur_s=0.9, tokens=4096, loss=2.0,
                       input_wait_s=0.05)
        write_rank_heartbeat(root / "hb" / node, rank=rank, step=steps, ts=time.time(),
                             step_time_s=0.9, pid=1000 + rank)
        out = run_dir / "logs" / node / f"rank-{rank:05d}.out"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(f"step {s} loss 2.0\n" for s in range(steps)))
    for node in sorted({f"node{r // 4:03d}" for r in range(ranks)}):
        HeartbeatAggregator(run_dir, node=node, hb_dir=root / "hb" / node).poll()
    return run_dir


def timed(fn, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--log-entries", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = build_run(Path(tmp), events=args.events, ranks=args.ranks,
                            log_entries=args.log_entries)
        read_record(run_dir)  # first read writes the snapshot, as any earlier status would
        parts = {
            "record (snapshot + log tail)": timed(lambda: read_record(run_dir), args.repeat),
            f"events ({args.events})": timed(lambda: sorted_events(run_dir), args.repeat),
            "full status view": timed(lambda: collect_status(run_dir), args.repeat),
        }
    print(f"run: {args.events} events over {args.ranks} ranks, {args.log_entries} log entries")
    for name, ts in parts.items():
        print(f"  {name:<30} median {statistics.median(ts) * 1000:7.1f} ms   "
              f"max {max(ts) * 1000:7.1f} ms")
    ok = statistics.median(parts["full status view"]) < 0.150
    print(f"target < 150 ms for the full view: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
