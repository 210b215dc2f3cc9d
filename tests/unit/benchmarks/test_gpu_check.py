"""The device check's CPU parts: arguments, the tensor plan, the figures, the measurements' logic
on CPU tensors, the GPU run's spec and site, and the clean skip without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.gpu.check import (
    EXAMPLES,
    GIB,
    MIB,
    _site_dir,
    _tiny_spec,
    figures_markdown,
    main,
    make_state,
    measure_restore,
    measure_staging,
    parse_args,
    plan_tensors,
)
from hpcrun.control.spec import RunSpec
from hpcrun.launch.gpu import backend_problem, needed_gpus, rank_environ
from hpcrun.launch.site import load_site


def test_arguments_default_to_the_issue_figures_and_quick_shrinks_them() -> None:
    args = parse_args([])
    assert (args.steps, args.ckpt_gib, args.tensor_mib) == (200, 4.0, 256.0)
    quick = parse_args(["--quick"])
    assert quick.steps < 200 and quick.ckpt_gib < 1 and quick.repeats == 1
    with pytest.raises(SystemExit):
        parse_args(["--steps", "10", "--preempt-at", "10"])


def test_tensor_plan_covers_the_bytes_in_bounded_pieces() -> None:
    shapes = plan_tensors(4 * GIB, 256 * MIB)
    sizes = [r * c * 2 for r, c in shapes]
    assert sum(sizes) == 4 * GIB and len(shapes) == 16 and max(sizes) == 256 * MIB
    odd = plan_tensors(10 * MIB + 3, 4 * MIB)
    odd_sizes = [r * c * 2 for r, c in odd]
    assert sum(odd_sizes) >= 10 * MIB + 3 and odd_sizes[-1] < 4 * MIB
    assert plan_tensors(1, 4 * MIB) == [(1, 4096)]


def test_figures_mark_each_target() -> None:
    md = figures_markdown({
        "device": "NVIDIA H200", "nccl_init": {"init_s": 1.5, "allreduce_ok": True},
        "tiny_example": {"steps": 200, "preempt_at": 80, "bitwise_identical": True},
        "staging": {"hpcrun_s": 0.33, "pinned_copy_s": 0.30, "ratio": 1.1},
        "restore": {"hpcrun_gbs": 20.0, "pinned_h2d_gbs": 25.0, "peak_extra_bytes": 300 * MIB,
                    "largest_tensor_bytes": 256 * MIB, "peak_ratio": 300 / 256}})
    assert "# GPU device check (NVIDIA H200)" in md
    assert "- tiny_lm on the GPU, 200 steps, preempted at step 80 and resumed: final state " \
        "bitwise-identical (met)" in md
    assert "- fsdp_lm on the GPU, - steps, preempted at step - and resumed: final state not " \
        "measured (n/a)" in md
    assert "| exposed pause (s) | 0.33 | 0.3 | 1.1 | <= 1.2x | met |" in md
    assert "| peak extra GPU memory (MiB) | 300 | 256 | 1.17 | <= largest tensor + 1% | NOT met |" \
        in md
    failed = figures_markdown({"tiny_example": {"error": "RuntimeError: x"},
                               "staging": {"error": "OOM"}})
    assert "differs (NOT met): RuntimeError: x" in failed and "staging failed: OOM" in failed


def test_measurements_run_on_cpu_tensors() -> None:
    state = make_state(plan_tensors(2 * MIB, MIB // 2), torch.device("cpu"))
    staged = measure_staging(state, repeats=1)
    assert staged["bytes"] == 2 * MIB and staged["hpcrun_s"] > 0 and not staged["buffer_pinned"]
    restored = measure_restore(state, repeats=1)
    assert restored["bitwise_identical"] and restored["largest_tensor_bytes"] == MIB // 2
    assert restored["peak_ratio"] is None  # no device memory to measure on the CPU


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_gpu_runs_spec_and_site_are_valid(tmp_path: Path, example: str) -> None:
    spec = RunSpec.from_dict(_tiny_spec(tmp_path / "manifest.json", 200, example))
    assert spec.entrypoint == f"examples.{example}.train:main"
    site = load_site(str(_site_dir(tmp_path) / "gpu-check.yaml"))
    assert backend_problem(spec, site) is None and needed_gpus(spec, site) == 1
    env = rank_environ(spec, site, diagnostics_dir=tmp_path)
    assert env["HPCRUN_DIST_BACKEND"] == "nccl" and spec.config["deterministic"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_check_is_skipped_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("skipped: no CUDA")
