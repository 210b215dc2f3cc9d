"""Warm rank processes: pre-started, handed a rank's environment over a pipe (no pickle)."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

from hpcrun.runtime.warm import WarmPool, handoff_line, read_handoff

REPO = Path(__file__).resolve().parents[3]


def test_the_handoff_is_one_json_line_of_values() -> None:
    line = handoff_line({"HPCRUN_RANK": "3"}, Path("/runs/r/logs/n1/rank-00003.out"))
    assert line.endswith(b"\n") and b"pickle" not in line
    assert read_handoff(io.BytesIO(line)) == ({"HPCRUN_RANK": "3"},
                                               Path("/runs/r/logs/n1/rank-00003.out"))
    assert read_handoff(io.BytesIO(b"")) is None


def _pool(tmp_path: Path) -> WarmPool:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return WarmPool(slots=1, env=env, python=sys.executable, log_dir=tmp_path / "logs",
                    cwd=str(REPO), preexec=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))


def test_a_taken_warm_process_runs_the_worker_with_the_handed_environment(
        tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    pool.fill()
    log = tmp_path / "logs" / "rank-00000.out"
    proc = pool.take(0, {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}, log)
    assert proc is not None and proc.wait(timeout=120) != 0
    # the worker ran with the handed environment (no incarnation in it) and wrote to its log
    assert "HPCRUN_RUN_DIR is not set" in log.read_text()
    assert pool.take(0, {}, log) is None, "a slot is used once until the pool refills"


def test_an_unused_warm_process_exits_cleanly_when_the_agent_lets_it_go(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    pool.fill()
    procs = list(pool._ready.values())
    pool.close()
    assert [p.returncode for p in procs] == [0]


def test_the_entrypoint_module_is_imported_while_warm_from_the_code_path(
        tmp_path: Path) -> None:
    from hpcrun.runtime.warm import preimport_entrypoint

    (tmp_path / "warm_probe_mod.py").write_text("LOADED = True\n")
    assert preimport_entrypoint("warm_probe_mod:main", str(tmp_path))
    assert sys.modules["warm_probe_mod"].LOADED
    # an entrypoint that does not import is left for the rank, which reports it
    assert not preimport_entrypoint("no_such_module_here:main", None)
    assert not preimport_entrypoint("", None)
