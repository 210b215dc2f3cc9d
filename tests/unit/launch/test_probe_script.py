"""Admission's script probe: a ``script:`` is a file inside the code directory; a ``command:``
is the user's own and is said to be unprobed, never refused."""

from __future__ import annotations

import sys
from pathlib import Path

from hpcrun.control.spec import RunSpec
from hpcrun.launch.admission import Passed, ProbeTarget, Problem, Skipped
from hpcrun.launch.admit import probe_script


def _spec(**mode: object) -> RunSpec:
    return RunSpec.from_dict({"name": "s", "site": "local", **mode})


def _probe(spec: RunSpec, code: Path) -> list[object]:
    return probe_script(spec, ProbeTarget(python=sys.executable, code_path=str(code)))


def test_a_script_in_the_project_passes(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "ddp.py").write_text("print('hi')\n")
    [found] = _probe(_spec(script="train/ddp.py"), tmp_path)
    assert isinstance(found, Passed) and "train/ddp.py" in found.what


def test_a_missing_script_is_refused_with_where_it_looked(tmp_path: Path) -> None:
    [found] = _probe(_spec(script="train.py"), tmp_path)
    assert isinstance(found, Problem)
    assert str(tmp_path / "train.py") in found.what and "submit from the project root" in found.fix


def test_a_script_linked_from_outside_the_project_is_refused(tmp_path: Path) -> None:
    """The spec already refuses ``..``; a symlink out of the project is caught here (the job
    runs a snapshot of the project, where the link's target is not)."""
    code = tmp_path / "project"
    code.mkdir()
    (tmp_path / "elsewhere.py").write_text("print('hi')\n")
    (code / "train.py").symlink_to(tmp_path / "elsewhere.py")
    [found] = _probe(_spec(script="train.py"), code)
    assert isinstance(found, Problem) and "outside the code directory" in found.what


def test_a_command_is_not_probed_and_says_so(tmp_path: Path) -> None:
    [found] = _probe(_spec(command=["bash", "run.sh"]), tmp_path)
    assert isinstance(found, Skipped) and "'bash' not probed" in found.what
