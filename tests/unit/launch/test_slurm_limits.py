"""Admission against the partition's and the QoS's limits, over scontrol/sacctmgr/sbatch output.

The partition lines are the testbed's own (`scontrol --oneliner show partition`, Slurm 22.05.8)
plus a GPU partition written from the documented format; the integration test
`test_admission_slurm.py` runs the same checks against the live daemons.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hpcrun.launch.admission import Passed, Problem, Skipped
from hpcrun.launch.slurm_limits import (
    SACCTMGR_QOS_LIMITS,
    SCONTROL_NODES,
    SCONTROL_PARTITIONS,
    JobAsk,
    association_applies,
    check_partition_limits,
    check_tres_limits,
    limit_findings,
    parse_assoc_limits,
    parse_minutes,
    parse_node_gpus,
    parse_partition_limits,
    parse_qos_limits,
    parse_test_only,
    sbatch_test_only_argv,
)
from hpcrun.runner import CommandResult
from hpcrun.testing.fakes import FakeRunner

PARTITIONS = (
    "PartitionName=batch AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE GraceTime=15 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED "
    "MinNodes=0 Nodes=node[1-4] PriorityTier=1 State=UP TotalCPUs=16 TotalNodes=4\n"
    "PartitionName=small AllowGroups=ALL Default=NO QoS=N/A MaxNodes=2 MaxTime=00:05:00 "
    "Nodes=node[1-2] State=UP TotalCPUs=8 TotalNodes=2\n"
    "PartitionName=gpu Default=NO QoS=gpuqos MaxNodes=8 MaxTime=2-00:00:00 Nodes=g[01-08] "
    "State=UP TotalNodes=8\n")
NODES = (
    "NodeName=node1 Arch=x86_64 Gres=(null) NodeAddr=127.0.0.1 Partitions=batch,small State=IDLE\n"
    "NodeName=g01 Arch=x86_64 Gres=gpu:a100:4(S:0-1) Partitions=gpu State=IDLE\n"
    "NodeName=g02 Arch=x86_64 Gres=gpu:4 Partitions=gpu State=IDLE\n")
QOS = "normal||\nshort|00:10:00|node=2\ngpuqos|1-00:00:00|cpu=64,gres/gpu=16\n"
ASSOC = "root|||\nproj|gpu|12:00:00|node=4\n"


def _limits(name: str) -> object:
    return parse_partition_limits(PARTITIONS)[name]


@given(st.integers(0, 30), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_slurm_times_read_as_minutes_in_every_form(days: int, h: int, m: int, sec: int) -> None:
    up = 1 if sec else 0
    assert parse_minutes(f"{days}-{h:02d}:{m:02d}:{sec:02d}") == days * 1440 + h * 60 + m + up
    assert parse_minutes(f"{h}:{m:02d}:{sec:02d}") == h * 60 + m + up
    assert parse_minutes(f"{days}-{h}") == days * 1440 + h * 60
    assert parse_minutes(str(m)) == m


def test_unlimited_times_are_none() -> None:
    assert parse_minutes("UNLIMITED") is None and parse_minutes("INFINITE") is None
    assert parse_minutes("") is None and parse_minutes("soon") is None


def test_partitions_parse_with_their_limits() -> None:
    parts = parse_partition_limits(PARTITIONS)
    assert parts["batch"].default and parts["batch"].max_time_min is None
    assert parts["batch"].max_nodes is None and parts["batch"].total_nodes == 4
    assert (parts["small"].max_time_min, parts["small"].max_nodes) == (5, 2)
    assert parts["gpu"].max_time_min == 2880 and parts["gpu"].qos == "gpuqos"


def test_node_gpus_count_typed_and_untyped_gres() -> None:
    gpus = parse_node_gpus(NODES)
    assert gpus["node1"] == (0, frozenset({"batch", "small"}))
    assert gpus["g01"][0] == 4 and gpus["g02"][0] == 4


def test_a_job_inside_every_limit_passes() -> None:
    ask = JobAsk(partition="small", nodes=2, time_min=5)
    assert [type(f) for f in check_partition_limits(ask, _limits("small"), {})] == [Passed]


def test_each_partition_limit_is_one_line_naming_the_limit_the_value_and_the_fix() -> None:
    ask = JobAsk(partition="small", nodes=3, time_min=30, gpus_per_node=2)
    lines = [f.line() for f in check_partition_limits(ask, _limits("small"),
                                                       parse_node_gpus(NODES))]
    assert lines == [
        "scheduler: time limit over partition 'small''s MaxTime: the job asks for 30 min; "
        "expected at most 5 min; lower resources.time_limit_min (a long run goes on in segments: "
        "it requeues at each time limit)",
        "scheduler: more nodes than partition 'small''s MaxNodes: the job asks for 3 nodes; "
        "expected at most 2; lower resources.nodes (+ spare_nodes) or pick another partition",
        "scheduler: more nodes than partition 'small' has: the job asks for 3 nodes; expected at "
        "most 2; lower resources.nodes (+ spare_nodes) or pick a larger partition",
        "scheduler: more GPUs per node than partition 'small''s nodes have (their Gres): the job "
        "asks for 2 GPUs per node; expected at most 0; lower resources.gpus_per_node or pick a "
        "GPU partition"]


def test_gpus_per_node_within_the_partitions_gres_pass() -> None:
    ask = JobAsk(partition="gpu", nodes=2, time_min=60, gpus_per_node=4)
    assert all(isinstance(f, Passed) for f in
               check_partition_limits(ask, _limits("gpu"), parse_node_gpus(NODES)))


def test_qos_wall_nodes_and_gpus_per_job() -> None:
    qos = parse_qos_limits(QOS)
    assert check_tres_limits(JobAsk(nodes=4, time_min=600), qos["normal"], kind="QoS") == []
    short = [f.line() for f in check_tres_limits(JobAsk(nodes=3, time_min=11), qos["short"],
                                                  kind="QoS")]
    assert len(short) == 2 and "QoS 'short''s MaxWall" in short[0] and "11 min" in short[0]
    assert "MaxTRESPerJob: the job asks for 3 nodes; expected at most node=2" in short[1]
    gpu = check_tres_limits(JobAsk(nodes=5, gpus_per_node=4, time_min=60), qos["gpuqos"],
                            kind="QoS")
    assert [f.line() for f in gpu] == [
        "scheduler: more GPUs than QoS 'gpuqos''s MaxTRESPerJob: the job asks for 20 GPUs; "
        "expected at most gres/gpu=16; ask for fewer GPUs or pick another QoS"]


def test_associations_apply_by_account_and_partition() -> None:
    assocs = parse_assoc_limits(ASSOC)
    assert [a.name for a in assocs] == ["root", "proj@gpu"]
    assert association_applies("proj@gpu", JobAsk(account="PROJ", partition="gpu"))
    assert not association_applies("proj@gpu", JobAsk(account="proj", partition="batch"))
    assert not association_applies("root", JobAsk(account="proj"))
    assert association_applies("root", JobAsk())


def test_sbatch_test_only_passes_refuses_or_is_skipped() -> None:
    ok = parse_test_only(0, "sbatch: Job 3 to start at 2026-12-01T21:42:26 using 2 processors "
                            "on nodes node[1,4] in partition batch\n")
    assert isinstance(ok, Passed) and "to start at" in ok.what
    no = parse_test_only(1, "allocation failure: Requested node configuration is not available\n")
    assert isinstance(no, Problem)
    assert "Requested node configuration is not available" in no.line()
    assert isinstance(parse_test_only(127, "sbatch: command not found"), Skipped)
    assert isinstance(parse_test_only(1, "sbatch: error: Unable to contact slurm controller "
                                         "(connect failure)"), Skipped)


def test_the_test_only_call_keeps_what_the_job_asks_and_drops_where_it_writes() -> None:
    argv = sbatch_test_only_argv([("nodes", "2"), ("time", "5"), ("output", "/x/%j.out"),
                           ("requeue", ""), ("partition", "small")])
    assert argv == ["sbatch", "--test-only", "--nodes=2", "--time=5", "--requeue",
                    "--partition=small", "--wrap=true"]


def _cluster(test_only: CommandResult | None = None) -> FakeRunner:
    return FakeRunner({
        " ".join(SCONTROL_PARTITIONS): PARTITIONS, " ".join(SCONTROL_NODES): NODES,
        " ".join(SACCTMGR_QOS_LIMITS): QOS,
        "sacctmgr --noheader --parsable2 show associations": ASSOC,
        "sbatch --test-only": test_only or CommandResult(
            argv=("sbatch",), returncode=0, stdout="", stderr="sbatch: Job 1 to start at now")})


def test_every_limit_of_the_partition_the_qos_and_slurm_are_reported_together() -> None:
    ask = JobAsk(partition="small", qos="short", nodes=3, time_min=30)
    refused = CommandResult(argv=("sbatch",), returncode=1, stdout="",
                            stderr="sbatch: error: Batch job submission failed: Requested node "
                                   "configuration is not available")
    findings = limit_findings(ask, [("nodes", "3"), ("time", "30"), ("partition", "small")],
                              _cluster(refused), user="root")
    problems = [f.line() for f in findings if isinstance(f, Problem)]
    assert len(problems) == 6, problems  # MaxTime, MaxNodes, size, QoS wall, QoS nodes, Slurm
    assert problems[-1].startswith("scheduler: Slurm refuses the job: error: Batch job")


def test_the_default_partition_is_checked_when_the_job_names_none() -> None:
    findings = limit_findings(JobAsk(nodes=5), [("nodes", "5")], _cluster(), user="root")
    assert any("more nodes than partition 'batch' has" in f.line() for f in findings)


def test_without_slurm_clients_every_limit_check_is_skipped_never_failed() -> None:
    findings = limit_findings(JobAsk(nodes=99), [("nodes", "99")], FakeRunner(), user="root")
    assert findings and all(isinstance(f, Skipped) for f in findings), findings
