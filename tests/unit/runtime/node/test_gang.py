"""A node's rank processes: a gang is done only once every rank's end was reported."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpcrun.runtime.incarnation import EXIT_PREEMPTED, Ending, RankExit
from hpcrun.runtime.node.gang import Gang, node_ending


class _Pool:
    """Starts each rank as a process that sleeps until it is killed."""

    def take(self, slot: int, env: dict[str, str], log: Path) -> Any:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_rank_that_dies_after_a_poll_keeps_the_gang_pending_until_the_next_poll(
        tmp_path: Path) -> None:
    gang = Gang(ranks=[0, 1], env_for=lambda r: {}, log_dir=tmp_path,
                exit_report_for=lambda r: tmp_path / f"exit-{r}.json",
                warm=_Pool())  # type: ignore[arg-type]
    gang.start()
    try:
        assert gang.poll() == [] and gang.pending == [0, 1]
        for proc in gang.procs.values():  # both die between two polls of the agent
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        # the processes are gone, but their ends are not reported yet: not done, so the
        # agent's next poll sees the failure and records its cause
        assert gang.live_ranks == [] and gang.pending == [0, 1]
        ended = gang.poll()
        assert [(e.rank, e.returncode, e.fault) for e in ended] == [
            (0, -9, "process_crash"), (1, -9, "process_crash")]
        assert gang.pending == []
    finally:
        gang.kill(grace_s=0.1)


def test_a_node_succeeded_only_when_every_rank_did_and_preempted_when_the_rest_stopped() -> None:
    ok, stopped = RankExit(rank=0, returncode=0), RankExit(rank=1, returncode=EXIT_PREEMPTED)
    killed = RankExit(rank=2, returncode=-9)
    assert node_ending([ok, RankExit(rank=1, returncode=0)]) is Ending.SUCCEEDED
    assert node_ending([ok, stopped]) is Ending.PREEMPTED
    assert node_ending([ok, stopped, killed]) is Ending.FAILED
    assert node_ending([]) is Ending.FAILED, "a node with no rank exit did not succeed"
