"""`hpcrun drill`, `hpcrun drill --restore`, `hpcrun preflight` and `hpcrun canary` on the
local backend, through the real CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcrun.drill.matrix import MATRIX, DrillFault, MatrixRow
from hpcrun.testing.runs import write_spec
from tests.integration.local_helpers import cli, local_spec


def _spec(tmp_path: Path, **overrides: object) -> Path:
    return write_spec(tmp_path / "run.yaml", local_spec(steps=30, every_steps=10, **overrides))


def _run_dir(stdout: str) -> Path:
    match = re.search(r"run: (\S+)", stdout)
    assert match, stdout
    return Path(match.group(1))


@pytest.mark.slow
def test_rank_kill_drill_passes_and_its_run_passes_the_restore_drill(tmp_path: Path) -> None:
    out = cli(tmp_path, "drill", str(_spec(tmp_path)), "--fault", "rank-kill")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "drill rank-kill on local: PASS" in out.stdout
    for contract in ("exit", "cause", "recovery", "state", "rpo", "samples", "cursor",
                     "fencing", "checkpoints"):
        assert re.search(rf"^{contract}\s+ok\s", out.stdout, re.M), (contract, out.stdout)
    assert re.search(r"^process_crash\s+1\s", out.stdout, re.M), out.stdout  # the RTO split

    restore = cli(tmp_path, "drill", "--restore", str(_run_dir(out.stdout)))
    assert restore.returncode == 0, restore.stdout + restore.stderr
    for check in ("latest → 2 ranks", "latest → 1 ranks", "latest → 4 ranks",
                  "reject truncated manifest", "reject bit-flipped shard",
                  "reject missing shard"):
        assert re.search(rf"^{re.escape(check)}\s+ok\s", restore.stdout, re.M), (
            check, restore.stdout)


def test_preflight_checks_everything_on_the_local_machine(tmp_path: Path) -> None:
    spec = _spec(tmp_path, nodes=3, tasks_per_node=1, data={"global_batch": 6})
    out = cli(tmp_path, "preflight", str(spec))
    for check in ("spec", "site", "entrypoint", "data", "process group", "shared tier",
                  "node-local tier", "checkpoint round trip", "telemetry"):
        assert re.search(rf"^{check}\s+ok\s", out.stdout, re.M), (check, out.stdout)
    assert re.search(r"^state registration\s+ok\s+ctx.restore accepted data, model, optim on "
                     r"all 3 ranks", out.stdout, re.M), out.stdout
    assert re.search(r"write \d+ MB/s", out.stdout)
    # three emulated nodes, every pair measured, the slowest named against the median; they
    # share one loopback, so only a loaded machine stretches a pair, and the verdict says so
    links = re.search(r"^node links\s+(\S+)\s+3 nodes, 3 pairs \(gloo, 4 MiB\): median pair "
                      r"[\d.]+ GB/s; slowest local\d<->local\d [\d.]+ GB/s \(([\d.]+)× "
                      r"below median\)", out.stdout, re.M)
    assert links, out.stdout
    times = float(links.group(2))
    if abs(times - 2.0) > 0.05:  # the printed ratio is rounded
        assert links.group(1) == ("FAIL" if times > 2.0 else "ok"), out.stdout
    assert out.returncode == (1 if links.group(1) == "FAIL" else 0), out.stdout + out.stderr


def test_preflight_refuses_state_the_checkpointer_cannot_save_before_any_step(
        tmp_path: Path) -> None:
    """The spec's own main(ctx) registers a tensor subclass hpcrun cannot save: preflight's
    registration row fails naming the state path and the way out; no training step ran."""
    spec = write_spec(tmp_path / "run.yaml", local_spec(
        entrypoint="tests.integration.unsaveable:main", steps=30,
        nodes=1, tasks_per_node=2))
    out = cli(tmp_path, "preflight", str(spec))
    row = re.search(r"^state registration\s+FAIL\s+(.*)$", out.stdout, re.M)
    assert row and out.returncode == 1, out.stdout + out.stderr
    assert "FAILED before ctx.restore returned on every rank" in row.group(1)
    assert "'extra/odd'" in row.group(1), row.group(1)


def test_drill_list_names_every_fault_and_where_it_runs(tmp_path: Path) -> None:
    out = cli(tmp_path, "drill", "--list")
    assert out.returncode == 0, out.stderr
    for row in MATRIX:
        assert re.search(rf"^{re.escape(row.fault.value)}\s+\S+\s+", out.stdout, re.M), row


def test_drill_without_a_fault_is_one_clear_error(tmp_path: Path) -> None:
    out = cli(tmp_path, "drill", str(_spec(tmp_path)))
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "--fault" in out.stderr


@pytest.mark.slow
def test_canary_commits_restores_and_accounts_for_the_mixture(tmp_path: Path) -> None:
    out = cli(tmp_path, "canary", str(_spec(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    for check in ("steps", "checkpoint commit", "restore", "samples", "mixture accounting"):
        assert re.search(rf"^{check}\s+ok\s", out.stdout, re.M), (check, out.stdout)


_LOCAL_ROWS = [r for r in MATRIX if "local" in r.backends and r.fault != DrillFault.RANK_KILL]
"""The matrix rows ``hpcrun drill --all`` runs on the local backend (rank-kill is the first test
here, with its restore drill); one test each, so the pytest workers share them."""


@pytest.mark.slow
@pytest.mark.parametrize("row", _LOCAL_ROWS, ids=[r.fault.value for r in _LOCAL_ROWS])
def test_every_local_row_of_the_matrix_passes_its_drill(tmp_path: Path, row: MatrixRow) -> None:
    out = cli(tmp_path, "drill", str(_spec(tmp_path)), "--fault", row.fault.value)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"drill {row.fault.value} on local: PASS" in out.stdout, out.stdout
