"""Submit's Slurm checks against the real daemons: names (``sinfo``, ``sacctmgr``) and limits
(``scontrol show partition``, ``sacctmgr show qos``, ``sbatch --test-only``) as the testbed
prints them; the testbed configures a partition (``small``: 2 nodes, MaxTime 5, MaxNodes 2) and a
QoS (``short``: MaxWall 10, MaxTRESPerJob node=2) for these checks.
"""

from __future__ import annotations

import os

import pytest

from hpcrun.launch.admission import Passed, Problem, Skipped
from hpcrun.launch.slurm_limits import JobAsk, limit_findings
from hpcrun.launch.slurm_names import SINFO_PARTITIONS, SlurmAsk, parse_partitions, query
from hpcrun.launch.slurm_names import scheduler_findings as findings
from hpcrun.runner import SubprocessRunner
from hpcrun.testbed import Testbed
from hpcrun.testbed.config import LIMITED_MAX_TIME_MIN, LIMITED_PARTITION
from hpcrun.testing.runs import hpcrun
from tests.integration.helpers import REPO_ROOT, RunFactory, slurm_spec

pytestmark = pytest.mark.slurm


def test_the_testbeds_own_names_pass_and_typos_are_three_problems(testbed: Testbed) -> None:
    runner = SubprocessRunner({**os.environ, **testbed.env})
    text, why = query(runner, SINFO_PARTITIONS)
    assert text is not None, why
    assert parse_partitions(text) == {"batch", "high", LIMITED_PARTITION}
    good = findings(SlurmAsk(partition="batch", account="root", qos="normal"), runner,
                    user="root")
    assert not any(isinstance(f, Problem) for f in good), [f.line() for f in good]
    assert isinstance(good[0], Passed) and isinstance(good[-1], Passed)  # partition, QoS
    bad = findings(SlurmAsk(partition="bacth", account="no-such-account", qos="no-such-qos"),
                   runner, user="root")
    lines = [f.line() for f in bad]
    assert isinstance(bad[0], Problem) and "expected one of batch, high" in lines[0], lines
    assert isinstance(bad[-1], Problem) and "QoS 'no-such-qos' does not exist" in lines[-1]
    # root's association (created with the cluster) makes the account a problem; a database
    # without associations makes it a skipped note, never a pass
    assert not isinstance(bad[1], Passed), lines


def _dry_run(runs: RunFactory, spec: dict[str, object]) -> tuple[int, list[str]]:
    done = hpcrun("submit", str(runs.write(spec)), "--dry-run", "--backend", "slurm",
                  env=runs.env, cwd=REPO_ROOT, timeout=180)
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()


def test_a_spec_over_the_partitions_and_the_qos_limits_is_refused_at_submit_naming_each(
        testbed: Testbed, runs: RunFactory) -> None:
    over = slurm_spec(testbed, nodes=3, data={"global_batch": 12}, resources={
        "partition": LIMITED_PARTITION, "qos": "short", "time_limit_min": 30})
    rc, lines = _dry_run(runs, over)
    assert rc == 2, lines
    problems = [ln.strip() for ln in lines if ln.strip().startswith("scheduler:")]
    text = "\n".join(problems)
    assert f"over partition 'small''s MaxTime: the job asks for 30 min; expected at most " \
           f"{LIMITED_MAX_TIME_MIN} min" in text, lines
    assert "more nodes than partition 'small''s MaxNodes: the job asks for 3 nodes" in text
    assert "more nodes than partition 'small' has" in text
    assert "over QoS 'short''s MaxWall: the job asks for 30 min; expected at most 10 min" in text
    assert "QoS 'short''s MaxTRESPerJob: the job asks for 3 nodes; expected at most node=2" in text
    assert "Slurm refuses the job" in text  # sbatch --test-only's own word
    assert not [p for p in runs.runs_root.iterdir() if p.is_dir()]  # nothing created


def test_a_spec_inside_the_limits_passes_with_slurms_own_word(
        testbed: Testbed, runs: RunFactory) -> None:
    fits = slurm_spec(testbed, nodes=2, tasks_per_node=1, data={"global_batch": 8}, resources={
        "partition": LIMITED_PARTITION, "qos": "short", "time_limit_min": LIMITED_MAX_TIME_MIN})
    rc, lines = _dry_run(runs, fits)
    assert rc == 0, lines
    ask = JobAsk(partition=LIMITED_PARTITION, qos="short", nodes=2,
                 time_min=LIMITED_MAX_TIME_MIN)
    args = [("nodes", "2"), ("time", str(LIMITED_MAX_TIME_MIN)), ("partition", LIMITED_PARTITION),
            ("qos", "short")]
    found = limit_findings(ask, args, SubprocessRunner({**os.environ, **testbed.env}),
                           user="root")
    assert not [f for f in found if isinstance(f, Problem | Skipped)], [f.line() for f in found]
    assert any(f.what.startswith("sbatch --test-only: Job") for f in found), found
