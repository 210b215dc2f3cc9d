"""Script mode's pure parts: a rank's command line and environment, and what its exit means."""

from __future__ import annotations

import signal
import subprocess
import sys

from hpcrun.control.spec import RunSpec
from hpcrun.launch.env import DistEnv
from hpcrun.runtime.incarnation import EXIT_PREEMPTED, Ending, RankExit
from hpcrun.runtime.rank.script import (
    RANK_SIGNAL_ENV,
    Grace,
    rank_argv,
    rank_environ,
    rank_signal,
    script_exit,
)


def _spec(**kw: object) -> RunSpec:
    return RunSpec.from_dict({"name": "s", **kw})


def _dist(rank: int = 3, attempt: int = 1) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank % 2, node_rank=rank // 2, world_size=4,
                   local_world_size=2, num_nodes=2, nodes=("a", "b"), master_addr="a",
                   master_port=29500, job_id="42", restart_count=2, attempt=attempt)


def test_a_rank_runs_the_script_with_its_arguments_or_the_command() -> None:
    assert rank_argv(_spec(script="t/train.py", args=["--lr", "1"]), "/py") == [
        "/py", "t/train.py", "--lr", "1"]
    assert rank_argv(_spec(command=["torchrun-free", "x"]), "/py") == ["torchrun-free", "x"]


def test_the_rank_signal_is_the_spec_s() -> None:
    assert rank_signal(_spec(script="t.py")) == signal.SIGTERM
    assert rank_signal(_spec(script="t.py", preempt_signal="USR1")) == signal.SIGUSR1


def test_the_environment_is_torchrun_s() -> None:
    env = {**_dist().to_environ(), **rank_environ(_dist(), _spec(script="t.py"), run_id="r-1")}
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "a",
        "MASTER_PORT": "29500"}
    assert (env["TORCHELASTIC_RUN_ID"], env["TORCHELASTIC_RESTART_COUNT"]) == ("r-1", "3")
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "3" and env[RANK_SIGNAL_ENV] == "SIGTERM"


def test_the_environment_reads_back_as_this_rank() -> None:
    env = {**_dist().to_environ(), **rank_environ(_dist(), _spec(script="t.py"), run_id="r")}
    back = DistEnv.from_environ(env)
    assert (back.rank, back.node_rank, back.world_size) == (3, 1, 4)


def test_any_exit_after_a_stop_is_a_preemption() -> None:
    for code in (0, 1, -signal.SIGTERM, -signal.SIGKILL):
        ex = script_exit(RankExit(rank=0, returncode=code), stopping=True)
        assert ex.preempted and ex.report["status"] == Ending.PREEMPTED


def test_a_lite_stop_reads_as_a_preemption_without_the_agent_s_flag() -> None:
    ex = script_exit(RankExit(rank=1, returncode=0, report={"status": "preempted"}),
                     stopping=False)
    assert ex.returncode == EXIT_PREEMPTED


def test_exit_zero_succeeds_and_any_other_exit_is_a_process_crash() -> None:
    assert script_exit(RankExit(rank=0, returncode=0), stopping=False).succeeded
    for code, how in ((1, "exited 1"), (-9, "killed by signal 9")):
        ex = script_exit(RankExit(rank=0, returncode=code), stopping=False)
        assert not (ex.succeeded or ex.preempted)
        assert (ex.fault, ex.report["detail"]) == ("process_crash", f"script {how}")


def test_grace_counts_from_the_first_stop_seen() -> None:
    grace = Grace(10.0)
    assert not grace.expired(stopping=False, now=0.0)
    assert not grace.expired(stopping=True, now=100.0)
    assert not grace.expired(stopping=True, now=110.0)
    assert grace.expired(stopping=True, now=110.5)


def test_lite_outside_hpcrun_does_nothing_and_warns_once() -> None:
    code = ("import torch; import hpcrun.lite as lite; m = torch.nn.Linear(2, 2);"
            "print(lite.restore({'m': m}), lite.should_stop(), lite.report(1, loss=1.0),"
            " lite.save())")
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 False None None"
    assert done.stderr.count("hpcrun.lite: not running under hpcrun") == 1
