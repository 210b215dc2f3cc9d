"""Scale simulation of the checkpoint protocols: ``python -m benchmarks.scale``.

    python -m benchmarks.scale [--ranks 1 64 1024 16384] [--real-up-to 64] [--json out.json]

Gangs up to ``--real-up-to`` ranks write real HDF5 shards; larger ones run on the in-memory
storage with the calibrated shard-write operations (see ``benchmarks/scale/sim.py``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.scale.sim import ScaleConfig, simulate

COORDINATOR_TARGET_S = 1.0
RESTART_BUDGET = (("detect", 15.0, "hpcrun: heartbeat/hang and exit detection by the node-0 agent"),
                  ("node swap", 10.0, "Slurm (spare nodes in the allocation, or requeue)"),
                  ("pod/process init", 5.0, "hpcrun: agent respawn of rank processes"),
                  ("sharded load 30 GB at 2 GB/s", 15.0, "hpcrun: restore (bytes: the tier)"),
                  ("process-group init", 10.0, "torch.distributed rendezvous (hpcrun: port)"))


def run(ranks: list[int], *, real_up_to: int, tensors: int) -> list[dict[str, Any]]:
    """Simulate one checkpoint per gang size; each row is printed as it completes."""
    rows = []
    for n in ranks:
        row = simulate(ScaleConfig(ranks=n, tensors=tensors, real_files=n <= real_up_to))
        print(f"scale: {n} ranks done in {row['sim_wall_s']:.1f} s", flush=True)
        rows.append(row)
    return rows


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def render(rows: list[dict[str, Any]]) -> str:
    """The scale table in Markdown, with the targets marked."""
    lines = ["| ranks | nodes | mode | datasets | files | dirs | metadata ops (per rank) | "
             "top manifest | sub-manifests | node agent (median) | coordinator verify+publish"
             " | receive summaries | flat commit (one process) | restore: shard files per rank"
             " / max opens of one file |", "|" + "---|" * 14]
    for r in rows:
        ops = r["metadata_ops_per_rank"] * r["ranks"]
        lines.append(
            f"| {r['ranks']} | {r['nodes']} | {r['mode']} | {r['datasets']:,} | {r['files']:,} |"
            f" {r['dirs']:,} | {ops:,.0f} ({r['metadata_ops_per_rank']:.2f}) |"
            f" {r['top_manifest_bytes'] / 1e3:,.1f} kB | {r['sub_manifest_bytes'] / 1e6:,.1f} MB |"
            f" {_fmt_s(r['node_agent_s_median'])} | {_fmt_s(r['verify_publish_s'])} |"
            f" {_fmt_s(r['receive_s'])} | {_fmt_s(r['flat_commit_s'])} |"
            f" {r['shard_files_per_rank_max']} / {r['max_opens_of_one_shard']} |")
    return "\n".join([*lines, "", *verdicts(rows)])


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Each scale target, met or not, from the rows."""
    rows = sorted(rows, key=lambda r: r["ranks"])
    big = rows[-1]
    per_rank = [r["metadata_ops_per_rank"] for r in rows]
    coord = big["verify_publish_s"] + big["receive_s"]
    return [
        f"- metadata ops per rank {per_rank[0]:.2f} at {rows[0]['ranks']} ranks, "
        f"{per_rank[-1]:.2f} at {big['ranks']} (at most linear in ranks, constant "
        f"≤ {max(per_rank):.1f}): {'met' if per_rank[-1] <= 1.05 * per_rank[0] else 'NOT met'}",
        f"- directories = nodes + 2 at every size: "
        f"{'met' if all(r['dirs'] == r['nodes'] + 2 for r in rows) else 'NOT met'}",
        f"- coordinator receive + verify + publish at {big['ranks']} ranks / {big['nodes']} "
        f"nodes: {_fmt_s(coord)} (target < 1 s): "
        f"{'met' if coord < COORDINATOR_TARGET_S else 'NOT met'}",
        f"- restore: each rank opens {big['shard_files_per_rank_max']} shard file, no file is "
        f"opened by more than {big['max_opens_of_one_shard']} rank; a node leader opens 1 "
        "sub-manifest, rank 0 the top manifest once: "
        f"{'met' if big['max_opens_of_one_shard'] == 1 else 'NOT met'}",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 64, 1024, 16384])
    ap.add_argument("--real-up-to", type=int, default=64)
    ap.add_argument("--tensors", type=int, default=800)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = run(args.ranks, real_up_to=args.real_up_to, tensors=args.tensors)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
