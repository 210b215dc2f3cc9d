"""A whole-tier stall at the storage seam (the ``shared-fs-stall`` drill) and the slow
operations it leaves for the supervisor to report."""

from __future__ import annotations

from pathlib import Path

from hpcrun.runtime.incarnation import Incarnation
from hpcrun.runtime.sharedtier import arm_from_mark, stall_mark, start_shared_tier_stall
from hpcrun.storage import LocalStorage, SlowOps, StallGate
from hpcrun.testing import FakeClock


def test_an_armed_gate_stalls_paths_under_its_root_only_until_it_ends(tmp_path: Path) -> None:
    clock = FakeClock()
    gate = StallGate(clock=clock)
    assert gate.remaining(tmp_path / "run" / "log") == 0.0, "unarmed: nothing waits"
    gate.arm(tmp_path / "run", 10.0)
    assert gate.remaining(tmp_path / "run" / "log" / "000001.json") == 10.0
    assert gate.remaining(tmp_path / "run") == 10.0
    assert gate.remaining(tmp_path / "runs-elsewhere") == 0.0, "a sibling is not under it"
    assert gate.remaining(tmp_path / "node-local") == 0.0
    clock.advance(4.0)
    gate.wait_out(tmp_path / "run" / "x")  # the fake clock sleeps the rest
    assert clock.monotonic() == 10.0 and gate.remaining(tmp_path / "run" / "x") == 0.0


def test_every_operation_of_local_storage_waits_out_the_stall_and_is_recorded(
        tmp_path: Path) -> None:
    clock = FakeClock()
    gate, slow = StallGate(clock=clock), SlowOps(threshold_s=3.0)
    storage = LocalStorage(gate, slow)
    gate.arm(tmp_path / "run", 0.2)  # real time: the operation's own clock measures it
    storage.makedirs(tmp_path / "run")
    assert clock.monotonic() >= 0.2, "the makedirs waited out the stall"
    storage.write_atomic(tmp_path / "run" / "a", b"x")
    assert storage.read_bytes(tmp_path / "run" / "a") == b"x"


def test_slow_ops_keep_the_slowest_over_the_threshold_until_taken() -> None:
    slow = SlowOps(threshold_s=3.0)
    slow.note("listdir", "/run/log", 1.0)
    assert slow.take() is None, "a second is not a stall"
    slow.note("listdir", "/run/log", 9.8)
    slow.note("read_bytes", "/run/x", 4.0)
    assert slow.take() == ("listdir", "/run/log", 9.8)
    assert slow.take() is None, "taken once"


def test_a_rank_marks_its_node_and_the_agent_stalls_once_from_the_mark(tmp_path: Path) -> None:
    inc = Incarnation(run_dir=tmp_path / "run", run_id="run", generation=1, holder="h",
                      fence_slot=0, job_id="7", restart_count=0, attempt=0, node="n0",
                      node_local_root=tmp_path / "nl")
    clock = FakeClock()
    rank_gate, agent_gate = StallGate(clock=clock), StallGate(clock=clock)
    assert not arm_from_mark(inc, gate=agent_gate), "no mark: no stall"
    start_shared_tier_stall(inc, 10.0, gate=rank_gate)
    assert rank_gate.remaining(inc.run_dir / "log") == 10.0
    assert stall_mark(inc).is_relative_to(tmp_path / "nl"), "the mark is node-local"
    assert arm_from_mark(inc, gate=agent_gate)
    assert agent_gate.remaining(inc.run_dir / "log") == 10.0
    assert not stall_mark(inc).exists() and not arm_from_mark(inc, gate=agent_gate)
