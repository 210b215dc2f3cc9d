"""``hpcrun status`` and ``hpcrun report`` on a simulated 2,048-node x 8-rank run, 1 hour of events.

Writes a run directory in the node-stream layout (one ``events/<node>.jsonl`` per node: every
rank's step event and stop-agreement span per step, a heartbeat record every 15 s with the
node's last output lines; one rank straggles at 2x, one rank hangs), then measures:

- the node-0 agent's fold (:class:`~hpcrun.observe.runsummary.StreamFold`): the whole hour at
  once (throughput) and one 5-second round of appended events (what it does while a run goes);
- the run summary's size, and ``collect_status`` on it in fresh processes, CPU time beside
  wall time: the default view (the summary's head and the named ranks' lines) and the view
  from every rank's line (``--json``, ``--ranks all``, every status before the head),
  interleaved so both see the same load: the first read (no record snapshot yet), repeated
  reads and the text rendering, and whether both print the same text;
- the whole ``hpcrun status --no-reconcile`` command, by default and with ``--ranks all``;
- ``hpcrun report`` (every event of the run) on runs of 16, 64 and 256 nodes of the same shape:
  the report reads O(nodes) streams but every event in them.

Usage::

    python benchmarks/status_scale.py [--nodes 2048] [--ranks-per-node 8] [--hours 1]
                                      [--step-s 30] [--report-nodes 16 64 256] [--dir /var/tmp]
                                      [--repeat 11] [--status-only RUN_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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
CLI_REPEAT = 7
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
from hpcrun.control.record import SNAPSHOT_FILE
from hpcrun.observe.collect import collect_status
from hpcrun.observe.status import render_text
imports = time.perf_counter() - t0
run, now, repeat, first_mode = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
MODES = {"head": False, "full": True}  # every_rank: the default text's view, or --json's

def timed(mode):
    t0, c0 = time.perf_counter(), time.process_time()
    view = collect_status(run, now=now, every_rank=MODES[mode]).view
    return view, time.perf_counter() - t0, time.process_time() - c0

(run / SNAPSHOT_FILE).unlink(missing_ok=True)  # the first read of a fresh record
view, first, first_cpu = timed(first_mode)
out = {"imports_s": imports, "first_s": first, "first_cpu_s": first_cpu}
wall, cpu, render, text = {m: [] for m in MODES}, {m: [] for m in MODES}, {m: [] for m in MODES}, {}
for _ in range(repeat):
    for mode in MODES:  # interleaved: both see the same load
        view, w, c = timed(mode)
        wall[mode].append(w); cpu[mode].append(c)
        c0 = time.process_time(); text[mode] = render_text(view)
        render[mode].append(time.process_time() - c0)
        out[mode + "_view"] = {"incidents": [i for i in view.incidents
                                             if i.startswith(("hang", "straggler"))],
                               "ettr": view.ettr, "nodes": len(view.nodes),
                               "tails": len(view.tails), "rank_lines": view.rank_lines}
for mode in MODES:
    out[mode] = {"wall_s": statistics.median(wall[mode]), "cpu_s": statistics.median(cpu[mode]),
                 "max_wall_s": max(wall[mode]), "render_cpu_s": statistics.median(render[mode])}
out["lines"] = len(text["head"].splitlines())
out["same_text"] = text["head"] == text["full"]
print(json.dumps(out))
"""


def _child_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def measure_cli(run_dir: Path, env: dict[str, str], *, repeat: int) -> dict[str, Any]:
    """``hpcrun status --no-reconcile``, whole processes: the default text and ``--ranks all``
    (every rank parsed), interleaved; median wall and CPU seconds."""
    wall: dict[str, list[float]] = {"named": [], "all": []}
    cpu: dict[str, list[float]] = {"named": [], "all": []}
    rc = 0
    for i in range(repeat + 1):
        for ranks in wall:
            t0, c0 = time.perf_counter(), _child_cpu_s()
            cli = subprocess.run([sys.executable, "-m", "hpcrun.cli.main", "status", str(run_dir),
                                  "--no-reconcile", "--ranks", ranks], capture_output=True,
                                 text=True, env=env, check=False)
            if i > 0:  # the first of each writes its bytecode cache
                wall[ranks].append(time.perf_counter() - t0)
                cpu[ranks].append(_child_cpu_s() - c0)
            rc = rc or cli.returncode
    return {"rc": rc, **{f"{k}_wall_s": statistics.median(v) for k, v in wall.items()},
            **{f"{k}_cpu_s": statistics.median(v) for k, v in cpu.items()}}


def measure_status(run_dir: Path, *, repeat: int) -> dict[str, Any]:
    """The status view in fresh processes: the default (the summary's head) and every rank's
    row (``--json``, ``--ranks all``, and every status before the head), interleaved."""
    # as installed: with a bytecode cache (a fresh process would otherwise compile every
    # module it imports, a second of CPU that no installed hpcrun spends)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(XDG_CACHE_HOME=str(run_dir.parent / "cache"),
               PYTHONPYCACHEPREFIX=str(run_dir.parent / "pycache"))
    subprocess.run([sys.executable, "-c", _CHILD, str(run_dir), str(T0 + 3610.0), "1", "head"],
                   capture_output=True, check=True, env=env)
    result: dict[str, Any] = {}
    for first in ("full", "head"):  # each mode's first read in a process of its own
        out = subprocess.run([sys.executable, "-c", _CHILD, str(run_dir), str(T0 + 3610.0),
                              str(repeat), first], capture_output=True, text=True, check=True,
                             env=env)
        child = json.loads(out.stdout)
        result[f"first_{first}_s"], result[f"first_{first}_cpu_s"] = (child["first_s"],
                                                                    child["first_cpu_s"])
        result.update({k: v for k, v in child.items() if not k.startswith("first")})
    result["cli"] = measure_cli(run_dir, env, repeat=CLI_REPEAT)
    result["repeat"], result["cli_repeat"] = repeat, CLI_REPEAT
    return result


def print_status(st: dict[str, Any]) -> None:
    """One line per measure, CPU time beside wall time (the machine is shared)."""
    head, full, cli = st["head"], st["full"], st["cli"]
    print(f"status view (median of {st['repeat']}, interleaved; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):\n"
          f"  repeated: head {head['cpu_s']*1e3:.1f} ms CPU ({head['wall_s']*1e3:.1f} ms wall, "
          f"max {head['max_wall_s']*1e3:.0f}), every rank {full['cpu_s']*1e3:.1f} ms CPU "
          f"({full['wall_s']*1e3:.1f} ms wall); target 50\n"
          f"  first read (fresh process and record): head {st['first_head_cpu_s']*1e3:.1f} ms "
          f"CPU ({st['first_head_s']*1e3:.0f} ms wall), every rank "
          f"{st['first_full_cpu_s']*1e3:.1f} ms CPU ({st['first_full_s']*1e3:.0f} ms wall); "
          f"target 300\n"
          f"  text rendering: head {head['render_cpu_s']*1e3:.2f} ms CPU, every rank "
          f"{full['render_cpu_s']*1e3:.2f} ms CPU; {st['lines']} lines, the same text: "
          f"{st['same_text']}\n"
          f"  `hpcrun status --no-reconcile`, whole process (median of {st['cli_repeat']}): "
          f"{cli['named_cpu_s']*1e3:.0f} ms CPU ({cli['named_wall_s']*1e3:.0f} ms wall); "
          f"`--ranks all` {cli['all_cpu_s']*1e3:.0f} ms CPU ({cli['all_wall_s']*1e3:.0f} ms "
          f"wall); rc {cli['rc']}", flush=True)
    view = st["head_view"]
    print(f"  named: {view['incidents']}; ETTR {view['ettr']:.3f}; {view['nodes']} nodes, "
          f"{view['tails']} of {view['rank_lines']} rank lines parsed", flush=True)


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
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--report-nodes", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--status-only", type=Path, default=None, metavar="RUN_DIR",
                    help="Only measure status on a run this benchmark wrote and folded before.")
    args = ap.parse_args()
    if args.status_only is not None:
        print_status(measure_status(args.status_only, repeat=args.repeat))
        return
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
        print_status(measure_status(run_dir, repeat=args.repeat))
        for n in args.report_nodes:
            rep = measure_report(Path(tmp) / f"report-{n}", nodes=n, k=k, hours=args.hours,
                                 step_s=args.step_s)
            print(f"report, {n} nodes ({rep['events']:,} events): read {rep['read_s']:.1f} s + "
                  f"build {rep['build_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
