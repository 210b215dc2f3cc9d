"""DistEnv from each launcher's variables; clear errors; ports every rank agrees on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.errors import EnvError
from hpcrun.launch.env import (
    PORT_BASE,
    PORT_SPAN,
    DistEnv,
    Launcher,
    derive_master_port,
    detect_launcher,
)

SLURM_RANK5 = {  # rank 5 of `srun -N3 --ntasks-per-node=2` on node[07-09]
    "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_NTASKS": "6",
    "SLURM_JOB_NODELIST": "node[07-09]", "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1",
}
HPCRUN_RANK3 = {
    "HPCRUN_RANK": "3", "HPCRUN_LOCAL_RANK": "1", "HPCRUN_NODE_RANK": "1",
    "HPCRUN_WORLD_SIZE": "4", "HPCRUN_LOCAL_WORLD_SIZE": "2", "HPCRUN_NODES": "node1,node2",
    "HPCRUN_MASTER_ADDR": "node1", "HPCRUN_MASTER_PORT": "23456", "HPCRUN_JOB_ID": "99",
    "HPCRUN_RESTART_COUNT": "2", "HPCRUN_ATTEMPT": "1",
}
TORCHRUN_RANK2 = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                  "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
                  "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc",
                  "TORCHELASTIC_RESTART_COUNT": "3"}
OPENMPI_RANK1 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


def test_slurm_step_variables() -> None:
    env = DistEnv.from_environ(SLURM_RANK5)
    assert env.launcher is Launcher.SLURM
    assert (env.rank, env.local_rank, env.node_rank, env.world_size) == (5, 1, 2, 6)
    assert env.local_world_size == 2 and env.num_nodes == 3
    assert env.nodes == ("node07", "node08", "node09") and env.master_addr == "node07"
    assert (env.job_id, env.restart_count, env.attempt) == ("4242", 1, 0)
    assert env.master_port == derive_master_port("4242", 1, 0)


def test_slurm_uneven_tasks_per_node() -> None:
    env = DistEnv.from_environ({**SLURM_RANK5, "SLURM_PROCID": "4", "SLURM_LOCALID": "0",
                                "SLURM_NTASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"})
    assert env.local_world_size == 1


def test_hpcrun_variables_win_over_the_agents_own_slurm_variables() -> None:
    env = DistEnv.from_environ({**SLURM_RANK5, **HPCRUN_RANK3})
    assert env.launcher is Launcher.HPCRUN
    assert (env.rank, env.local_rank, env.node_rank, env.world_size) == (3, 1, 1, 4)
    assert (env.master_addr, env.master_port, env.job_id) == ("node1", 23456, "99")
    assert (env.restart_count, env.attempt) == (2, 1)


def test_hpcrun_derives_address_and_port_when_not_given() -> None:
    raw = {k: v for k, v in HPCRUN_RANK3.items()
           if k not in ("HPCRUN_MASTER_ADDR", "HPCRUN_MASTER_PORT")}
    env = DistEnv.from_environ(raw)
    assert env.master_addr == "node1" and env.master_port == derive_master_port("99", 2, 1)


def test_torchrun_variables_and_torchrun_inside_a_slurm_step() -> None:
    env = DistEnv.from_environ(TORCHRUN_RANK2)
    assert env.launcher is Launcher.TORCHRUN
    assert (env.rank, env.local_rank, env.node_rank, env.world_size) == (2, 0, 1, 4)
    assert (env.master_addr, env.master_port, env.restart_count) == ("10.0.0.1", 29500, 3)
    under_srun = DistEnv.from_environ({**SLURM_RANK5, **TORCHRUN_RANK2})
    assert under_srun.launcher is Launcher.TORCHRUN and under_srun.rank == 2


def test_mpi_variables() -> None:
    env = DistEnv.from_environ({**OPENMPI_RANK1, "MASTER_ADDR": "h0", "MASTER_PORT": "31000"})
    assert env.launcher is Launcher.MPI
    assert (env.rank, env.local_rank, env.node_rank, env.world_size) == (1, 1, 0, 4)
    assert (env.num_nodes, env.master_addr, env.master_port) == (2, "h0", 31000)
    mpich = DistEnv.from_environ({"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert mpich.world_size == 1 and mpich.master_addr == "", "filled over MPI at init"


@pytest.mark.parametrize(("env", "family", "missing"), [
    ({k: v for k, v in SLURM_RANK5.items() if k != "SLURM_NTASKS"}, "slurm", "SLURM_NTASKS"),
    ({k: v for k, v in SLURM_RANK5.items() if k != "SLURM_JOB_ID"}, "slurm", "SLURM_JOB_ID"),
    ({k: v for k, v in HPCRUN_RANK3.items() if k != "HPCRUN_NODES"}, "hpcrun", "HPCRUN_NODES"),
    ({"HPCRUN_RANK": "0"}, "hpcrun", "HPCRUN_NODES"),
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "torchrun", "MASTER_ADDR"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "mpi", "OMPI_COMM_WORLD_SIZE"),
])
def test_partial_environment_names_the_variable_and_the_launcher(
        env: dict[str, str], family: str, missing: str) -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ(env)
    assert missing in str(info.value) and f"detected launcher: {family}" in str(info.value)


def test_malformed_values_and_no_launcher() -> None:
    with pytest.raises(EnvError, match="SLURM_PROCID='x' is not an integer"):
        DistEnv.from_environ({**SLURM_RANK5, "SLURM_PROCID": "x"})
    with pytest.raises(EnvError, match="not a Slurm hostlist"):
        DistEnv.from_environ({**SLURM_RANK5, "SLURM_JOB_NODELIST": "node[3-"})
    with pytest.raises(EnvError, match=r"rank must be in 0\.\.3"):
        DistEnv.from_environ({**HPCRUN_RANK3, "HPCRUN_RANK": "4"})
    with pytest.raises(EnvError, match="no distributed launcher detected"):
        DistEnv.from_environ({"SLURM_JOB_ID": "1", "HOME": "/root"})
    assert detect_launcher({"HPCRUN_SITE_CONFIGS": "/x"}) is None


def test_single_process_env() -> None:
    env = DistEnv.single()
    assert (env.rank, env.world_size, env.master_addr) == (0, 1, "127.0.0.1")


def test_with_attempt_moves_the_port() -> None:
    env = DistEnv.from_environ(SLURM_RANK5)
    nxt = env.with_attempt(1)
    assert nxt.attempt == 1 and nxt.master_port != env.master_port
    assert nxt.master_port == derive_master_port("4242", 1, 1)


layouts = st.integers(1, 4).flatmap(lambda nodes: st.integers(1, 4).flatmap(
    lambda k: st.tuples(st.just(nodes), st.just(k), st.integers(0, nodes * k - 1))))


@settings(max_examples=80, deadline=None)
@given(layouts, st.text(alphabet="0123456789", min_size=1, max_size=8), st.integers(0, 20),
       st.integers(0, 20))
def test_to_environ_round_trips(layout: tuple[int, int, int], job: str, restarts: int,
                                attempt: int) -> None:
    nodes, k, rank = layout
    hosts = tuple(f"n{i}" for i in range(nodes))
    env = DistEnv(rank=rank, local_rank=rank % k, node_rank=rank // k, world_size=nodes * k,
                  local_world_size=k, num_nodes=nodes, nodes=hosts, master_addr=hosts[0],
                  master_port=derive_master_port(job, restarts, attempt), job_id=job,
                  restart_count=restarts, attempt=attempt)
    assert DistEnv.from_environ(env.to_environ()) == env


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=20), st.integers(0, 60), st.integers(0, 60))
def test_every_rank_derives_the_same_port_in_range(job: str, restarts: int, attempt: int) -> None:
    ports = {derive_master_port(job, restarts, attempt) for _ in range(4)}
    assert len(ports) == 1
    assert PORT_BASE <= ports.pop() < PORT_BASE + PORT_SPAN < 32768, "below ephemeral ports"


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=20), st.integers(1, 76))
def test_no_two_incarnations_of_a_job_share_a_port(job: str, budget: int) -> None:
    incarnations = [(r, a) for r in range(budget) for a in range(budget) if r + a < budget]
    ports = {derive_master_port(job, r, a) for r, a in incarnations}
    assert len(ports) == len(incarnations)


def test_port_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match=r">= 0"):
        derive_master_port("1", -1, 0)
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        derive_master_port("1", 0, 0, base=60000, span=10000)


def test_a_task_of_srun_mpi_pmix_is_an_mpi_program() -> None:
    """``srun --mpi=pmix`` sets the step's variables and PMIx's rank, but no PMIx size: the MPI
    runtime wins, with the step's counts standing in until COMM_WORLD confirms them."""
    task = {**SLURM_RANK5, "PMIX_RANK": "5"}
    env = DistEnv.from_environ(task)
    slurm = DistEnv.from_environ(SLURM_RANK5)
    assert env.launcher is Launcher.MPI and env.master_addr == "", "filled over MPI at init"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        slurm.rank, slurm.world_size, slurm.local_rank, slurm.local_world_size)
    assert DistEnv.from_environ({**task, **HPCRUN_RANK3}).launcher is Launcher.HPCRUN
