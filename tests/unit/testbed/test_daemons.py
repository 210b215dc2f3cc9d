"""pid files, /proc reading and the namespace sweep's safety, on fake and real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrun.clock import SYSTEM_CLOCK
from hpcrun.errors import TestbedError
from hpcrun.testbed import daemons as d
from hpcrun.testing.fakes import FakeClock

_FAKE_PID_BASE = 9_000_000  # above any real pid_max: a stray signal cannot hit a real process


def _fake_proc(root: Path, procs: dict[str, tuple[str, str, str]]) -> Path:
    """A /proc lookalike: name -> (comm, state letter, uts namespace)."""
    for pid, (comm, state, ns) in procs.items():
        (root / pid / "ns").mkdir(parents=True)
        (root / pid / "comm").write_text(comm + "\n")
        (root / pid / "stat").write_text(f"{pid} ({comm}) {state} 1 1 1\n")
        os.symlink(ns, root / pid / "ns" / "uts")
    return root


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    b = _FAKE_PID_BASE
    return _fake_proc(tmp_path / "proc", {
        "1": ("init", "S", "uts:[100]"),
        "self": ("pytest", "R", "uts:[100]"),
        str(b + 1): ("bash", "S", "uts:[100]"),          # host process
        str(b + 2): ("slurmd", "S", "uts:[200]"),        # node2
        str(b + 3): ("slurmstepd", "S", "uts:[200]"),
        str(b + 4): ("sleep", "Z", "uts:[200]"),         # zombie: not alive
        str(b + 5): ("slurmd", "S", "uts:[300]"),        # node3
        str(b + 6): ("my (odd) name", "S", "uts:[300]"),
    })


def test_sweep_finds_only_the_node_namespace(proc: Path) -> None:
    b = _FAKE_PID_BASE
    assert d.pids_in_namespace("uts:[200]", proc) == [b + 2, b + 3]
    assert d.pids_in_namespace("uts:[300]", proc) == [b + 5, b + 6]


def test_sweep_refuses_the_host_namespace(proc: Path) -> None:
    assert d.pids_in_namespace("uts:[100]", proc) == []
    assert d.kill_namespace("uts:[100]", clock=FakeClock(), proc=proc) == []


def test_sweep_refuses_when_own_namespace_is_unknown(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path / "proc", {str(_FAKE_PID_BASE): ("slurmd", "S", "uts:[200]")})
    assert d.pids_in_namespace("uts:[200]", proc) == []  # no /proc/self: cannot prove safety


def test_alive_means_running_with_the_expected_name(proc: Path) -> None:
    b = _FAKE_PID_BASE
    assert d.is_alive(b + 2, "slurmd", proc)
    assert not d.is_alive(b + 2, "slurmctld", proc)  # a reused pid is not our daemon
    assert not d.is_alive(b + 4, None, proc)  # zombie
    assert not d.is_alive(b + 99, None, proc)
    assert not d.is_alive(None)
    assert d.process_name(b + 6, proc) == "my (odd) name"


@pytest.mark.parametrize("content, expected", [
    ("1234\n", 1234), ("", None), ("abc", None), ("-5", None), ("1", None), ("0", None)])
def test_pid_files_are_untrusted(tmp_path: Path, content: str, expected: int | None) -> None:
    path = tmp_path / "x.pid"
    path.write_text(content)
    assert d.read_pid(path) == expected
    assert d.read_pid(tmp_path / "missing.pid") is None


def test_write_text_is_atomic_and_sets_mode(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "slurmdbd.conf"
    d.write_text(path, "a=b\n", mode=0o600)
    assert path.read_text() == "a=b\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["slurmdbd.conf"]


def test_stop_pids_terminates_a_real_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert d.is_alive(child.pid)
        # the reaper thread below keeps the child from lingering as a zombie of this process
        import threading
        threading.Thread(target=child.wait, daemon=True).start()
        d.stop_pids([child.pid], clock=SYSTEM_CLOCK, grace=5)
        assert not d.is_alive(child.pid)
        assert child.wait(timeout=5) != 0
    finally:
        child.kill()


def test_wait_until_names_what_did_not_happen() -> None:
    clock = FakeClock()
    with pytest.raises(TestbedError, match="slurmctld start did not happen within 3 s; see log"):
        d.wait_until(lambda: False, timeout=3, clock=clock, what="slurmctld start",
                     hint="see log")
    assert clock.monotonic() >= 3


def test_log_tail_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("a\n\nb\nc\nfatal: bad\n")
    assert d.log_tail(log) == "b | c | fatal: bad"
    assert "no log" in d.log_tail(tmp_path / "none.log")


def test_a_crash_kills_children_before_their_parents(tmp_path: Path) -> None:
    """srun (under the batch shell, under slurmstepd) dies before its parent: a stopped process
    whose parent dies first is woken by the kernel (SIGHUP, SIGCONT) and could act."""
    b = _FAKE_PID_BASE
    tree = {b + 1: 1, b + 2: b + 1, b + 3: b + 2, b + 9: b + 3, b + 4: b + 1}
    for pid, ppid in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p {pid}) S {ppid} 1 1\n")
    order = d.leaves_first(tree, tmp_path)
    assert all(order.index(child) < order.index(parent) for child, parent in tree.items()
               if parent in tree), order
    assert order[0] == b + 9 and order[-1] == b + 1
