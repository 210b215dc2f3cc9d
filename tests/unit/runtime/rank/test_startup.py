"""The start phase split: marks a rank records on its start path, parts the RTO tools print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcrun.drill.rto import rto_splits
from hpcrun.runtime.rank.startup import HANDED_AT_ENV, PARTS, StartMarks, rank_parts, start_parts

MARKS = {"handed": 100.5, "process": 100.6, "imports": 101.0, "groups": 102.0,
         "context": 102.25, "entrypoint": 102.5}


def test_each_part_runs_from_the_previous_mark_to_its_own() -> None:
    parts = rank_parts(MARKS, fence_ts=100.0, restore_begin=103.5)
    assert list(parts) == list(PARTS)
    assert parts == pytest.approx({"hand_off": 0.5, "process": 0.1, "imports": 0.4,
                                   "groups": 1.0, "context": 0.25, "entrypoint": 0.25,
                                   "user_setup": 1.0})


def test_a_missing_mark_leaves_out_the_parts_it_bounds() -> None:
    marks = {k: v for k, v in MARKS.items() if k != "handed"}  # not started by an agent
    parts = rank_parts(marks, fence_ts=100.0, restore_begin=None)
    assert "hand_off" not in parts and "process" not in parts and "user_setup" not in parts
    assert parts["groups"] == pytest.approx(1.0)


def _startup(rank: int, shift: float, generation: int = 2) -> dict[str, Any]:
    return {"kind": "startup", "generation": generation, "rank": rank, "ts": 102.5 + shift,
            "step": 0, "data": {"marks": {k: v + shift for k, v in MARKS.items()}}}


def _restore(rank: int, start: float, generation: int = 2) -> dict[str, Any]:
    return {"kind": "restore", "generation": generation, "rank": rank, "ts": start + 0.2,
            "step": 0, "data": {"start_ts": start, "dur_s": 0.2}}


def test_the_split_is_the_median_over_the_ranks_of_that_generation() -> None:
    events = [_startup(0, 0.0), _startup(1, 0.0), _startup(2, 2.0), _restore(0, 103.5),
              _restore(1, 103.5), _restore(2, 105.5), _startup(0, 50.0, generation=1)]
    parts = start_parts(events, 2, fence_ts=100.0)
    assert parts["hand_off"] == pytest.approx(0.5), "ranks 0 and 1 were handed at 0.5 s"
    assert parts["groups"] == pytest.approx(1.0) and parts["user_setup"] == pytest.approx(1.0)
    assert start_parts(events, 3) == {}


def test_marks_read_the_agents_hand_off_time_and_ignore_a_bad_one() -> None:
    assert StartMarks({HANDED_AT_ENV: "100.5"}, now=101.0).marks == {"handed": 100.5,
                                                                     "process": 101.0}
    assert StartMarks({HANDED_AT_ENV: "soon"}, now=101.0).marks == {"process": 101.0}


class _Writer:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, int, dict[str, Any]]] = []

    def emit(self, kind: str, step: int, **data: Any) -> None:
        self.emitted.append((kind, step, data))


def test_the_marks_go_out_as_one_startup_event_once_bound() -> None:
    marks, writer = StartMarks({}, now=1.0), _Writer()
    marks.emit()  # before the writer exists: nothing, no error
    marks.bind(writer)  # type: ignore[arg-type]
    marks.mark("entrypoint")
    marks.emit()
    assert [(k, s) for k, s, _ in writer.emitted] == [("startup", 0)]
    assert set(writer.emitted[0][2]["marks"]) == {"process", "entrypoint"}


def _entry(slot: int, kind: str, generation: int, ts: float, **payload: Any) -> dict[str, Any]:
    return {"slot": slot, "kind": kind, "generation": generation, "holder": f"h{generation}",
            "ts": ts, "payload": payload}


def test_the_rto_split_of_a_recovery_carries_its_start_parts(tmp_path: Path) -> None:
    entries = [_entry(0, "fence", 1, 10.0), _entry(1, "state", 1, 10.1, state="STARTING"),
               _entry(2, "fault", 1, 99.0, fault="process_crash"),
               _entry(3, "state", 1, 99.5, state="RECOVERING"),
               _entry(4, "fence", 2, 100.0), _entry(5, "state", 2, 100.0, state="STARTING"),
               _entry(6, "state", 2, 104.0, state="RUNNING", restored_step=50)]
    events = [_startup(0, 0.0), _restore(0, 103.5)]
    (split,) = rto_splits(entries, events)
    assert split.phases["start"] == pytest.approx(3.5)
    assert split.start_parts["groups"] == pytest.approx(1.0)
    assert sum(split.start_parts.values()) == pytest.approx(split.phases["start"])
