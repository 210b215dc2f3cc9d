"""``hpcrun sweep --dry-run``: every check, the array script and the points, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.control.sweep import (
    SweepPlan,
    expand_points,
    parse_grid_option,
    point_specs,
    render_points,
)
from hpcrun.errors import SpecError
from tests.unit.launch.admission_cases import small_dataset

BASE = {"name": "lm", "entrypoint": "m:f", "config": {"lr": 0.01, "seed": 0, "steps": 10}}


def test_the_points_table_has_one_row_per_array_task_with_its_values() -> None:
    plan = SweepPlan(grid=(parse_grid_option("config.lr=1e-3,3e-3"),),
                     points=({"config.seed": 7},))
    points = expand_points(plan, max_points=1000)
    specs = point_specs(BASE, points, base_dir=Path("."))
    rows = [line.split() for line in render_points(points, specs).splitlines()]
    assert rows[0] == ["task", "config.lr", "config.seed", "spec"]
    assert [r[:3] for r in rows[1:]] == [["0", "0.001", "-"], ["1", "0.003", "-"],
                                         ["2", "-", "7"]]
    assert [r[3] for r in rows[1:]] == [s.spec_id.split(":")[1][:12] for s in specs]


def _spec(tmp_path: Path) -> Path:
    manifest = small_dataset(tmp_path / "data")
    spec = tmp_path / "run.yaml"
    spec.write_text("name: lm\nentrypoint: examples.tiny_lm.train:main\n"
                    f"data: {{manifest: {manifest}, seed: 1, global_batch: 2}}\n"
                    "config: {lr: 0.01, seed: 0, steps: 10}\n")
    return spec


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_a_dry_run_prints_the_script_and_the_points_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        backend: str) -> None:
    from hpcrun.cli.main import main

    spec, runs, index = _spec(tmp_path), tmp_path / "runs", tmp_path / "index"
    monkeypatch.setenv("HPCRUN_RUNS", str(index))
    monkeypatch.chdir(Path(__file__).resolve().parents[3])  # the checkout: the entrypoint's code
    site = ["--site", "testbed"] if backend == "slurm" else []
    try:
        main(["sweep", str(spec), "--grid", "config.lr=1e-3,3e-3", "--grid", "config.seed=0,1",
              "--max-parallel", "2", "--backend", backend, *site, "--runs-root", str(runs),
              "--dry-run"])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    out = capsys.readouterr().out
    table = out[out.index("\ntask ") + 1:].splitlines()
    assert len(table) == 5 and table[1].split()[:3] == ["0", "0.001", "0"]
    if backend == "slurm":
        assert out.startswith("#!/bin/bash") and "#SBATCH --array=0-3%2" in out
    else:
        assert "4 points" in out and "at most 2 running at once" in out
    assert not runs.exists() and not index.exists()  # no sweep, no run, no link


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_point_submit_would_refuse_is_refused_with_its_index_and_nothing_is_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        dry_run: bool) -> None:
    from hpcrun.cli.main import main

    spec, runs, index = _spec(tmp_path), tmp_path / "runs", tmp_path / "index"
    monkeypatch.setenv("HPCRUN_RUNS", str(index))
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(spec), "--grid", "dist.backend=gloo,nccl", "--backend", "local",
              "--runs-root", str(runs), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert exc.value.code not in (0, None), err
    assert "sweep not submitted, nothing was created: 1 problem in its points" in err
    [line] = [ln for ln in err.splitlines() if ln.startswith("  point ")]
    assert line.startswith("  point 1 (dist.backend=nccl): ") and "nccl" in line[30:], err
    assert not runs.exists() and not index.exists()


def test_any_field_of_the_spec_schema_is_a_sweep_key_set_in_the_base_or_not() -> None:
    points = [{"sdc.every_steps": 50, "dist.step_timeout_s": 90, "checkpoint.checksum": "sha256"}]
    [spec] = point_specs(BASE, points, base_dir=Path("."))
    assert (spec.sdc.every_steps, spec.dist.step_timeout_s) == (50, 90)
    assert str(spec.checkpoint.checksum) == "sha256"
    with pytest.raises(SpecError, match=r"sweep key 'config\.lrr' is not in"):
        point_specs(BASE, [{"config.lrr": 1}], base_dir=Path("."))
    with pytest.raises(SpecError, match=r"sweep key 'dist\.bakend' is not in"):
        point_specs(BASE, [{"dist.bakend": "gloo"}], base_dir=Path("."))
