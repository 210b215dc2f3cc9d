"""Debris in a run's log (garbage, a directory at a slot, a slot far past the end) never wedges
the run: readers and the claim agree on the slots, status names it once, doctor moves it aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.control.doctor import find_debris
from hpcrun.control.log import DebrisKind, EntryKind, RunLog, view_slots
from hpcrun.control.record import create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.observe.collect import collect_status
from hpcrun.observe.status import render_text, status_json


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    run_dir = create_run(tmp_path, spec, run_id="t-1")
    log = RunLog(run_dir)
    fence = log.claim("agent-1")
    log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                payload={"state": "STARTING"})
    return run_dir


def _garbage_far(run_dir: Path) -> str:
    (run_dir / "log" / "999999999.json").write_bytes(b"\x00\xffnot an entry")
    return "999999999.json"


def _garbage_next(run_dir: Path) -> str:
    (run_dir / "log" / "000000003.json").write_text('{"half": ')
    return "000000003.json"


def _directory_next(run_dir: Path) -> str:
    (run_dir / "log" / "000000003.json").mkdir()
    return "000000003.json"


def _directory_far(run_dir: Path) -> str:
    (run_dir / "log" / "000500000.json").mkdir()
    return "000500000.json"


def _bad_name(run_dir: Path) -> str:
    (run_dir / "log" / "1000000000.json").write_text("{}")
    return "1000000000.json"


DEBRIS = {"garbage far past the end": (_garbage_far, DebrisKind.BEYOND_END),
          "garbage at the next slot": (_garbage_next, DebrisKind.MALFORMED),
          "a directory at the next slot": (_directory_next, DebrisKind.NOT_A_FILE),
          "a directory far past the end": (_directory_far, DebrisKind.BEYOND_END),
          "a ten-digit slot name": (_bad_name, DebrisKind.BAD_NAME)}


def test_view_slots_splits_the_log_from_what_lies_beyond() -> None:
    view = view_slots(["000000000.json", "000000001.json", "000000003.json", ".x.new",
                       "000999999.json", "001000000.json", "12.json", "notes.txt"])
    assert [s for s, _ in view.slots] == [0, 1, 3]  # a small hole is still the log
    assert view.last_slot == 3
    assert {d.name: d.kind for d in view.debris} == {
        "000999999.json": DebrisKind.BEYOND_END, "001000000.json": DebrisKind.BEYOND_END,
        "12.json": DebrisKind.BAD_NAME}


@pytest.mark.parametrize("case", DEBRIS)
def test_a_claim_after_debris_succeeds_and_the_record_reads(run_dir: Path, case: str) -> None:
    make, kind = DEBRIS[case]
    name = make(run_dir)
    record = read_record(run_dir)  # never "check that the tier is mounted"
    assert record.state == "STARTING" and record.generation == 1
    log = RunLog(run_dir)
    fence = log.claim("agent-2")  # StaleGenerationError here used to wedge the run for good
    log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                payload={"state": "STARTING"})
    record = read_record(run_dir)
    assert record.generation == 2 and record.holder == "agent-2"
    [debris] = [d for d in find_debris(run_dir) if d.name == name]
    assert debris.kind == kind
    assert name in record.log_debris


@pytest.mark.parametrize("case", DEBRIS)
def test_status_names_debris_and_it_is_reported_once(run_dir: Path, case: str) -> None:
    name = DEBRIS[case][0](run_dir)
    for _ in range(3):
        view = collect_status(run_dir).view
    notes = [e for e in RunLog(run_dir).read() if e.kind == EntryKind.NOTE
             and e.payload.get("event") == "log_debris"]
    assert [n.payload["name"] for n in notes] == [name]
    text = render_text(view)
    assert f"log debris: log/{name}: " in text and "hpcrun doctor t-1" in text
    body = json.loads(json.dumps(status_json(view), default=str))
    assert any(f"log/{name}" in i for i in body["incidents"])
    assert body["facts"]["log_debris"] == [f"log/{name}: {notes[0].payload['detail']}"]


def test_messages_name_what_was_found(run_dir: Path) -> None:
    names = [_garbage_far(run_dir), _directory_next(run_dir), _bad_name(run_dir)]
    found = {d.name: d.detail for d in find_debris(run_dir)}
    assert sorted(found) == sorted(names)
    assert found["999999999.json"].startswith("slot 999999999 lies 999999996 slots past the "
                                              "log's last slot 3")
    assert found["000000003.json"].startswith("a directory at a slot, not an entry file")
    assert "not a slot name" in found["1000000000.json"]
    (run_dir / "log" / "000000003.json").rmdir()
    _garbage_next(run_dir)
    [garbage] = [d for d in find_debris(run_dir) if d.name == "000000003.json"]
    assert garbage.detail.startswith("9 bytes that are not a log entry")


def _cli(argv: list[str], answer: str = "") -> str:
    result = CliRunner().invoke(cli, argv, input=answer)
    assert result.exit_code == 0, result.output
    return result.output


def test_doctor_moves_debris_aside_after_confirming(run_dir: Path) -> None:
    names = [_garbage_far(run_dir), _garbage_next(run_dir), _bad_name(run_dir)]
    read_record(run_dir)
    out = _cli(["doctor", str(run_dir)], "n\n")
    assert "nothing moved" in out and all(f"log/{n}" in out for n in names)
    assert all((run_dir / "log" / n).exists() for n in names)
    out = _cli(["doctor", str(run_dir)], "y\n")
    for n in names:
        assert not (run_dir / "log" / n).exists()
        assert (run_dir / "debris" / n).read_bytes()  # moved, not deleted
        assert f"moved log/{n} -> {run_dir / 'debris' / n}" in out
    log = RunLog(run_dir)
    log.read()
    assert log.debris == [] and find_debris(run_dir) == []
    assert read_record(run_dir).log_debris == {}
    assert "log debris" not in render_text(collect_status(run_dir).view)
    fence = log.claim("agent-2")
    assert read_record(run_dir).generation == fence.generation == 2
    assert "the log holds no debris" in _cli(["doctor", str(run_dir), "--yes"])
