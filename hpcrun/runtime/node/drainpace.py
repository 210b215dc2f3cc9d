"""The node drainer's pace: step periods from the node's rank heartbeats, lowest priority.

Ranks leave a heartbeat (last step, its wall time) in a node-local directory every half
second; the agent already folds them into the node's heartbeat. The drainer reads the same
files: between two reads, a rank that went from step ``s0`` at ``t0`` to ``s1`` at ``t1`` ran
``(t1 - t0) / (s1 - s0)`` seconds per step, averaged over every step in between (one slow step
does not flap the rate, and input waits and stalls count). :func:`start_background_drain`
makes the drainer process lowest-priority and paces its copies by these periods
(:mod:`hpcrun.checkpoint.pacing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcrun.checkpoint.pacing import PacePolicy, Priority, run_in_background
from hpcrun.observe.heartbeat import RankBeat, read_rank_beats

__all__ = ["HeartbeatPeriods", "drain_heartbeat_dir", "start_background_drain", "step_periods"]


def drain_heartbeat_dir(node_local_root: Path, run_id: str, node: str) -> Path:
    """Where ``node``'s ranks leave heartbeats (``Incarnation.heartbeat_dir``'s rule)."""
    return Path(node_local_root) / run_id / "hb" / node


def step_periods(last: Mapping[int, tuple[int, float]], beats: Mapping[int, RankBeat]
                 ) -> tuple[list[float], dict[int, tuple[int, float]]]:
    """Seconds per step of every rank that advanced since ``last`` (pure), and the new marks.

    A rank whose step went backwards (a restart restored an older step) only sets its mark.
    """
    periods: list[float] = []
    marks = dict(last)
    for rank, beat in beats.items():
        prev = last.get(rank)
        if prev is not None and beat.step > prev[0] and beat.ts > prev[1]:
            periods.append((beat.ts - prev[1]) / (beat.step - prev[0]))
        if prev is None or beat.step != prev[0]:
            marks[rank] = (beat.step, beat.ts)
    return periods, marks


class HeartbeatPeriods:
    """:data:`~hpcrun.checkpoint.pacing.StepPeriods` from a heartbeat directory."""

    def __init__(self, hb_dir: Path) -> None:
        self.hb_dir = Path(hb_dir)
        _, self._marks = step_periods({}, read_rank_beats(self.hb_dir))

    def __call__(self) -> list[float]:
        periods, self._marks = step_periods(self._marks, read_rank_beats(self.hb_dir))
        return periods


def start_background_drain(node_local_root: Path, run_id: str, node: str,
                           policy: PacePolicy | None = None) -> Priority:
    """Lowest priority for this drainer process, and its copies paced by the steps of
    ``node``'s ranks (their heartbeats under ``node_local_root`` for run ``run_id``)."""
    hb_dir = drain_heartbeat_dir(node_local_root, run_id, node)
    priority, _ = run_in_background(HeartbeatPeriods(hb_dir), policy)
    return priority
