"""The curated public API: every advertised name resolves, and importing hpcrun stays cheap."""

from __future__ import annotations

import subprocess
import sys

import hpcrun

EXPECTED = {
    "Checkpointer", "CheckpointError", "Clock", "CommandRunner", "ConfigError", "DataError",
    "DataPipeline", "FakeClock", "FakeRunner", "HpcrunError", "Mixture", "Permutation",
    "RunContext", "RunSpec", "RunState", "SchedulerError", "SpecError", "StaleGenerationError",
    "Stateful", "StorageError", "__version__", "load_spec", "read_record",
    "submit", "sweep", "RunHandle", "SweepHandle",
}


def test_public_names_are_exactly_the_curated_set() -> None:
    assert set(hpcrun.__all__) == EXPECTED, (
        "the public API changed; update EXPECTED deliberately if the change is intended")


def test_every_public_name_resolves() -> None:
    for name in hpcrun.__all__:
        assert getattr(hpcrun, name) is not None, name


def test_errors_share_one_root_and_their_builtin() -> None:
    assert issubclass(hpcrun.SpecError, hpcrun.HpcrunError)
    assert issubclass(hpcrun.SpecError, ValueError)
    assert issubclass(hpcrun.StorageError, OSError)


def test_login_node_commands_do_not_import_torch() -> None:
    # torch costs seconds to import; `hpcrun status` on a login node must not pay for it
    code = "import sys, hpcrun, hpcrun.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
