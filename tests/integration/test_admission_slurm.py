"""Submit's Slurm name checks against the real daemons: the outputs of ``sinfo`` and
``sacctmgr`` that the unit tests take from the documented formats, as the testbed prints them.
"""

from __future__ import annotations

import os

import pytest

from hpcrun.launch.admission import Passed, Problem
from hpcrun.launch.slurm_names import SINFO_PARTITIONS, SlurmAsk, parse_partitions, query
from hpcrun.launch.slurm_names import scheduler_findings as findings
from hpcrun.runner import SubprocessRunner
from hpcrun.testbed import Testbed

pytestmark = pytest.mark.slurm


def test_the_testbeds_own_names_pass_and_typos_are_three_problems(testbed: Testbed) -> None:
    runner = SubprocessRunner({**os.environ, **testbed.env})
    text, why = query(runner, SINFO_PARTITIONS)
    assert text is not None, why
    assert parse_partitions(text) == {"batch", "high"}
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
