"""The incremental event summary gives status the same figures as reading every event."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.observe.ettr import compute_ettr, gang_steps
from hpcrun.observe.events import event_path
from hpcrun.observe.status import input_wait_fraction
from hpcrun.observe.stragglers import step_times_from_events
from hpcrun.observe.summary import EventSummary, cached_summary, summarize_events
from hpcrun.protocols import Event
from tests.unit.observe.builders import ev, span, step, two_generation_log

_KINDS = st.sampled_from(["step", "step", "step", "ckpt_stage", "ckpt_write", "restore",
                          "input_wait", "state", "fault"])


@st.composite
def events(draw: st.DrawFn) -> list[Event]:
    out = []
    for i in range(draw(st.integers(1, 60))):
        kind, gen = draw(_KINDS), draw(st.integers(1, 3))
        start = gen * 1000.0 + draw(st.floats(0, 500, allow_nan=False))
        end = start + draw(st.floats(0, 20, allow_nan=False))
        rank, n = draw(st.integers(0, 3)), draw(st.integers(0, 12))
        if kind == "step":
            out.append(step(n, start, end, input_wait_s=draw(st.floats(0, 2)), gen=gen,
                            rank=rank, node=f"n{rank // 2}", tokens=draw(st.integers(0, 99))))
        elif kind == "state":
            out.append(ev("state", start, gen=gen, rank=-1, state="STARTING", nodes=2))
        else:
            out.append(span(kind, start, end, n, gen=gen, rank=rank, blocking=i % 2 == 0))
    return sorted(out, key=lambda e: (e.ts, e.rank))


def _same(summary: EventSummary, evs: list[Event]) -> None:
    assert summary.gang_steps() == gang_steps(evs)
    want = compute_ettr(evs) if evs else None
    from hpcrun.observe.ettr import ettr_from_parts

    got = ettr_from_parts(summary.allocations(), summary.gang_steps(), summary.span_intervals())
    assert want is not None and got.to_dict() == want.to_dict()
    for gen in (None, 1, 2):
        assert summary.rank_step_times(gen) == step_times_from_events(evs, generation=gen)
    assert summary.input_wait_fraction() == input_wait_fraction(evs)


@settings(max_examples=80, deadline=None)
@given(events())
def test_the_fold_gives_the_figures_of_the_full_event_list(evs: list[Event]) -> None:
    _same(summarize_events(evs), evs)


def test_the_fold_survives_its_json_form() -> None:
    evs = two_generation_log()
    s = summarize_events(evs)
    back = EventSummary.from_json(json.loads(json.dumps(s.to_json())))
    _same(back, evs)


def _write(run_dir: Path, evs: list[Event], *, mode: str = "a") -> None:
    for e in evs:
        path = event_path(run_dir, node=e.node, rank=e.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, mode) as f:
            f.write(e.to_json() + "\n")


def test_status_reads_only_appended_bytes_and_rebuilds_when_a_file_is_replaced(
        tmp_path: Path) -> None:
    run_dir, cache = tmp_path / "run", tmp_path / "cache.json"
    first = [step(i, 10.0 * i, 10.0 * i + 9, rank=r, node="n0") for i in range(5) for r in (0, 1)]
    _write(run_dir, first)
    assert cached_summary(run_dir, cache=cache).gang_steps() == gang_steps(first)

    more = [step(i, 10.0 * i, 10.0 * i + 9, rank=r, node="n0") for i in range(5, 8)
            for r in (0, 1)]
    _write(run_dir, more)
    torn = event_path(run_dir, node="n0", rank=0)
    with open(torn, "a") as f:
        f.write('{"kind": "step", "ts": 99')  # a writer still mid-line: read once it is whole
    files = json.loads(cache.read_text())["files"]
    s = cached_summary(run_dir, cache=cache)
    assert s.gang_steps() == gang_steps(first + more)
    assert s.events == len(first + more)
    grown = json.loads(cache.read_text())["files"]
    assert all(grown[k][2] > files[k][2] for k in files)  # offsets moved past the new lines
    assert grown["events/n0/rank-00000.jsonl"][2] < torn.stat().st_size  # not past the torn one

    replaced = [step(0, 1.0, 2.0, rank=0, node="n0")]
    torn.unlink()
    _write(run_dir, replaced, mode="w")
    rank1 = [e for e in first + more if e.rank == 1]
    assert cached_summary(run_dir, cache=cache).gang_steps() == gang_steps(
        sorted(replaced + rank1, key=lambda e: (e.ts, e.rank)))


def test_a_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    run_dir, cache = tmp_path / "run", tmp_path / "cache.json"
    evs = two_generation_log()
    _write(run_dir, evs)
    cache.write_text('{"schema_version": 1, "run_dir": "' + str(run_dir.resolve()) + '", "fi')
    assert cached_summary(run_dir, cache=cache).gang_steps() == gang_steps(evs)
    cache.write_text(json.dumps({"schema_version": 1, "run_dir": str(run_dir.resolve()),
                                 "files": {}, "summary": {"steps": [[1]]}}))
    assert cached_summary(run_dir, cache=cache).gang_steps() == gang_steps(evs)
