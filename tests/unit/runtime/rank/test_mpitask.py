"""A pmix task's pure parts: the agent's plan read as untrusted input, MPI's placement checked
against it, the task's own MPI and step variables kept."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrun.errors import EnvError
from hpcrun.launch.dist import rendezvous_over_mpi
from hpcrun.launch.env import DistEnv, Launcher
from hpcrun.runtime.rank.mpitask import (
    check_agreement,
    merged_environ,
    rank_env_path,
    read_rank_env,
)

PLANNED = DistEnv(rank=3, local_rank=1, node_rank=1, world_size=4, local_world_size=2,
                  num_nodes=2, nodes=("node1", "node2"), master_addr="node1", master_port=25000,
                  job_id="7", restart_count=0, attempt=0)


class FakeComm:
    """``MPI.COMM_WORLD`` of a 2 x 2 gang as seen from one rank."""

    def __init__(self, rank: int, hosts: list[str]) -> None:
        self.rank, self.hosts = rank, hosts

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return len(self.hosts)

    def allgather(self, _: object) -> list[str]:
        return self.hosts

    def bcast(self, value: object, root: int = 0) -> object:
        return (self.hosts[0], PLANNED.master_port)


def _write(path: Path, body: object) -> Path:
    path.write_text(json.dumps(body))
    return path


def test_the_plan_round_trips(tmp_path: Path) -> None:
    env = {"HPCRUN_RANK": "3", "A": "b"}
    path = _write(tmp_path / "p.json", {"schema_version": 1, "rank": 3, "env": env})
    assert read_rank_env(path, rank=3) == env


@pytest.mark.parametrize(("body", "match"), [
    ("not json", "cannot read"),
    ([], "expected a JSON object"),
    ({"rank": 3, "env": {"HPCRUN_RANK": 3}}, "mapping of strings"),
    ({"rank": 3, "env": ["HPCRUN_RANK"]}, "mapping of strings"),
    ({"rank": 2, "env": {"HPCRUN_RANK": "2"}}, "planned for rank '2', expected 3"),
    ({"rank": 2, "env": {"HPCRUN_RANK": "3"}}, "expected 3"),
])
def test_a_damaged_plan_is_refused_naming_the_file(tmp_path: Path, body: object,
                                                   match: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    with pytest.raises(EnvError, match=match) as err:
        read_rank_env(path, rank=3)
    assert str(path) in str(err.value)


def test_a_missing_plan_says_to_check_the_agent(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="check that the node's agent is running"):
        read_rank_env(tmp_path / "absent.json", rank=0)


def test_mpi_placement_that_matches_the_plan_passes() -> None:
    placed = rendezvous_over_mpi(replace(PLANNED, launcher=Launcher.MPI, master_addr=""),
                                 comm=FakeComm(3, ["node1", "node1", "node2", "node2"]))
    check_agreement(PLANNED, placed)
    assert (placed.launcher, placed.master_addr) == (Launcher.MPI, "node1")


def test_mpi_placement_elsewhere_is_refused_with_both_sides() -> None:
    # a cyclic distribution puts rank 2 on node1 as its second rank; the agents planned blocks
    planned = replace(PLANNED, rank=2, local_rank=0)
    placed = rendezvous_over_mpi(replace(planned, launcher=Launcher.MPI, master_addr=""),
                                 comm=FakeComm(2, ["node1", "node2", "node1", "node2"]))
    with pytest.raises(EnvError, match=r"node_rank: MPI 0, agent 1; local_rank: MPI 1, agent 0"
                                       r".*set rank_launcher: agent"):
        check_agreement(planned, placed)


def test_a_rank_mismatch_names_both_ranks() -> None:
    with pytest.raises(EnvError, match="rank: MPI 2, agent 3"):
        check_agreement(PLANNED, replace(PLANNED, rank=2))


def test_the_tasks_own_mpi_and_step_variables_win_over_the_plan() -> None:
    planned = {"HPCRUN_RANK": "3", "SLURM_STEP_ID": "0", "OMP_NUM_THREADS": "1"}
    own = {"SLURM_STEP_ID": "1", "PMIX_RANK": "3", "HOME": "/root"}
    assert merged_environ(planned, own) == {"HPCRUN_RANK": "3", "SLURM_STEP_ID": "1",
                                            "PMIX_RANK": "3", "OMP_NUM_THREADS": "1"}


def test_plans_of_incarnations_never_share_a_path(tmp_path: Path) -> None:
    paths = {rank_env_path(tmp_path, "node1", generation=g, attempt=a, rank=r)
             for g in (1, 2) for a in (0, 1) for r in (0, 1)}
    assert len(paths) == 8 and all("node1" in str(p) for p in paths)
