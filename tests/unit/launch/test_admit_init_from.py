"""``checkpoint.init_from`` at submit: the spec wants an absolute path; admission checks it exists,
is DCP or safetensors and its files can be read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hpcrun.checkpoint.export_safetensors import write_file
from hpcrun.control.spec import RunSpec
from hpcrun.errors import SpecError
from hpcrun.launch.admission import CheckKind, Passed, Problem
from hpcrun.launch.admit import probe_init_from
from hpcrun.testing.runs import tiny_spec


def _spec(init_from: str | None) -> RunSpec:
    raw = tiny_spec(manifest=Path("/unused"), checkpoint={"init_from": init_from})
    raw["data"].pop("manifest")
    return RunSpec.from_dict(raw)


def test_no_init_from_is_no_finding() -> None:
    assert probe_init_from(_spec(None)) == []


def test_a_relative_path_is_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match=r"init_from.*an absolute path"):
        _spec("exports/model.safetensors")


def test_a_safetensors_source_passes(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_file(path, [("w", torch.ones(3))], {"format": "pt"})
    [found] = probe_init_from(_spec(str(path)))
    assert isinstance(found, Passed) and found.check == CheckKind.SPEC
    assert f"{path} is safetensors (1 files)" in found.what


def test_a_missing_or_foreign_source_is_one_problem(tmp_path: Path) -> None:
    [missing] = probe_init_from(_spec(str(tmp_path / "gone")))
    assert isinstance(missing, Problem) and "no such file or directory" in missing.what
    (tmp_path / "weights.pt").write_bytes(b"\x80\x04pickle")
    [foreign] = probe_init_from(_spec(str(tmp_path / "weights.pt")))
    assert isinstance(foreign, Problem) and "neither a DCP directory" in foreign.what


def test_an_unreadable_source_is_one_problem(tmp_path: Path) -> None:
    locked = tmp_path / "locked.safetensors"
    write_file(locked, [("w", torch.ones(3))], {})
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as a user who reads any file (root)")
        [unreadable] = probe_init_from(_spec(str(locked)))
        assert isinstance(unreadable, Problem) and "cannot read" in unreadable.what
    finally:
        locked.chmod(0o600)
