"""Reads a sweep's points for ``hpcrun status SWEEP`` (effectful: records, events, logs).

The rows and their rendering are pure (:mod:`hpcrun.observe.campaign`); this module only reads
each point's record, its folded events (ETTR) and rank 0's newest loss.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcrun.control.record import read_record
from hpcrun.control.sweep import SweepIndex
from hpcrun.errors import HpcrunError
from hpcrun.observe.campaign import PointRow
from hpcrun.observe.collect import tail_lines
from hpcrun.observe.figures import run_figures
from hpcrun.observe.summary import cached_summary


def point_rows(sweep_dir: Path, index: SweepIndex) -> list[PointRow]:
    """Each point's row, in array task order (an unreadable point shows as UNKNOWN)."""
    rows = []
    for point, run_dir in zip(index.points, index.run_dirs(sweep_dir), strict=True):
        what = " ".join(f"{k}={v}" for k, v in point.overrides.items())
        try:
            rec = read_record(run_dir)
        except HpcrunError:
            rows.append(PointRow(index=point.index, run_id=point.run_id, overrides=what,
                                 state="UNKNOWN", step=0, loss=None, ettr=None))
            continue
        figures = run_figures(cached_summary(run_dir))
        rows.append(PointRow(index=point.index, run_id=point.run_id, overrides=what,
                             state=str(rec.state), step=rec.step, loss=last_loss(run_dir),
                             ettr=figures.ettr if figures is not None else None))
    return rows


def last_loss(run_dir: Path) -> float | None:
    """The newest ``loss`` of rank 0's step events, when it reported one."""
    for path in sorted((run_dir / "events").glob("*/rank-00000*.jsonl")):
        for line in reversed(tail_lines(path, 20)):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            loss = event.get("loss") if isinstance(event, dict) else None
            if event.get("kind") == "step" and isinstance(loss, int | float):
                return float(loss)
    return None
