"""The link check between nodes: its schedule, verdict and srun line (pure), and its launcher
with a fake runner."""

from __future__ import annotations

import json
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrun.control.spec import RunSpec
from hpcrun.drill.linkcheck import (
    MARKER,
    link_verdict,
    pair_bandwidths,
    parse_result,
    partner,
    result_row,
    round_robin_rounds,
    slurm_link_check,
    srun_argv,
)
from hpcrun.errors import FormatError
from hpcrun.launch.site import site_from_dict
from hpcrun.runner import CommandResult
from hpcrun.testing import FakeRunner

SITE = {"name": "s", "node_local_path": "/l", "shared_path": "/s", "partition": "batch",
        "account": "proj", "env": {"GLOO_SOCKET_IFNAME": "lo"}}


def _spec(**resources: object) -> RunSpec:
    return RunSpec.from_dict({"name": "t", "entrypoint": "m:f",
                              "resources": {"nodes": 4, **resources}})


@given(st.integers(min_value=0, max_value=40))
def test_every_pair_is_measured_once_in_rounds_of_disjoint_pairs(n: int) -> None:
    rounds = round_robin_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(combinations(range(n), 2))  # each pair once, a < b
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))  # a node is in one pair at a time
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


def test_partner_is_the_other_end_or_none_for_the_node_sitting_out() -> None:
    first = round_robin_rounds(3)[0]
    assert [partner(first, r) for r in range(3)] == [None, 2, 1]


def test_the_row_names_the_median_and_the_slowest_pair() -> None:
    row = link_verdict({("n1", "n2"): 10.0, ("n1", "n3"): 12.0, ("n2", "n3"): 9.0})
    assert row.ok is True
    assert row.detail == ("median pair 10.00 GB/s; slowest n2<->n3 9.00 GB/s "
                          "(1.1× below median)")


def test_a_pair_below_half_the_median_fails_naming_both_nodes_and_the_fix() -> None:
    speeds = {pair: 20.0 for pair in combinations(("a", "b", "c", "d"), 2)}
    row = link_verdict({**speeds, ("b", "d"): 4.0})
    assert row.ok is False
    assert row.detail.startswith("median pair 20.00 GB/s; slowest b<->d 4.00 GB/s "
                                 "(5.0× below median); expected every pair at >= 0.5× the median")
    assert "resources.exclude" in row.detail
    assert link_verdict({**speeds, ("b", "d"): 10.0}).ok is True  # exactly half: passes
    assert link_verdict({("a", "b"): 0.0}).ok is False


def test_no_pair_is_a_skipped_row() -> None:
    assert link_verdict({}).ok is None


def test_bandwidth_of_a_two_rank_all_reduce_is_bytes_over_seconds() -> None:
    got = pair_bandwidths(["x", "y", "z"], {(0, 2): 0.5, (1, 2): 0.0}, 1_000_000_000)
    assert got == {("x", "z"): 2.0, ("y", "z"): 0.0}


def _line(pairs: list[list[float]]) -> str:
    return MARKER + json.dumps({"nodes": ["node1", "node2", "node3"], "pairs": pairs,
                                "nbytes": 4 << 20, "backend": "gloo"})


def test_the_result_line_is_found_among_other_output_and_turned_into_the_row() -> None:
    out = "warming up\n" + _line([[0, 1, 0.004], [0, 2, 0.004], [1, 2, 0.016]]) + "\n"
    row = result_row(parse_result(out))
    assert row.ok is False
    assert row.detail.startswith("3 nodes, 3 pairs (gloo, 4 MiB): median pair 1.05 GB/s; "
                                 "slowest node2<->node3 0.26 GB/s (4.0× below median)")
    with pytest.raises(FormatError, match=r"printed no result.*rank 1 died"):
        parse_result("rank 1 died\n")


def test_outside_an_allocation_srun_asks_for_the_specs_nodes_and_placement() -> None:
    site = site_from_dict({**SITE, "gpus_per_node": 8})
    argv = srun_argv(_spec(spare_nodes=1, gpus_per_node=4, qos="q", exclude=["n9"]), site,
                     python="/py", in_allocation=False)
    assert argv == ["srun", "--nodes=5", "--ntasks=5", "--ntasks-per-node=1",
                    "--kill-on-bad-exit=1", "--job-name=t-links", "--gpus-per-node=4",
                    "--partition=batch", "--account=proj", "--qos=q", "--exclude=n9",
                    "--time=5", "/py", "-m", "hpcrun.drill.linkcheck"]


def test_inside_an_allocation_it_is_a_step_and_the_sites_setup_runs_first() -> None:
    site = site_from_dict({**SITE, "modules": ["nccl/2"], "setup": ["source /v/bin/activate"]})
    argv = srun_argv(_spec(), site, python="/py", in_allocation=True)
    assert argv[:6] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=1", "--job-name=t-links"]
    assert not any(a.startswith(("--partition", "--time")) for a in argv)
    assert argv[6:] == ["bash", "-c", "set -e; module load nccl/2; source /v/bin/activate; "
                        "exec /py -m hpcrun.drill.linkcheck"]


def test_the_slurm_launcher_runs_srun_with_the_sites_env_and_reads_rank_0s_line() -> None:
    seen: dict[str, object] = {}

    class Runner(FakeRunner):
        def run(self, argv, *, input=None, env=None, timeout=None):  # type: ignore[no-untyped-def]
            seen["env"] = env
            return super().run(argv, input=input, env=env, timeout=timeout)

    ok = _line([[0, 1, 0.004], [0, 2, 0.005], [1, 2, 0.004]])
    runner = Runner({"srun": ok})
    site = site_from_dict({**SITE, "nccl_env": {"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": ""}})
    row = slurm_link_check(_spec(nodes=3), site, runner, environ={})
    assert row.ok is True and "slowest node1<->node3" in row.detail
    assert runner.calls[0][0] == "srun" and "--partition=batch" in runner.calls[0]
    assert seen["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "mlx5"}


def test_a_failed_step_is_a_failed_row_and_one_node_is_skipped() -> None:
    failed = CommandResult(argv=("srun",), returncode=1, stdout="",
                           stderr="srun: error: node3: task 2: Exited with exit code 1\n")
    row = slurm_link_check(_spec(), site_from_dict(SITE), FakeRunner({"srun": failed}),
                           environ={"SLURM_JOB_ID": "7"})
    assert row.ok is False and "exited 1: srun: error: node3: task 2" in row.detail
    single = slurm_link_check(_spec(nodes=1), site_from_dict(SITE), FakeRunner(), environ={})
    assert single.ok is None and "one node" in single.detail


def test_preflight_starts_no_allocation_when_a_scheduler_row_failed() -> None:
    from hpcrun.drill.contracts import ContractResult
    from hpcrun.drill.preflight import links_check
    from hpcrun.vocab import Backend

    refused = [ContractResult(name="scheduler", ok=False, detail="partition 'x' does not exist")]
    row = links_check(_spec(), site_from_dict(SITE), backend=Backend.SLURM, admitted=refused)
    assert row.ok is None and row.detail == "not started: a scheduler row above failed"
