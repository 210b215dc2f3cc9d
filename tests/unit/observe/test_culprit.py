"""The culprit of a collective hang: sequence numbers, settled evidence, flight recorder dumps."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from hpcrun.observe.culprit import (
    Evidence,
    flight_culprit,
    lagging_ranks,
    load_plain_pickle,
    name_culprit,
    parse_flight_dump,
    read_flight_dumps,
    settled_evidence,
)
from hpcrun.observe.heartbeat import NodeHeartbeat, RankBeat


def test_the_ranks_behind_the_others_are_named() -> None:
    assert lagging_ranks({0: 8, 1: 8, 2: 7, 3: 8}) == (2,)
    assert lagging_ranks({0: 9, 1: 7, 2: 7, 3: 8}) == (1, 2)  # a tie names both


def test_all_equal_or_a_lone_rank_names_nobody() -> None:
    assert lagging_ranks({0: 8, 1: 8, 2: 8}) == ()
    assert lagging_ranks({0: 3}) == ()
    assert lagging_ranks({}) == ()
    assert name_culprit({0: 4, 1: 4}, {0: "a", 1: "b"}, evidence=Evidence.SEQUENCE) is None


def test_the_culprit_carries_its_nodes_once_each() -> None:
    found = name_culprit({0: 5, 1: 5, 2: 4, 3: 4}, {0: "a", 1: "a", 2: "b", 3: "b"},
                         evidence=Evidence.SEQUENCE)
    assert found is not None
    assert (found.ranks, found.nodes, found.seq, found.ahead) == ((2, 3), ("b",), 4, 5)
    assert "rank 2, 3 on b did not arrive" in found.describe()


def _beat(rank: int, *, ts: float, seq: int | None) -> RankBeat:
    return RankBeat(rank=rank, step=15, ts=ts, step_time_s=0.1, pid=100 + rank, seq=seq)


def test_only_settled_numbers_are_evidence() -> None:
    """A node's beat taken right after a rank's last step may not show the collective it
    entered since: it is not evidence yet, and the evidence is not complete."""
    a = NodeHeartbeat(node="a", ts=110.0, ranks={0: _beat(0, ts=100.0, seq=31)})
    b = NodeHeartbeat(node="b", ts=101.0, ranks={1: _beat(1, ts=100.0, seq=30)})
    early = settled_evidence({"a": a, "b": b}, ("a", "b"))
    assert (dict(early.seqs), early.complete) == ({0: 31}, False)
    b = NodeHeartbeat(node="b", ts=106.0, ranks={1: _beat(1, ts=100.0, seq=30)})
    late = settled_evidence({"a": a, "b": b}, ("a", "b"))
    assert (dict(late.seqs), dict(late.rank_nodes), late.complete) == (
        {0: 31, 1: 30}, {0: "a", 1: "b"}, True)
    found = name_culprit(late.seqs, late.rank_nodes, evidence=Evidence.SEQUENCE)
    assert found is not None and (found.ranks, found.nodes) == ((1,), ("b",))


def test_a_gang_node_that_never_published_leaves_the_evidence_incomplete() -> None:
    a = NodeHeartbeat(node="a", ts=110.0, ranks={0: _beat(0, ts=100.0, seq=31)})
    assert not settled_evidence({"a": a}, ("a", "b")).complete
    no_seq = NodeHeartbeat(node="a", ts=110.0, ranks={0: _beat(0, ts=100.0, seq=None)})
    assert not settled_evidence({"a": no_seq}, ("a",)).complete


def _dump(seq: int, *, pg: str = "0") -> dict[str, object]:
    """A dump in the flight recorder's layout (torch 2.13, version 2.10)."""
    entry = {"frames": [{"name": "all_reduce", "filename": "c10d.py", "line": 1}],
             "record_id": seq - 1, "pg_id": int(pg), "process_group": (pg, "default_pg"),
             "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[4]],
             "state": "scheduled", "retired": False, "timeout_ms": 600000, "is_p2p": False,
             "time_discovered_started_ns": None}
    return {"version": "2.10", "pg_config": {pg: {"name": pg, "desc": "default_pg",
                                                  "ranks": "[0, 1]"}},
            "pg_status": {pg: {"last_enqueued_collective": seq, "last_started_collective": -1,
                               "last_completed_collective": seq - 1}},
            "entries": [entry]}


def test_a_pickled_dump_reads_its_last_collective() -> None:
    assert parse_flight_dump(pickle.dumps(_dump(12))) == {"0": 12}
    no_status = {k: v for k, v in _dump(12).items() if k != "pg_status"}
    assert parse_flight_dump(pickle.dumps(no_status)) == {"0": 12}


def test_the_json_form_reads_the_same() -> None:
    assert parse_flight_dump(json.dumps(_dump(7)).encode()) == {"0": 7}


class _Boom:
    """Unpickling this with a plain ``pickle.loads`` creates the file ``mark``."""

    def __init__(self, mark: Path) -> None:
        self.mark = str(mark)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.mark, "w"))


def test_a_malicious_dump_is_refused_and_never_executed(tmp_path: Path) -> None:
    mark = tmp_path / "executed"
    evil = pickle.dumps({"entries": [], "pg_status": {"0": {"last_enqueued_collective": 3}},
                         "x": _Boom(mark)})
    assert parse_flight_dump(evil) is None
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        load_plain_pickle(evil)
    assert not mark.exists()
    assert parse_flight_dump(b"\x80\x04garbage") is None
    assert parse_flight_dump(pickle.dumps([1, 2])) is None


def test_the_dumps_on_disk_name_the_rank_behind(tmp_path: Path) -> None:
    prefix = "nccl-trace-rank-"
    for rank, seq in {0: 41, 1: 40, 2: 41}.items():
        (tmp_path / f"{prefix}{rank}").write_bytes(pickle.dumps(_dump(seq)))
    (tmp_path / f"{prefix}x").write_bytes(b"ignored")
    (tmp_path / f"{prefix}3").write_bytes(pickle.dumps({"evil": _Boom(tmp_path / "ran")}))
    dumps = read_flight_dumps(tmp_path, prefix)
    assert sorted(dumps) == [0, 1, 2]
    found = flight_culprit(dumps, {0: "a", 1: "a", 2: "b"})
    assert found is not None and (found.ranks, found.nodes, found.evidence) == (
        (1,), ("a",), Evidence.FLIGHT_RECORDER)
    assert flight_culprit({0: {"0": 5}, 1: {"0": 5}}, {}) is None
    assert not (tmp_path / "ran").exists()
