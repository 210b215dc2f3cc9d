"""``make bench`` / ``python -m benchmarks``: every comparison side by side, in one run.

    python -m benchmarks [--quick] [--only ckpt fsdp drain partner data ops restart scale]
                         [--repeats N]
                         [--sizes 1 4] [--dir /var/tmp] [--out benchmarks/results]

Writes ``<out>/<date>.json`` (every sample, medians, ratios, the machine) and ``<out>/<date>.md``
(the tables, each target marked met or not). ``--quick`` shrinks sizes and repeats for a smoke
run. See ``docs/performance.md`` for the method and what limits each number here.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

SECTIONS = ("ckpt", "fsdp", "drain", "partner", "data", "ops", "restart", "scale")


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--repeats-large", type=int, default=3,
                    help="repeats for checkpoint sizes above 2 GiB (each takes minutes)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1.0, 4.0],
                    help="checkpoint state sizes in GiB")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 64, 1024, 16384],
                    help="simulated gang sizes for the scale benchmark")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                    help="directory on the disk to measure (scratch is removed afterwards)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.sizes, args.ranks = 1, [0.125], [1, 64, 1024]
    return args


def _ckpt(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_ckpt

    for size in args.sizes:
        name = f"ckpt_{size:g}gib"
        with harness.section(results, name) as out, \
                tempfile.TemporaryDirectory(prefix="hpcrun-bench-", dir=args.dir) as tmp:
            reps = args.repeats if size <= 2 else min(args.repeats, args.repeats_large)
            out.update(suite_ckpt.run_size(size, Path(tmp), reps))
        md += suite_ckpt.render(name, results[name])


def _fsdp(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_fsdp

    with harness.section(results, "fsdp") as out:
        out.update(suite_fsdp.run(min(args.sizes[0], 1.0), 4, args.repeats, args.dir))
    md += suite_fsdp.render(results["fsdp"])


def _drain(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_drain

    with harness.section(results, "drain") as out:
        out.update(suite_drain.run(min(args.sizes[0], 1.0)))
    md += suite_drain.render(results["drain"])


def _partner(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_partner

    with harness.section(results, "partner") as out:
        out.update(suite_partner.run(min(args.sizes[0], 1.0), args.repeats))
    md += suite_partner.render(results["partner"])


def _data(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_data

    with harness.section(results, "data") as out:
        out.update(suite_data.run(args.repeats))
    md += suite_data.render(results["data"])


def _ops(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_ops

    with harness.section(results, "ops") as out:
        out.update(suite_ops.run(max(5, args.repeats)))
    md += suite_ops.render(results["ops"])


def _restart(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks import suite_restart

    with harness.section(results, "restart") as out:
        out.update(suite_restart.run(args.repeats))
    md += suite_restart.render(results["restart"])


def _scale(args: argparse.Namespace, results: dict[str, Any], md: list[str]) -> None:
    from benchmarks.scale.__main__ import render, run

    with harness.section(results, "scale") as out:
        out["rows"] = run(args.ranks, tensors=800)
    rows = results["scale"].get("rows")
    md += ["### Scale: the real Checkpointer in a simulated gang (800 dim-0 sharded tensors, "
           "8 ranks per node)", "",
           render(rows) if rows else f"failed: {results['scale'].get('error')}", ""]


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    t0 = time.perf_counter()
    results: dict[str, Any] = {"machine": harness.machine(), "args": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    md = ["# hpcrun benchmarks", ""]
    steps = {"ckpt": _ckpt, "fsdp": _fsdp, "drain": _drain, "partner": _partner, "data": _data,
             "ops": _ops, "restart": _restart, "scale": _scale}
    for name in SECTIONS:
        if name in args.only:
            steps[name](args, results, md)
    results["wall_s"] = time.perf_counter() - t0
    results["machine"]["loadavg_end"] = os.getloadavg()
    m = results["machine"]
    md[1:1] = [f"{m['cpus']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB, Linux {m['kernel']}, "
               f"Python {m['python']}, torch {m['torch']}; load average "
               f"{m['loadavg_start'][0]:.1f} at start, {m['loadavg_end'][0]:.1f} at end; "
               f"wall time {results['wall_s'] / 60:.1f} min", ""]
    text = "\n".join(md)
    js, mdp = harness.write_results(results, text, args.out)
    print(text)
    print(f"\nwrote {js} and {mdp} in {results['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
