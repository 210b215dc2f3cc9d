"""The shared seams: durable exclusive create, the append-only log under concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.errors import RecordError, StaleGenerationError
from hpcrun.storage import CountingStorage, LocalStorage


def test_create_exclusive_refuses_a_taken_name_and_keeps_the_first_bytes(tmp_path: Path) -> None:
    st = LocalStorage()
    assert st.create_exclusive(tmp_path / "a", b"first")
    assert not st.create_exclusive(tmp_path / "a", b"second")
    assert (tmp_path / "a").read_bytes() == b"first"
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no temp debris left behind


def _append_many(run_dir: str, writer: int, n: int) -> None:
    log = RunLog(run_dir)
    for i in range(n):
        log.append(EntryKind.NOTE, generation=-1, holder="", payload={"w": writer, "i": i})


def test_concurrent_writers_never_overwrite_each_other(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    entries = RunLog(tmp_path).read()
    assert [e.slot for e in entries] == list(range(160))
    seen = sorted((e.payload["w"], e.payload["i"]) for e in entries)
    assert seen == [(w, i) for w in range(4) for i in range(40)]
    for w in range(4):  # each writer's own entries keep their order
        mine = [e.payload["i"] for e in entries if e.payload["w"] == w]
        assert mine == list(range(40))


def test_malformed_entry_is_skipped_and_reported(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    log.append(EntryKind.NOTE, generation=-1, holder="", payload={"ok": 1})
    (tmp_path / "log" / "000000001.json").write_bytes(b'{"kind": 3')
    log.append(EntryKind.NOTE, generation=-1, holder="", payload={"ok": 2})
    entries = log.read()
    assert [e.payload["ok"] for e in entries] == [1, 2]
    assert log.skipped == [1]


def test_reading_a_directory_without_a_log_says_how_to_find_runs(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="hpcrun list"):
        RunLog(tmp_path).read()


def test_a_stale_publish_after_a_new_fence_is_void_and_the_writer_is_told(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    old = log.claim("old")
    log.publish(EntryKind.PROGRESS, generation=old.generation, holder="old", payload={"step": 1})
    new = log.claim("new")
    with pytest.raises(StaleGenerationError, match="void"):
        log.publish(EntryKind.PROGRESS, generation=old.generation, holder="old",
                    payload={"step": 2})
    fence, valid = fold_fences(log.read())
    assert (fence.generation, fence.holder) == (new.generation, "new")
    assert [e.payload.get("step") for e in valid if e.kind == EntryKind.PROGRESS] == [1]


def test_counting_storage_counts_metadata_operations(tmp_path: Path) -> None:
    st = CountingStorage(LocalStorage())
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path, storage=st)
    log.append(EntryKind.NOTE, generation=-1, holder="", payload={})
    assert st.counts["create_exclusive"] == 1
    assert st.counts["listdir"] >= 1


def test_a_rank_seeded_with_its_agents_log_copy_opens_only_newer_slots(tmp_path: Path) -> None:
    from hpcrun.control.log import read_log_copy, write_log_copy

    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    fence = log.claim("h")
    for i in range(20):
        log.append(EntryKind.PROGRESS, generation=fence.generation, holder="h",
                   payload={"step": i})
    agent_read = RunLog(tmp_path).read()
    write_log_copy(tmp_path / "node-local" / "n0.json", agent_read)
    assert (tmp_path / "node-local" / "n0.json").stat().st_mode & 0o777 == 0o600
    log.append(EntryKind.NOTE, generation=fence.generation, holder="h", payload={"x": 1})
    st = CountingStorage(LocalStorage())
    rank = RunLog(tmp_path, storage=st)
    rank.seed(read_log_copy(tmp_path / "node-local" / "n0.json"))
    for _ in range(3):  # cadence, restore, partner copies
        got = rank.read()
    assert [e.to_bytes() for e in got] == [e.to_bytes() for e in RunLog(tmp_path).read()]
    assert st.counts["read_bytes"] == 1  # the one entry newer than the copy, once
    assert st.total_meta_ops() == 3 + 1  # three listings and that open
    assert read_log_copy(tmp_path / "missing.json") == []


def test_what_precedes_a_ranks_fence_comes_from_its_agents_copy_without_a_listing(
        tmp_path: Path) -> None:
    """A rank's start (its cadence history and its restore) needs only the entries below its
    incarnation's fence, all in the copy its agent left: no listing, nothing opened. A copy
    with a gap (a slot the agent could not read) falls back to the shared log."""
    from hpcrun.control.log import read_log_copy, write_log_copy

    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    old = log.claim("h1")
    for i in range(5):
        log.append(EntryKind.PROGRESS, generation=old.generation, holder="h1",
                   payload={"step": i})
    fence = log.claim("h2")
    write_log_copy(tmp_path / "copy.json", RunLog(tmp_path).read())
    log.append(EntryKind.NOTE, generation=fence.generation, holder="h2", payload={"x": 1})
    whole = RunLog(tmp_path).read()
    st = CountingStorage(LocalStorage())
    rank = RunLog(tmp_path, storage=st)
    rank.seed(read_log_copy(tmp_path / "copy.json"))
    got = rank.read_before(fence.slot)
    assert [e.to_bytes() for e in got] == [e.to_bytes() for e in whole if e.slot < fence.slot]
    assert st.total_meta_ops() == 0
    gap = RunLog(tmp_path, storage=st)
    gap.seed([e for e in read_log_copy(tmp_path / "copy.json") if e.slot != 2])
    assert [e.slot for e in gap.read_before(fence.slot)] == list(range(fence.slot))
    # one listing; the missing slot and the entry newer than the copy opened
    assert st.counts["listdir"] == 1 and st.counts["read_bytes"] == 2
    assert [e.slot for e in RunLog(tmp_path).read_before(-1)] == [e.slot for e in whole]


def test_metadata_costs_match_the_calls_local_storage_makes(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             ) -> None:
    import os as real_os

    from hpcrun import storage
    from hpcrun.storage import META_COST

    made: list[str] = []

    class Os:
        def __getattr__(self, name: str) -> object:
            attr = getattr(real_os, name)
            if name in ("open", "fsync", "replace", "link", "unlink", "remove", "listdir",
                        "makedirs", "stat"):
                def counted(*a: object, **k: object) -> object:
                    made.append(name)
                    return attr(*a, **k)
                return counted
            return attr

    monkeypatch.setattr(storage, "os", Os())
    as_meta = {"open": "open", "fsync": "fsync", "replace": "rename", "link": "rename",
               "unlink": "unlink", "remove": "unlink", "listdir": "listdir",
               "makedirs": "mkdir", "stat": "stat"}
    local = LocalStorage()
    calls = {"create_exclusive": lambda: local.create_exclusive(tmp_path / "a", b"x"),
             "write_atomic": lambda: local.write_atomic(tmp_path / "b", b"y"),
             "replace_bytes": lambda: local.replace_bytes(tmp_path / "e", b"z"),
             "listdir": lambda: local.listdir(tmp_path), "size": lambda: local.size(tmp_path / "a"),
             "makedirs": lambda: local.makedirs(tmp_path / "d"),
             "rename": lambda: local.rename(tmp_path / "b", tmp_path / "c"),
             "fsync_path": lambda: local.fsync_path(tmp_path), "remove": lambda: local.remove(
                 tmp_path / "c")}
    for name, call in calls.items():
        made.clear()
        call()
        counted: dict[str, int] = {}
        for m in made:
            counted[as_meta[m]] = counted.get(as_meta[m], 0) + 1
        assert counted == {str(k): v for k, v in META_COST[name].items()}, name
