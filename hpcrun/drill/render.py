"""Plain-text tables for drill, preflight and canary results (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcrun.drill.rto import PHASES, summarize

MATRIX_COLUMNS = ("exit", "recovery", "state", "rpo", "samples", "cursor", "fencing",
                  "checkpoints")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A left-aligned text table with a rule under the header."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]])


def _verdict(result: Any) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[result.ok]


def matrix_table(results: Sequence[Any]) -> str:
    """One row per drilled fault: verdict, each contract's mark, RTO."""
    header = ["fault", "backend", "verdict", *MATRIX_COLUMNS, "rto_s"]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.row.fault.value, r.backend, "n/a", *["-"] * len(MATRIX_COLUMNS),
                         r.skipped])
            continue
        marks = [(c.mark if (c := r.contract(n)) is not None else "-") for n in MATRIX_COLUMNS]
        rto = max((s.total_s for s in r.splits), default=None)
        rows.append([r.row.fault.value, r.backend, _verdict(r), *marks,
                     f"{rto:.1f}" if rto is not None else "-"])
    return table(header, rows)


def detail_table(result: Any) -> str:
    """Every contract of one drill with its measured detail."""
    head = f"drill {result.row.fault.value} on {result.backend}: {_verdict(result)}"
    if result.skipped:
        return f"{head} ({result.skipped})"
    lines = [head, f"  run: {result.run_dir}", f"  injected: {result.inject or '(outside)'}"]
    rows = [[c.name, c.mark, c.detail] for c in result.contracts]
    return "\n".join(lines) + "\n" + table(["contract", "", "measured"], rows)


def rto_table(splits: Sequence[Any]) -> str:
    """Mean RTO split per cause."""
    summary = summarize(splits)
    header = ["cause", "n", *[p.replace("_", " ") for p in PHASES], "total"]
    rows = [[cause, f"{row['count']:.0f}", *[f"{row[p]:.1f}" for p in PHASES],
             f"{row['total']:.1f}"] for cause, row in summary.items()]
    return table(header, rows)


def check_table(checks: Sequence[Any]) -> str:
    """Preflight / canary / restore checks: name, verdict, measured."""
    return table(["check", "", "measured"],
                 [[c.name, c.mark, c.detail] for c in checks])
