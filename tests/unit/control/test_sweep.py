"""Sweeps: points from a grid and a list, one clear error per bad input, the array mapping."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hpcrun.control.sweep import (
    SweepIndex,
    SweepPlan,
    SweepPoint,
    array_flag,
    array_task_run_dir,
    expand_points,
    load_sweep_file,
    parse_grid_option,
    point_specs,
    read_sweep_index,
    write_sweep_index,
)
from hpcrun.errors import RecordError, SpecError
from hpcrun.launch.sbatch import render_sbatch
from hpcrun.launch.site import load_site
from hpcrun.launch.sweep_local import run_bounded

BASE = {"name": "lm", "entrypoint": "m:f", "config": {"lr": 0.01, "seed": 0, "steps": 10}}


def test_grid_options_read_values_as_yaml() -> None:
    assert parse_grid_option("config.lr=1e-3,3e-3") == ("config.lr", (0.001, 0.003))
    assert parse_grid_option("config.seed=0,1,2") == ("config.seed", (0, 1, 2))
    for bad in ("config.lr=", "config.lr", "=1,2"):
        with pytest.raises(SpecError, match="expected KEY=V1,V2"):
            parse_grid_option(bad)


def test_points_are_the_grid_product_then_the_list() -> None:
    plan = SweepPlan(grid=(("config.lr", (0.001, 0.003)), ("config.seed", (0, 1, 2))),
                     points=({"config.lr": 0.1, "config.seed": 9},))
    points = expand_points(plan, max_points=1000)
    assert len(points) == 7 and points[0] == {"config.lr": 0.001, "config.seed": 0}
    assert points[2] == {"config.lr": 0.001, "config.seed": 2} and points[6]["config.seed"] == 9
    specs = point_specs(BASE, points, base_dir=Path("."))
    assert [s.config["lr"] for s in specs][:4] == [0.001, 0.001, 0.001, 0.003]
    assert len({s.spec_id for s in specs}) == 7 and specs[0].config["steps"] == 10


def test_an_empty_grid_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match="the sweep is empty"):
        expand_points(SweepPlan(), max_points=1000)


def test_a_grid_key_not_in_the_spec_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match=r"sweep key 'config\.lrate' is not in run\.yaml "
                                        r"\('lrate' not found; there: lr, seed, steps\)"):
        point_specs(BASE, [{"config.lrate": 1}], base_dir=Path("."))


def test_duplicate_points_are_one_clear_error() -> None:
    plan = SweepPlan(grid=(("config.seed", (0, 1)),), points=({"config.seed": 1},))
    with pytest.raises(SpecError, match="sweep points 1 and 2 are the same run"):
        point_specs(BASE, expand_points(plan, max_points=1000), base_dir=Path("."))


def test_sweep_yaml_grid_and_list_forms(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text(
        "sweep:\n  spec: run.yaml\n  grid:\n    config.lr: [0.001, 0.003]\n"
        "  points:\n    - {config.seed: 5}\n  max_parallel: 2\n")
    base, plan = load_sweep_file(tmp_path / "sweep.yaml")
    assert base == tmp_path / "run.yaml" and plan.max_parallel == 2
    assert expand_points(plan, max_points=1000) == [{"config.lr": 0.001}, {"config.lr": 0.003},
                                   {"config.seed": 5}]
    (tmp_path / "bad.yaml").write_text("sweep:\n  spec: run.yaml\n  grid:\n    config.lr: []\n")
    with pytest.raises(SpecError, match="expected at least one value"):
        load_sweep_file(tmp_path / "bad.yaml")


def test_the_array_flag_and_each_task_maps_to_its_points_run(tmp_path: Path) -> None:
    assert array_flag(6, 2) == "0-5%2" and array_flag(3, None) == "0-2"
    sweep_dir = tmp_path / "lm-sweep-1"
    sweep_dir.mkdir()
    index = SweepIndex(sweep_id="lm-sweep-1", max_parallel=2, points=tuple(
        SweepPoint(index=i, run_id=f"lm-sweep-1-{i:03d}", overrides={"config.seed": i})
        for i in range(3)))
    write_sweep_index(sweep_dir, index)
    assert read_sweep_index(sweep_dir) == index
    with pytest.raises(RecordError, match="already holds a sweep"):
        write_sweep_index(sweep_dir, index)
    got = array_task_run_dir(sweep_dir, {"SLURM_ARRAY_TASK_ID": "2"})
    assert got == tmp_path / "lm-sweep-1-002"
    assert array_task_run_dir(tmp_path / "plain", {}) == tmp_path / "plain"
    with pytest.raises(RecordError, match="a sweep runs as a job array"):
        array_task_run_dir(sweep_dir, {"SLURM_ARRAY_TASK_ID": "3"})


def test_the_array_script_carries_the_array_flag() -> None:
    from hpcrun.control.spec import RunSpec

    text = render_sbatch(RunSpec.from_dict(BASE), load_site("testbed"),
                         run_dir=Path("/r/lm-sweep-1"), op_id="o", array="0-5%2")
    assert "#SBATCH --array=0-5%2\n" in text and "--run-dir /r/lm-sweep-1" in text


def test_the_local_sweep_runs_at_most_max_parallel_points_at_once() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def start(run_dir: Path) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return 0

    dirs = [Path(f"p{i}") for i in range(6)]
    assert run_bounded(dirs, 2, start, threading.Event()) == [0] * 6 and peak[0] == 2
    stopped = threading.Event()
    stopped.set()
    assert run_bounded(dirs, 2, start, stopped) == [None] * 6


@pytest.mark.parametrize(("args", "message"), [
    ([], "the sweep is empty"),
    (["--grid", "config.nope=1,2"], "sweep key 'config.nope' is not in"),
    (["--grid", "config.seed=1,1"], "sweep points 0 and 1 are the same run"),
])
def test_bad_sweep_input_is_one_clear_error_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    from hpcrun.cli.main import main

    runs = tmp_path / "runs"
    monkeypatch.setenv("HPCRUN_RUNS", str(runs))
    spec = tmp_path / "run.yaml"
    spec.write_text("name: lm\nentrypoint: m:f\nconfig: {seed: 0}\n")
    with pytest.raises(SystemExit) as exited:
        main(["sweep", str(spec), "--runs-root", str(runs), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code != 0 and len(err) == 1 and message in err[0], err
    assert not runs.exists()


def test_an_array_task_is_named_by_its_element_id_and_sees_its_own_faults() -> None:
    from hpcrun.control.sweep import point_environ

    env = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "1",
           "HPCRUN_INJECT_POINT_1": "preempt@step=15", "HPCRUN_INJECT_POINT_3": "crash@step=2"}
    seen = point_environ(env, 1)
    assert seen["SLURM_JOB_ID"] == "5_1" and seen["HPCRUN_INJECT"] == "preempt@step=15"
    assert not any(k.startswith("HPCRUN_INJECT_POINT_") for k in seen)
    assert point_environ({"SLURM_JOB_ID": "9"}, 0) == {"SLURM_JOB_ID": "9"}
