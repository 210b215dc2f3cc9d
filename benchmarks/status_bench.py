"""Median time of ``read_record`` on a run log of 10,000 entries, cold and warm.

cold: no snapshot, every entry is read and folded. warm: the snapshot covers the log and one new
entry is folded. Usage: ``python benchmarks/status_bench.py [--entries N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hpcrun.control.log import EntryKind, LogEntry, RunLog, slot_name
from hpcrun.control.record import SNAPSHOT_FILE, create_run, read_record
from hpcrun.control.spec import RunSpec


def build_log(root: Path, entries: int) -> Path:
    spec = RunSpec.from_dict({"name": "bench", "entrypoint": "bench:main"})
    run_dir = create_run(root, spec, run_id="bench-1")
    fence = RunLog(run_dir).claim("bench")
    kinds = (EntryKind.PROGRESS, EntryKind.HEARTBEAT, EntryKind.PROGRESS, EntryKind.COMMIT)
    for i in range(entries - 2):  # written directly: this measures reading, not appending
        payload = {"step": i, "tokens": i * 4096, "node": f"node{i % 8}", "ts": float(i),
                   "ckpt_id": f"c{i}", "tier": "shared", "manifest": f"ckpt/c{i}/m.json"}
        entry = LogEntry(slot=fence.slot + 1 + i, kind=kinds[i % len(kinds)],
                         generation=fence.generation, holder=fence.holder, ts=float(i),
                         writer="bench:0", payload=payload)
        (run_dir / "log" / slot_name(entry.slot)).write_bytes(entry.to_bytes())
    return run_dir


def median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = build_log(Path(tmp), args.entries)
        snapshot = run_dir / SNAPSHOT_FILE

        def cold() -> None:
            snapshot.unlink(missing_ok=True)
            read_record(run_dir, write_snapshot=False)

        log = RunLog(run_dir)

        def warm() -> None:
            log.append(EntryKind.NOTE, generation=-1, holder="", payload={})
            read_record(run_dir)

        cold_ms = median_ms(cold, args.repeats)
        read_record(run_dir)  # write the snapshot
        warm_ms = median_ms(warm, args.repeats)
    print(f"read_record, {args.entries} entries: cold {cold_ms:.1f} ms (median of "
          f"{args.repeats}), warm {warm_ms:.1f} ms (snapshot + 1 new entry)")


if __name__ == "__main__":
    main()
