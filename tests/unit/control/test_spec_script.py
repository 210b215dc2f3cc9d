"""Script mode in the spec: exactly one way to start the ranks, paths inside the code dir."""

from __future__ import annotations

import pytest

from hpcrun.control.spec import RunSpec
from hpcrun.errors import SpecError


def test_a_script_spec_keeps_its_arguments_and_defaults_to_sigterm() -> None:
    spec = RunSpec.from_dict({"name": "ddp", "script": "examples/torchrun_ddp/train.py",
                              "args": ["--steps", "40"]})
    assert spec.script_mode and spec.args == ("--steps", "40")
    assert spec.preempt_signal == "SIGTERM"


def test_an_entrypoint_spec_keeps_its_digest_without_the_script_fields() -> None:
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    assert not spec.script_mode
    assert not {"script", "args", "command", "preempt_signal"} & set(spec.to_dict())


def test_signal_names_are_normalised() -> None:
    spec = RunSpec.from_dict({"name": "t", "command": ["python", "t.py"],
                              "preempt_signal": "usr1"})
    assert spec.preempt_signal == "SIGUSR1" and spec.to_dict()["preempt_signal"] == "SIGUSR1"


@pytest.mark.parametrize(("raw", "key", "found"), [
    ({"script": "t.py", "entrypoint": "m:f"}, "entrypoint", "entrypoint, script"),
    ({"script": "t.py", "command": ["python", "t.py"]}, "entrypoint", "script, command"),
    ({"script": "../outside.py"}, "script", "../outside.py"),
    ({"script": "/abs/train.py"}, "script", "/abs/train.py"),
    ({"entrypoint": "m:f", "args": ["--x"]}, "args", "--x"),
    ({"command": ["python", ""]}, "command", "''"),
    ({"script": "t.py", "preempt_signal": "KILL"}, "preempt_signal", "KILL"),
])
def test_bad_script_fields_name_the_key_and_the_value(raw: dict, key: str, found: str) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({"name": "t", **raw})
    assert f"{key}: expected" in str(info.value) and found in str(info.value)
