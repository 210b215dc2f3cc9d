"""Partition, account and QoS checks over sinfo/sacctmgr output in their documented formats."""

from __future__ import annotations

from pathlib import Path

from hpcrun.errors import SchedulerError
from hpcrun.launch.admission import Passed, Problem, Skipped
from hpcrun.launch.sbatch import sbatch_args
from hpcrun.launch.site import load_site
from hpcrun.launch.slurm_names import (
    SACCTMGR_QOS,
    SINFO_PARTITIONS,
    Association,
    SlurmAsk,
    check_account,
    check_partition,
    check_qos,
    parse_associations,
    parse_partitions,
    parse_qos_names,
    scheduler_findings,
)
from hpcrun.runner import CommandResult
from hpcrun.testing.fakes import FakeRunner
from tests.unit.launch.test_sbatch import make_spec

GOLDEN = Path(__file__).parent / "golden"
SINFO = (GOLDEN / "sinfo_partitions_documented.txt").read_text()
ASSOC = (GOLDEN / "sacctmgr_associations_documented.txt").read_text()
QOS = (GOLDEN / "sacctmgr_qos_documented.txt").read_text()


def _cluster(**answers: str | CommandResult) -> FakeRunner:
    base: dict[str, str | CommandResult] = {
        "sinfo": SINFO, "sacctmgr --noheader --parsable2 show associations": ASSOC,
        "sacctmgr --noheader --parsable2 show qos": QOS}
    base.update(answers)
    return FakeRunner(base)


def test_parsers_read_the_documented_formats() -> None:
    assert parse_partitions(SINFO) == {"batch", "high", "gpu", "debug"}
    assert parse_associations(ASSOC) == [
        Association(account="proj-ml", partition="", qos=("normal", "long")),
        Association(account="proj-ml", partition="gpu", qos=("normal", "gpu-high")),
        Association(account="physics", partition="", qos=("normal",))]
    assert parse_qos_names(QOS) == {"normal", "long", "gpu-high", "debug"}
    assert parse_associations("garbage\n\n|x|y\n") == []


def test_the_ask_is_what_sbatch_would_be_given() -> None:
    site = load_site("generic-gpu")
    spec = make_spec(nodes=1, partition="debug", account="proj-ml", qos="long")
    ask = SlurmAsk.from_args(sbatch_args(spec, site, run_dir=Path("/r"), op_id="o"))
    assert ask == SlurmAsk(partition="debug", account="proj-ml", qos="long")
    default = SlurmAsk.from_args(sbatch_args(make_spec(), site, run_dir=Path("/r"), op_id="o"))
    assert default == SlurmAsk(partition="gpu")  # the site's default partition


def test_each_verdict() -> None:
    known = parse_partitions(SINFO)
    assocs = parse_associations(ASSOC)
    names = parse_qos_names(QOS)
    assert isinstance(check_partition("gpu", known), Passed)
    bad = check_partition("gpus", known)
    assert isinstance(bad, Problem) and "expected one of batch, debug, gpu, high" in bad.line()
    assert isinstance(check_account("PROJ-ML", assocs), Passed)  # the database is lower case
    wrong = check_account("chemistry", assocs)
    assert isinstance(wrong, Problem) and "one of physics, proj-ml" in wrong.line()
    assert isinstance(check_account("x", []), Skipped)
    assert isinstance(check_qos(SlurmAsk(qos="long", account="proj-ml"), names, assocs), Passed)
    missing = check_qos(SlurmAsk(qos="urgent"), names, assocs)
    assert isinstance(missing, Problem) and "QoS 'urgent' does not exist" in missing.what
    denied = check_qos(SlurmAsk(qos="long", account="physics"), names, assocs)
    assert isinstance(denied, Problem) and "not allowed for account 'physics'" in denied.what
    assert "expected one of normal" in denied.line()


def test_all_three_wrong_are_three_problems_and_the_queries_are_the_documented_ones() -> None:
    runner = _cluster()
    found = scheduler_findings(SlurmAsk(partition="gpus", account="chem", qos="urgent"), runner,
                               user="alice")
    assert [type(f) for f in found] == [Problem, Problem, Problem]
    assert runner.calls[0] == SINFO_PARTITIONS and runner.calls[-1] == SACCTMGR_QOS


def test_no_accounting_database_skips_account_and_qos_with_the_reason() -> None:
    down = CommandResult(argv=("sacctmgr",), returncode=1, stdout="",
                         stderr="sacctmgr: error: Problem talking to the database: "
                                "Connection refused")
    found = scheduler_findings(SlurmAsk(partition="batch", account="proj-ml", qos="long"),
                               FakeRunner({"sinfo": SINFO, "sacctmgr": down}), user="alice")
    assert isinstance(found[0], Passed) and isinstance(found[1], Skipped)
    assert "account 'proj-ml' and QoS 'long' not checked" in found[1].what
    assert "Problem talking to the database" in found[1].what


def test_no_slurm_client_skips_rather_than_refuses() -> None:
    def absent(argv: object) -> CommandResult:
        raise SchedulerError("command not found: 'sinfo'; install it or put it on PATH")

    found = scheduler_findings(SlurmAsk(partition="batch"), FakeRunner({"sinfo": absent}),
                               user="alice")
    assert [type(f) for f in found] == [Skipped, Passed, Passed]
    assert "command not found: 'sinfo'" in found[0].line()
    nothing = scheduler_findings(SlurmAsk(), FakeRunner(), user="alice")
    assert [type(f) for f in nothing] == [Passed]
