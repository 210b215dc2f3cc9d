"""Process-group bootstrap: real gloo groups over 127.0.0.1, one and two processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcrun.errors import DistInitError, EnvError
from hpcrun.launch.dist import (
    default_backend,
    destroy_process_group,
    device_for,
    init_process_group,
    rendezvous_over_mpi,
)
from hpcrun.launch.env import DistEnv, Launcher

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gang(world: int, *, job: str = "t1") -> list[DistEnv]:
    port = free_port()
    return [DistEnv(rank=r, local_rank=r, node_rank=0, world_size=world, local_world_size=world,
                    num_nodes=1, nodes=("127.0.0.1",), master_addr="127.0.0.1",
                    master_port=port, job_id=job, restart_count=0, attempt=0)
            for r in range(world)]


def spawn(code: str, env: DistEnv, **extra: str) -> subprocess.Popen[str]:
    environ = {**os.environ, **env.to_environ(), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO), **extra}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results(procs: list[subprocess.Popen[str]], timeout: float = 90) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


ALL_REDUCE = """
    import json, os, sys
    import torch, torch.distributed as dist
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.dist import init_process_group, destroy_process_group
    env = DistEnv.from_environ(dict(os.environ))
    backend = init_process_group(env, timeout_s=60)
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    print(json.dumps({"rank": env.rank, "backend": backend, "sum": t.item(),
                      "world": dist.get_world_size(), "mpi4py": "mpi4py" in sys.modules}))
    destroy_process_group()
"""


def test_two_process_gloo_all_reduce_over_loopback() -> None:
    out = results([spawn(ALL_REDUCE, env) for env in gang(2)])
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["sum"] == 3.0 and o["world"] == 2 and o["backend"] == "gloo" for o in out)
    assert not any(o["mpi4py"] for o in out), "mpi4py is imported only on the MPI path"


def test_single_process_group_in_process() -> None:
    import torch.distributed as dist

    env = gang(1)[0]
    try:
        assert init_process_group(env, timeout_s=30) == "gloo"
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        assert init_process_group(env) == "gloo", "joining the same group again is a no-op"
        with pytest.raises(DistInitError, match="already initialised as rank 0/1"):
            init_process_group(replace(env, world_size=2, local_world_size=2))
    finally:
        destroy_process_group()
    assert not dist.is_initialized()
    destroy_process_group()  # safe when there is none


MISSING_PEER = """
    import os
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.dist import init_process_group
    from hpcrun.errors import DistInitError
    try:
        init_process_group(DistEnv.from_environ(dict(os.environ)), timeout_s=2)
    except DistInitError as exc:
        print(exc)
"""


def test_a_missing_peer_is_one_clear_error_after_the_timeout() -> None:
    proc = spawn(MISSING_PEER, gang(2)[0])
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr[-2000:]
    assert "rank 0/2 could not join the gloo process group at 127.0.0.1:" in stdout
    assert "within 2 s" in stdout


def test_backend_choice_and_device_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the NCCL test covers it")
    env = DistEnv.single()
    assert default_backend() == "gloo" and device_for(env) == torch.device("cpu")
    with pytest.raises(EnvError, match="backend 'nccl' needs CUDA"):
        init_process_group(env, backend="nccl")
    with pytest.raises(DistInitError, match="unknown backend 'ucc'"):
        init_process_group(env, backend="ucc")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL needs CUDA")
def test_nccl_single_process_all_reduce_on_the_local_rank_device() -> None:
    import torch.distributed as dist

    env = gang(1)[0]
    try:
        assert init_process_group(env, timeout_s=60) == "nccl"
        assert torch.cuda.current_device() == env.local_rank
        t = torch.ones(4, device=device_for(env))
        dist.all_reduce(t)
        assert t.sum().item() == 4.0
    finally:
        destroy_process_group()


class FakeComm:
    """Stands in for MPI.COMM_WORLD as rank ``rank`` sees it (no MPI runtime on this machine)."""

    def __init__(self, rank: int, hosts: list[str], root_value: tuple[str, int]) -> None:
        self.rank, self.hosts, self.root_value = rank, hosts, root_value

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return len(self.hosts)

    def allgather(self, value: str) -> list[str]:
        return self.hosts

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value if self.rank == root else self.root_value


def test_mpi_rendezvous_takes_rank_zeros_host_and_port() -> None:
    env = DistEnv(rank=3, local_rank=0, node_rank=0, world_size=4, local_world_size=1,
                  num_nodes=4, nodes=(), master_addr="", master_port=25000, job_id="mpi",
                  restart_count=0, attempt=0, launcher=Launcher.MPI)
    filled = rendezvous_over_mpi(env, comm=FakeComm(3, ["a", "a", "b", "b"], ("a", 25000)))
    assert (filled.master_addr, filled.master_port) == ("a", 25000)
    assert (filled.nodes, filled.node_rank, filled.local_rank) == (("a", "b"), 1, 1)
    assert (filled.num_nodes, filled.local_world_size) == (2, 2)
    with pytest.raises(EnvError, match="has 2 ranks but the environment says 4"):
        rendezvous_over_mpi(env, comm=FakeComm(0, ["a", "b"], ("a", 1)))


def test_mpi_path_without_mpi4py_says_how_to_fix() -> None:
    if "mpi4py" in sys.modules or _has_mpi4py():
        pytest.skip("mpi4py is installed")
    env = DistEnv.from_environ({"PMI_RANK": "0", "PMI_SIZE": "1"})
    with pytest.raises(EnvError, match="mpi4py is not installed"):
        init_process_group(env)


def _has_mpi4py() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


GROUPS = """
    import json, os, time
    import torch
    import torch.distributed as dist
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.dist import form_groups
    from hpcrun.launch.gpu import GpuSettings
    from hpcrun.runtime.rank.worker import classify

    env = DistEnv.from_environ(dict(os.environ))
    groups = form_groups(env, GpuSettings.from_environ(dict(os.environ)))
    t = torch.ones(1)
    dist.all_reduce(t, group=groups.checkpoint_group)
    out = {"backend": groups.backend, "device": str(groups.device),
           "host_is_default": groups.host_group is None, "ckpt_sum": t.item()}
    # rank 1 skips the next step collective: rank 0's wait runs into the step timeout
    if env.rank == 0:
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as exc:
            out["fault"] = classify(exc)
            out["error"] = str(exc)[:300]
    else:
        time.sleep(8)
    print(json.dumps(out), flush=True)
    os._exit(0)
"""


def test_step_collective_timeout_is_its_own_and_reads_as_a_hang() -> None:
    settings = {"HPCRUN_DIST_BACKEND": "gloo", "HPCRUN_PG_INIT_TIMEOUT_S": "60",
                "HPCRUN_STEP_TIMEOUT_S": "2", "HPCRUN_CKPT_TIMEOUT_S": "60"}
    procs = [spawn(GROUPS, env, **settings) for env in gang(2)]
    first, second = results(procs)
    for r in (first, second):
        assert r["backend"] == "gloo" and r["device"] == "cpu" and r["ckpt_sum"] == 2.0
        assert r["host_is_default"], "on CPU the step agreement uses the (gloo) default group"
    assert first["fault"] == "hang"
    # gloo names the deadline it waited for: the step's 2 s, not the 60 s of init or checkpoint
    assert "Timed out waiting 2000ms" in first["error"], first["error"]


def test_a_rank_joins_as_soon_as_rank_0_s_store_listens_not_after_a_backoff() -> None:
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from hpcrun.launch.dist import await_listener

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up: dict[str, Any] = {}

    def rank0() -> None:
        time.sleep(1.2)  # rank 0 is late: c10d's own backoff would then wait ~1 s more
        up["store"] = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30),
                                    wait_for_workers=False)
        up["at"] = time.monotonic()

    t = threading.Thread(target=rank0)
    t.start()
    assert await_listener("127.0.0.1", port, timeout_s=30)
    joined = time.monotonic()
    t.join()
    assert joined - up["at"] < 0.3, "joined within a probe or two of the store listening"
    client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    client.set("k", "v")
    assert up["store"].get("k") == b"v", "the probe left the store working"


def test_a_store_that_never_listens_is_left_to_the_rendezvous_timeout() -> None:
    from hpcrun.launch.dist import await_listener
    from hpcrun.testing import FakeClock

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    clock = FakeClock()
    assert not await_listener("127.0.0.1", port, timeout_s=2.0, clock=clock)
    assert 2.0 <= clock.monotonic() < 2.1
