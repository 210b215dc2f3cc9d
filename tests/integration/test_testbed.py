"""The testbed behaves like the multi-node Slurm cluster hpcrun targets."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcrun.testbed import JobClient, Testbed

pytestmark = pytest.mark.slurm


def _srun(slurm: JobClient, *argv: str, timeout: float = 60) -> str:
    result = slurm.run("srun", *argv, timeout=timeout)
    assert result.returncode == 0, f"srun {' '.join(argv)} failed: {result.stderr}"
    return result.stdout


_QUEUE_WAIT = 120.0
"""Seconds a test waits for its job to start: others may be using the shared testbed."""


def _wait_for_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.2)
    return path.read_text()


def test_three_nodes_two_tasks_get_distinct_hosts_and_ranks(testbed: Testbed,
                                                           slurm: JobClient) -> None:
    out = _srun(slurm, "-N3", "--ntasks-per-node=2", "bash", "-c",
                'echo "$(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID"')
    rows = [line.split() for line in out.splitlines()]
    hosts = {r[0] for r in rows}
    assert len(rows) == 6 and len(hosts) == 3 and hosts <= set(testbed.nodes)
    assert sorted(int(r[1]) for r in rows) == list(range(6))
    for host in hosts:
        mine = [r for r in rows if r[0] == host]
        assert sorted(int(r[2]) for r in mine) == [0, 1]  # local ids restart on each node
        assert len({r[3] for r in mine}) == 1  # one node id per host
    node_ids = {r[0]: int(r[3]) for r in rows}
    assert sorted(node_ids.values()) == [0, 1, 2]
    for host, procid, localid, nodeid in rows:  # block distribution: rank = node*2 + local
        assert int(procid) == 2 * int(nodeid) + int(localid), (host, procid)


def test_node_local_is_private_and_shared_dir_is_common(testbed: Testbed, slurm: JobClient,
                                                        job_dir: Path) -> None:
    local = testbed.node_local_path
    name = job_dir.name
    _srun(slurm, "-N1", "-w", "node1", "sh", "-c",
          f"echo secret > {local}/{name} && echo common > {job_dir}/shared.txt")
    out = _srun(slurm, "-N2", "-n2", "-w", "node1,node2", "sh", "-c",
                f'echo "$(hostname) $(cat {local}/{name} 2>/dev/null || echo absent) '
                f'$(cat {job_dir}/shared.txt)"')
    seen = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert seen == {"node1": ["secret", "common"], "node2": ["absent", "common"]}
    assert (testbed.node_local_dir("node1") / name).read_text() == "secret\n"
    assert not (testbed.node_local_dir("node2") / name).exists()
    assert not Path(local, name).exists()  # the host's own path is not node1's storage


_ALL_REDUCE = """
import os, torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(os.uname().nodename, rank, int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_gloo_all_reduce_across_two_nodes(slurm: JobClient, job_dir: Path,
                                          free_port: Callable[[], int]) -> None:
    script = job_dir / "all_reduce.py"
    script.write_text(_ALL_REDUCE)
    out = _srun(slurm, "-N2", "--ntasks-per-node=2", "--export=ALL,MASTER_ADDR=127.0.0.1,"
                f"MASTER_PORT={free_port()},GLOO_SOCKET_IFNAME=lo", sys.executable, str(script),
                timeout=120)
    rows = [line.split() for line in out.splitlines()]
    assert sorted(int(r[1]) for r in rows) == [0, 1, 2, 3]
    assert {int(r[2]) for r in rows} == {1 + 2 + 3 + 4}
    assert len({r[0] for r in rows}) == 2


_SIGNAL_THEN_REQUEUE = """#!/bin/bash
trap 'echo "usr1 restart=${{SLURM_RESTART_COUNT:-0}}" >> {d}/events' USR1
echo "start job=$SLURM_JOB_ID restart=${{SLURM_RESTART_COUNT:-0}}" >> {d}/events
echo "stdout of run ${{SLURM_RESTART_COUNT:-0}}"
if [ -z "$SLURM_RESTART_COUNT" ]; then
    touch {d}/ready
    for i in $(seq 600); do grep -q usr1 {d}/events && break; sleep 0.1; done
    scontrol requeue $SLURM_JOB_ID
    sleep 60
fi
"""


def test_batch_shell_gets_usr1_and_requeue_keeps_job_id(slurm: JobClient, job_dir: Path) -> None:
    job = slurm.submit(_SIGNAL_THEN_REQUEUE.format(d=job_dir), "-N1", "--requeue",
                       "--open-mode=append", f"--output={job_dir}/out.txt")
    _wait_for_file(job_dir / "ready", timeout=_QUEUE_WAIT)
    signalled = slurm.run("scancel", "--signal=USR1", "--batch", str(job))
    assert signalled.returncode == 0, signalled.stderr
    assert slurm.wait_for_state(job, {"COMPLETED"}, timeout=60) == "COMPLETED"
    events = (job_dir / "events").read_text().splitlines()
    assert events == [f"start job={job} restart=0", "usr1 restart=0",
                      f"start job={job} restart=1"]
    out = (job_dir / "out.txt").read_text().splitlines()  # append mode kept run 0's output
    assert [ln for ln in out if ln.startswith("stdout of run")] == ["stdout of run 0",
                                                                    "stdout of run 1"]


_VICTIM = """#!/bin/bash
trap 'echo "usr1 restart=${{SLURM_RESTART_COUNT:-0}}" >> {d}/events' USR1
echo "start restart=${{SLURM_RESTART_COUNT:-0}}" >> {d}/events
if [ -z "$SLURM_RESTART_COUNT" ]; then
    touch {d}/ready
    for i in $(seq 1200); do sleep 0.1; done
fi
"""


@pytest.mark.slow
def test_high_priority_job_preempts_and_requeues_low_one(slurm: JobClient,
                                                         job_dir: Path) -> None:
    victim = slurm.submit(_VICTIM.format(d=job_dir), "-p", "batch", "-N1", "-w", "node1",
                          "--exclusive", "--requeue", "--signal=B:USR1@5",
                          f"--output={job_dir}/victim.txt")
    _wait_for_file(job_dir / "ready", timeout=_QUEUE_WAIT)
    high = slurm.submit("#!/bin/sh\nsleep 2\n", "-p", "high", "-N1", "-w", "node1",
                        "--exclusive", f"--output={job_dir}/high.txt")
    _wait_for_file(job_dir / "events", timeout=5)
    deadline = time.monotonic() + 10
    while "usr1" not in (job_dir / "events").read_text():
        assert time.monotonic() < deadline, "victim got no USR1 within 10 s of preemption"
        time.sleep(0.2)
    assert slurm.wait_for_state(high, {"COMPLETED"}, timeout=60) == "COMPLETED"
    assert slurm.wait_for_state(victim, {"COMPLETED"}, timeout=90) == "COMPLETED"
    assert (job_dir / "events").read_text().splitlines() == [
        "start restart=0", "usr1 restart=0", "start restart=1"]
    assert "PREEMPTED" in {r.state for r in slurm.history(victim)}
