"""Warm rank processes: pre-started, handed a rank's environment over a pipe (no pickle)."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

from hpcrun.runtime.rank.warm import WarmPool, handoff_line, read_handoff

REPO = Path(__file__).resolve().parents[4]


def test_the_handoff_is_one_json_line_of_values() -> None:
    line = handoff_line({"HPCRUN_RANK": "3"}, Path("/runs/r/logs/n1/rank-00003.out"))
    assert line.endswith(b"\n") and b"pickle" not in line
    assert read_handoff(io.BytesIO(line)) == ({"HPCRUN_RANK": "3"},
                                               Path("/runs/r/logs/n1/rank-00003.out"))
    assert read_handoff(io.BytesIO(b"")) is None


def _pool(tmp_path: Path) -> WarmPool:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return WarmPool(slots=1, env=env, argv=[sys.executable, "-m", "hpcrun.runtime.rank.warm"],
                    log_dir=tmp_path / "logs",
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
    from hpcrun.runtime.rank.warm import preimport_entrypoint

    (tmp_path / "warm_probe_mod.py").write_text("LOADED = True\n")
    assert preimport_entrypoint("warm_probe_mod:main", str(tmp_path))
    assert sys.modules["warm_probe_mod"].LOADED
    # an entrypoint that does not import is left for the rank, which reports it
    assert not preimport_entrypoint("no_such_module_here:main", None)
    assert not preimport_entrypoint("", None)


class _TakingPool:
    """A warm pool that records what each rank was handed and starts a trivial process."""

    def __init__(self) -> None:
        self.handed: list[dict[str, str]] = []

    def take(self, slot: int, env: dict[str, str], log: Path) -> Any:
        import subprocess

        self.handed.append(dict(env))
        return subprocess.Popen([sys.executable, "-c", "pass"])


def test_the_gang_stamps_each_rank_s_hand_off_time_for_the_start_split(tmp_path: Path) -> None:
    import time

    from hpcrun.runtime.node.gang import Gang
    from hpcrun.runtime.rank.startup import HANDED_AT_ENV

    pool = _TakingPool()
    gang = Gang(ranks=[2, 3], env_for=lambda r: {"HPCRUN_RANK": str(r)}, log_dir=tmp_path,
                exit_report_for=lambda r: tmp_path / f"exit-{r}.json", warm=pool)  # type: ignore[arg-type]
    before = time.time()
    gang.start()
    for proc in gang.procs.values():
        proc.wait(timeout=60)
    assert [e["HPCRUN_RANK"] for e in pool.handed] == ["2", "3"]
    assert all(before <= float(e[HANDED_AT_ENV]) <= time.time() for e in pool.handed)


def test_the_pool_refills_once_every_rank_s_own_beat_shows_a_step(tmp_path: Path) -> None:
    from hpcrun.observe.heartbeat import write_rank_heartbeat
    from hpcrun.runtime.incarnation import Incarnation
    from hpcrun.runtime.rank.warm import all_stepped

    inc = Incarnation(run_dir=tmp_path, run_id="r1", generation=2, holder="h", fence_slot=0,
                      job_id="1", restart_count=0, attempt=0, node="n0",
                      node_local_root=tmp_path / "local")
    started = 1000.0
    write_rank_heartbeat(inc.heartbeat_dir(), rank=0, step=5, ts=started + 2, step_time_s=0.1,
                         pid=1)
    assert not all_stepped(inc, [0, 1], started), "rank 1 has not stepped yet"
    write_rank_heartbeat(inc.heartbeat_dir(), rank=1, step=1, ts=started - 30, step_time_s=0.1,
                         pid=2)
    assert not all_stepped(inc, [0, 1], started), "a beat of the last gang does not count"
    write_rank_heartbeat(inc.heartbeat_dir(), rank=1, step=6, ts=started + 3, step_time_s=0.1,
                         pid=2)
    assert all_stepped(inc, [0, 1], started)


def test_a_warm_pool_needs_a_core_for_each_rank_and_each_warm_process() -> None:
    from hpcrun.runtime.rank.warm import warm_fits

    assert warm_fits(ranks=2, cores=4) and warm_fits(ranks=8, cores=64)
    assert not warm_fits(ranks=4, cores=2)  # 2 emulated nodes x 2 ranks on a 2-core machine
    assert not warm_fits(ranks=8, cores=8)  # one core per rank: a refill would steal them
