"""Which launcher starts a run's ranks, what submit refuses, and the pmix step's command line."""

from __future__ import annotations

import re

import pytest

from hpcrun.control.spec import RunSpec
from hpcrun.launch.admission import Passed, Problem
from hpcrun.launch.admit import rank_launcher_findings
from hpcrun.launch.ranklaunch import mpi_step_argv, rank_launcher, rank_launcher_problem
from hpcrun.launch.site import SiteConfig, site_from_dict
from hpcrun.vocab import Backend, RankLauncher


def _site(**kw: object) -> SiteConfig:
    return site_from_dict({"name": "s", "node_local_path": "/l", "shared_path": "/s", **kw})


def _spec(**kw: object) -> RunSpec:
    return RunSpec.from_dict({"name": "t", "entrypoint": "m:f", **kw})


PMIX = {"dist": {"rank_launcher": "pmix"}}


def test_the_spec_wins_over_the_site_and_agent_is_the_default() -> None:
    assert rank_launcher(_spec(), _site()) is RankLauncher.AGENT
    assert rank_launcher(_spec(), _site(rank_launcher="pmix")) is RankLauncher.PMIX
    assert rank_launcher(_spec(dist={"rank_launcher": "agent"}),
                         _site(rank_launcher="pmix")) is RankLauncher.AGENT


def test_a_spec_without_the_choice_keeps_its_digest() -> None:
    assert _spec().spec_id == _spec(dist={"rank_launcher": None}).spec_id
    assert _spec().spec_id != _spec(**PMIX).spec_id


@pytest.mark.parametrize(("spec", "site", "backend", "match"), [
    (_spec(**PMIX), _site(), Backend.LOCAL, r"dist.rank_launcher is pmix but the run's backend "
                                            r"is local.*needs Slurm.*dist.rank_launcher: agent"),
    (RunSpec.from_dict({"name": "t", "script": "train.py", **PMIX}), _site(), Backend.SLURM,
     r"runs a script.*set dist.rank_launcher: agent"),
    (_spec(), _site(rank_launcher="pmix"), Backend.LOCAL, r"site 's' rank_launcher is pmix"),
    (_spec(**PMIX), _site(container={"runtime": "apptainer", "image": "/i.sif"}), Backend.SLURM,
     r"in a container \(apptainer image /i.sif\).*dist.rank_launcher: agent"),
])
def test_submit_refuses_pmix_where_it_cannot_run(spec: RunSpec, site: SiteConfig,
                                                 backend: Backend, match: str) -> None:
    problem = rank_launcher_problem(spec, site, backend)
    assert problem is not None and "\n" not in problem
    assert re.search(match, problem), problem
    (finding,) = rank_launcher_findings(spec, site, backend)
    assert isinstance(finding, Problem)


def test_pmix_on_slurm_passes_and_agent_adds_nothing() -> None:
    (finding,) = rank_launcher_findings(_spec(**PMIX), _site(), Backend.SLURM)
    assert isinstance(finding, Passed) and "srun --mpi=pmix" in finding.what
    assert rank_launcher_findings(_spec(), _site(), Backend.LOCAL) == []


def test_the_step_places_k_tasks_on_each_gang_node_in_blocks() -> None:
    argv = mpi_step_argv(job_id="42", nodes=("n1", "n3"), tasks_per_node=4, python=["py"],
                         run_dir="/r", generation=3, attempt=1, output="/r/logs/%N/x",
                         wait_s=360.0)
    assert argv[:3] == ["srun", "--mpi=pmix", "--overlap"]
    for flag in ("--jobid=42", "--ntasks-per-node=4", "--nodelist=n1,n3",
                 "--distribution=block", "--kill-on-bad-exit=0", "--output=/r/logs/%N/x"):
        assert flag in argv
    assert argv[argv.index("-N") + 1] == "2" and argv[argv.index("-n") + 1] == "8"
    assert argv[argv.index("py"):] == ["py", "-m", "hpcrun.runtime.rank.mpitask", "--run-dir",
                                       "/r", "--generation", "3", "--attempt", "1",
                                       "--wait-s", "360"]
