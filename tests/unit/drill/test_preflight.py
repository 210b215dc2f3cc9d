"""Preflight checks that run in-process, the canary's plan, mixture accounting, tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcrun.cli.main import cli
from hpcrun.drill.contracts import ContractResult
from hpcrun.drill.matrix import row_for
from hpcrun.drill.preflight import (
    admission_rows,
    canary_plan,
    checkpoint_check,
    mixture_error,
    storage_check,
    telemetry_check,
)
from hpcrun.drill.render import check_table, matrix_table
from hpcrun.drill.runner import DrillResult
from hpcrun.runtime.faults import parse_injections
from hpcrun.testing.runs import tiny_spec, write_spec
from tests.unit.launch.admission_cases import BROKEN, broken_manifest, small_dataset


def _meta(counts: list[int], draw: int) -> dict[str, object]:
    return {"data": {"state": {"layout": {"mixture": {"weights": [2.0, 1.0]}},
                               "position": {"batch": 3, "mixture": {"counts": counts,
                                                                   "draw": draw}}}}}


def test_mixture_error_is_the_largest_quota_deviation() -> None:
    assert mixture_error(_meta([6, 3], 9)) == 0.0
    assert abs((mixture_error(_meta([7, 2], 9)) or 0) - 1.0) < 1e-9
    assert mixture_error({"data": {"state": {}}}) is None and mixture_error({}) is None


def test_canary_plan_forces_a_commit_a_stop_and_a_restore() -> None:
    spec, inject, total = canary_plan({"checkpoint": {"every_steps": 4}, "config": {"lr": 1}},
                                      None)
    assert total == 10 and spec["config"] == {"lr": 1, "ledger": True, "steps": 10}
    assert spec["checkpoint"]["every_steps"] == 4
    kinds = [(i.kind.value, i.step) for i in parse_injections(inject)]
    assert kinds == [("preempt", 5), ("slow", 5)]
    assert canary_plan({}, 3)[2] == 11  # too few steps for the stop to land: raised


def test_storage_checkpoint_and_telemetry_checks_pass_on_a_local_disk(tmp_path: Path) -> None:
    store = storage_check("scratch", tmp_path / "tier", nbytes=4 << 20)
    assert store.ok and "MB/s" in store.detail
    assert list((tmp_path / "tier").iterdir()) == []  # the probe file is removed
    ckpt = checkpoint_check(tmp_path)
    assert ckpt.ok, ckpt.detail
    assert telemetry_check(tmp_path).ok


def test_tables_mark_each_contract_and_skipped_rows() -> None:
    ran = DrillResult(row=row_for("rank-kill"), backend="local", contracts=(
        ContractResult(name="exit", ok=True, detail="SUCCEEDED"),
        ContractResult(name="samples", ok=False, detail="1 missing")))
    skipped = DrillResult(row=row_for("preempt-timelimit"), backend="local",
                          skipped="needs slurm")
    text = matrix_table([ran, skipped])
    lines = text.splitlines()
    assert lines[2].split()[:4] == ["rank-kill", "local", "FAIL", "ok"]
    assert lines[3].split()[:3] == ["preempt-timelimit", "local", "n/a"]
    assert "needs slurm" in lines[3]
    assert "FAIL" in check_table([ContractResult(name="x", ok=False, detail="d")])


@pytest.mark.parametrize("kind", ["json-list", "truncated", "empty-object"])
def test_preflight_of_a_broken_manifest_is_a_failed_row_not_a_traceback(
        tmp_path: Path, kind: str) -> None:
    bad = broken_manifest(small_dataset(tmp_path / "data"), kind)
    spec = write_spec(tmp_path / "run.yaml", tiny_spec(manifest=bad))
    out = CliRunner(env={"HPCRUN_RUNS": str(tmp_path / "runs"), "HOME": str(tmp_path)}).invoke(
        cli, ["preflight", str(spec), "--backend", "slurm"])
    assert isinstance(out.exception, SystemExit) and out.exit_code == 1, out.output
    rows = {ln.split()[0]: ln for ln in out.output.splitlines() if ln.strip()}
    assert "FAIL" in rows["data"] and f"{bad}: " in rows["data"] and BROKEN[kind] in rows["data"]
    assert "ok" in rows["spec"].split() and "ok" in rows["telemetry"].split()


def test_preflight_runs_the_admission_checks_and_hashes_every_object(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path / "data", n=12)
    spec = write_spec(tmp_path / "run.yaml", tiny_spec(manifest=manifest,
                                                       entrypoint="examples.nope:main"))
    rows, admitted = admission_rows(spec, backend="slurm")
    by_name: dict[str, list[ContractResult]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    assert admitted.spec is not None and "storage" not in by_name
    assert any(r.ok is False and "'examples.nope' is not importable" in r.detail
               for r in by_name["entrypoint"])
    assert [r.ok for r in by_name["data"]] == [True]
    assert "12 objects present, 12 hashed in full (all)" in by_name["data"][0].detail
