"""``hpcrun status`` and ``hpcrun report`` on a simulated 2,048-node x 8-rank run, 1 hour of events.

Writes a run directory in the node-stream layout (one ``events/<node>.jsonl`` per node: every
rank's step event and stop-agreement span per step, a heartbeat record every 15 s with the
node's last output lines; one rank straggles at 2x, one rank hangs), then measures:

- the node-0 agent's fold (:class:`~hpcrun.observe.runsummary.StreamFold`): the whole hour at
  once (throughput) and one 5-second round of appended events (what it does while a run goes);
- the run summary's size, and ``collect_status`` on it in a fresh process: the first read (no
  record snapshot yet) and repeated reads, plus the text rendering;
- the whole ``hpcrun status --no-reconcile`` command;
- ``hpcrun report`` (every event of the run) on runs of 16, 64 and 256 nodes of the same shape:
  the report reads O(nodes) streams but every event in them.

Usage::

    python benchmarks/status_scale.py [--nodes 2048] [--ranks-per-node 8] [--hours 1]
                                      [--step-s 30] [--report-nodes 16 64 256] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import CheckpointPolicy, RunSpec
from hpcrun.observe.events import node_stream_path
from hpcrun.observe.runsummary import StreamFold, run_summary_path

T0 = 1_800_000_000.0
HB_EVERY_S = 15.0
_STEP = ('{"data":{"dur_s":%.6f,"input_wait_s":%.6f,"loss":2.1,"tokens":4096},'
         '"dataset_id":"ds-3f2a9c","generation":1,"kind":"step","node":"%s","rank":%d,'
         '"run_id":"bench-1","schema_version":1,"step":%d,"ts":%.6f,"versions":{"hpcrun":'
         '"0.9.0","python":"3.11.9","torch":"2.4.1"}}\n')
_SPAN = ('{"data":{"dur_s":%.6f,"start_ts":%.6f,"what":"stop_agreement"},'
         '"dataset_id":"ds-3f2a9c","generation":1,"kind":"collective","node":"%s","rank":%d,'
         '"run_id":"bench-1","schema_version":1,"step":%d,"ts":%.6f,"versions":{"hpcrun":'
         '"0.9.0","python":"3.11.9","torch":"2.4.1"}}\n')


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def build_run(root: Path, *, nodes: int, k: int, hours: float, step_s: float) -> Path:
    """The run directory: record, and one node stream per node with ``hours`` of events."""
    spec = RunSpec(name="bench", entrypoint="bench.main:main",
                   checkpoint=CheckpointPolicy(rpo_s=1800.0))
    run_dir = create_run(root, spec, run_id="bench-1")
    log = RunLog(run_dir)
    fence = log.claim("h")
    pub = {"generation": fence.generation, "holder": "h"}
    log.publish(EntryKind.STATE, payload={"state": "STARTING"}, **pub)
    log.publish(EntryKind.STATE, payload={"state": "RUNNING"}, **pub)
    steps = int(hours * 3600 / step_s)
    for s in range(0, steps, max(1, steps // 6)):
        log.publish(EntryKind.COMMIT, payload={"ckpt_id": f"c{s}", "step": s, "tier": "shared",
                                               "manifest": f"ckpt/c{s}/manifest.json"}, **pub)
    log.publish(EntryKind.PROGRESS, payload={"step": steps, "tokens": 4096 * nodes * k * steps},
                **pub)
    (run_dir / "events").mkdir(exist_ok=True)
    for i in range(nodes):
        node_stream_path(run_dir, node_name(i)).write_text(
            node_stream(i, k=k, steps=steps, step_s=step_s, slow_rank=17 * k + 3,
                        hung_rank=(nodes // 2) * k + 5))
    return run_dir


def node_stream(i: int, *, k: int, steps: int, step_s: float, slow_rank: int,
                hung_rank: int) -> str:
    """One node's stream for the run, in the order its agent forwards it."""
    node, ranks = node_name(i), range(i * k, (i + 1) * k)
    out: list[str] = []
    next_hb = T0 + HB_EVERY_S
    for s in range(1, steps + 1):
        start = T0 + (s - 1) * step_s
        for r in ranks:
            if r == hung_rank and s > steps - 40:
                continue
            dur = step_s * (0.99 if r != slow_rank else 1.98)
            out.append(_SPAN % (0.004, start - 0.004, node, r, s - 1, start))
            out.append(_STEP % (dur, 0.012, node, r, s, start + dur))
        while next_hb <= start + step_s:
            out.append(heartbeat_line(node, ranks, next_hb, s, step_s, hung_rank, steps))
            next_hb += HB_EVERY_S
    return "".join(out)


def heartbeat_line(node: str, ranks: range, ts: float, step: int, step_s: float,
                   hung_rank: int, steps: int) -> str:
    beats = []
    for r in ranks:
        st = min(step, steps - 40) if r == hung_rank else step
        beats.append([r, st, T0 + st * step_s, step_s * 0.99, 10_000 + r])
    return json.dumps({"record": "heartbeat", "hb_schema_version": 1, "node": node, "ts": ts,
                       "generation": 1, "ranks": beats,
                       "tails": [[r, f"[rank {r}] step {step} loss 2.1037 lr 3.0e-04 "
                                     f"tok/s 13651"] for r in ranks]},
                      separators=(",", ":")) + "\n"


def fold_run(run_dir: Path, *, nodes: int, k: int, step_s: float) -> dict[str, Any]:
    """The node-0 agent's work: the whole hour at once, then one 5-second round."""
    fold = StreamFold(run_dir)
    t0 = time.perf_counter()
    folded = fold.refresh(fold.files())
    whole_s = time.perf_counter() - t0
    events = fold.summary.events
    # one round: 5 s of the run appended to the streams (the next step lands on 1/6 of the
    # nodes when steps take 30 s), as the agents forward it
    per_round = max(1, round(nodes * 5.0 / step_s))
    steps = int(max(events, 1) / (2 * nodes * k))
    for i in range(per_round):
        node = node_name(i)
        with open(node_stream_path(run_dir, node), "a") as f:
            f.write("".join(_STEP % (step_s * 0.99, 0.012, node, r, steps + 1,
                                     T0 + steps * step_s + step_s * 0.99)
                            for r in range(i * k, (i + 1) * k)))
    t0 = time.perf_counter()
    fold.refresh(fold.files())
    refresh_s = time.perf_counter() - t0
    # the first snapshot also merges the hour's spans; time the second, as every later round
    fold.snapshot(run_id="bench-1", generation=1, now=T0 + 3600.0, final=False)
    t0 = time.perf_counter()
    body = fold.snapshot(run_id="bench-1", generation=1, now=T0 + 3600.0, final=False).to_bytes()
    run_summary_path(run_dir).write_bytes(body)
    snapshot_s = time.perf_counter() - t0
    fold.close()
    return {"bytes_folded": folded, "events": events, "whole_fold_s": whole_s,
            "events_per_s": events / whole_s, "run_events_per_s": nodes * k * 2 / step_s,
            "round_nodes": per_round, "round_refresh_s": refresh_s,
            "round_snapshot_s": snapshot_s, "summary_bytes": len(body)}


_CHILD = r"""
import json, statistics, sys, time
from pathlib import Path
t0 = time.perf_counter()
from hpcrun.observe.collect import collect_status
from hpcrun.observe.status import render_text
imports = time.perf_counter() - t0
run = Path(sys.argv[1]); now = float(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
view = collect_status(run, now=now).view
first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
times, cpu, render = [], [], []
for _ in range(int(sys.argv[3])):
    t0, c0 = time.perf_counter(), time.process_time()
    view = collect_status(run, now=now).view
    times.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
    t0 = time.perf_counter(); text = render_text(view); render.append(time.perf_counter() - t0)
print(json.dumps({"imports_s": imports, "first_s": first, "first_cpu_s": first_cpu,
                  "repeated_s": statistics.median(times), "repeated_cpu_s": statistics.median(cpu),
                  "repeated_max_s": max(times), "render_s": statistics.median(render),
                  "incidents": [i for i in view.incidents if i.startswith(("hang", "straggler"))],
                  "ettr": view.ettr, "nodes": len(view.nodes), "tails": len(view.tails),
                  "lines": len(text.splitlines())}))
"""


def measure_status(run_dir: Path, *, repeat: int) -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": str(run_dir.parent / "cache")}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(run_dir), str(T0 + 3610.0),
                          str(repeat)], capture_output=True, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(out.stdout)
    t0 = time.perf_counter()
    cli = subprocess.run([sys.executable, "-m", "hpcrun.cli.main", "status", str(run_dir),
                          "--no-reconcile"], capture_output=True, text=True, env=env, check=False)
    result["cli_s"] = time.perf_counter() - t0
    result["cli_rc"] = cli.returncode
    return result


def measure_report(root: Path, *, nodes: int, k: int, hours: float,
                   step_s: float) -> dict[str, Any]:
    from hpcrun.observe.events import sorted_events
    from hpcrun.observe.report import build_report

    run_dir = build_run(root, nodes=nodes, k=k, hours=hours, step_s=step_s)
    t0 = time.perf_counter()
    events = sorted_events(run_dir)
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_report(events, facts=None)
    build_s = time.perf_counter() - t0
    return {"nodes": nodes, "events": len(events), "read_s": read_s, "build_s": build_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step-s", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--report-nodes", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = ap.parse_args()
    k = args.ranks_per_node
    with tempfile.TemporaryDirectory(prefix="hpcrun-status-scale-", dir=args.dir) as tmp:
        t0 = time.perf_counter()
        run_dir = build_run(Path(tmp) / "full", nodes=args.nodes, k=k, hours=args.hours,
                            step_s=args.step_s)
        print(f"run: {args.nodes} nodes x {k} ranks, {args.hours:g} h of {args.step_s:g} s "
              f"steps, written in {time.perf_counter() - t0:.0f} s", flush=True)
        fold = fold_run(run_dir, nodes=args.nodes, k=k, step_s=args.step_s)
        print(f"node-0 fold: {fold['events']:,} events ({fold['bytes_folded'] / 2**20:,.0f} MiB)"
              f" in {fold['whole_fold_s']:.1f} s = {fold['events_per_s']:,.0f} events/s "
              f"(the run writes {fold['run_events_per_s']:,.0f}/s); one 5 s round "
              f"({fold['round_nodes']} nodes appended): refresh {fold['round_refresh_s']*1e3:.0f}"
              f" ms + summary {fold['round_snapshot_s']*1e3:.0f} ms; summary "
              f"{fold['summary_bytes'] / 2**20:.2f} MiB", flush=True)
        st = measure_status(run_dir, repeat=args.repeat)
        print(f"status view: first read {st['first_s']*1e3:.0f} ms (CPU "
              f"{st['first_cpu_s']*1e3:.0f} ms; target 300), repeated "
              f"{st['repeated_s']*1e3:.0f} ms median (CPU {st['repeated_cpu_s']*1e3:.0f} ms), "
              f"{st['repeated_max_s']*1e3:.0f} ms max (target 50); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; text rendering "
              f"{st['render_s']*1e3:.0f} ms; "
              f"`hpcrun status --no-reconcile` whole process {st['cli_s']*1e3:.0f} ms "
              f"(rc {st['cli_rc']}); {st['nodes']} nodes, {st['tails']} rank lines",
              flush=True)
        print(f"  named: {st['incidents']}; ETTR {st['ettr']:.3f}", flush=True)
        for n in args.report_nodes:
            rep = measure_report(Path(tmp) / f"report-{n}", nodes=n, k=k, hours=args.hours,
                                 step_s=args.step_s)
            print(f"report, {n} nodes ({rep['events']:,} events): read {rep['read_s']:.1f} s + "
                  f"build {rep['build_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
