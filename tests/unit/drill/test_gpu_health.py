"""GPU health parsers and verdicts, on captured nvidia-smi and kernel-log text; the known-answer
matmul and the bandwidth arithmetic on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcrun.drill.gpu_health import (
    QUERY_ARGV,
    REMAP_ARGV,
    GpuStatus,
    bus_bandwidth_gbs,
    known_answer,
    matmul_check,
    node_verdict,
    parse_gpu_query,
    parse_remapped_rows,
    parse_xids,
    query_node,
    with_remaps,
)
from hpcrun.drill.preflight import gpu_checks
from hpcrun.testing import FakeRunner

GOLDEN = Path(__file__).parent / "golden"


def _text(name: str) -> str:
    return (GOLDEN / name).read_text()


def test_healthy_node_golden() -> None:
    gpus = parse_gpu_query(_text("nvsmi_query_healthy.csv"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[1] == GpuStatus(index=1, bus_id="00000000:2A:00.0", name="NVIDIA H100 80GB HBM3",
                                temperature_c=36, sm_clock_mhz=345, max_sm_clock_mhz=1980,
                                ecc_uncorrected=0, retired_pending=False)
    assert node_verdict("gpu001", gpus, []) == (
        True, "node gpu001: 4 GPU(s) healthy (NVIDIA H100 80GB HBM3, hottest 36 C)")


def test_sick_node_names_each_gpu_and_its_problems() -> None:
    gpus = with_remaps(parse_gpu_query(_text("nvsmi_query_sick.csv")),
                       parse_remapped_rows(_text("nvsmi_remapped_rows.csv")))
    assert gpus[2].ecc_uncorrected is None and gpus[2].retired_pending is None  # [N/A]
    xids = parse_xids(_text("dmesg_xid.txt"))
    assert xids == [("3a:00", 79), ("18:00", 13), ("5d:00", 63)]
    ok, line = node_verdict("gpu017", gpus, xids)
    assert not ok
    assert line == (
        "node gpu017: GPU1: 2 uncorrectable ECC error(s), a page retirement is pending (needs a "
        "GPU reset), a row remap is pending (needs a GPU reset), temperature 92 C above 85 C; "
        "GPU2: Xid 79 in the kernel log (GPU has fallen off the bus); GPU3: row remapping "
        "failed; quarantine it (add gpu017 to resources.exclude) and report it to the site")


def test_no_gpus_reported_is_a_failure() -> None:
    assert node_verdict("n1", [], []) == (False, "node n1: nvidia-smi reported no GPUs")


def test_query_node_goes_through_the_runner() -> None:
    runner = FakeRunner({" ".join(QUERY_ARGV[:2]): _text("nvsmi_query_healthy.csv"),
                         " ".join(REMAP_ARGV[:2]): _text("nvsmi_remapped_rows.csv")})
    gpus, xids, note = query_node(runner)
    assert len(gpus) == 4 and gpus[1].remap_pending and xids == []
    assert note == "kernel log not readable (Xids not checked)"


def test_preflight_on_a_node_without_gpus_skips_with_the_reason() -> None:
    if torch.cuda.is_available():
        pytest.skip("this node has GPUs")
    rows = gpu_checks(FakeRunner())
    assert [(r.name, r.ok) for r in rows] == [("gpu health", None)]
    assert "no GPU visible on" in rows[0].detail


def test_known_answer_matmul_is_exact_on_the_cpu() -> None:
    a, b, want = known_answer(64)
    assert torch.equal(want, (a @ b))  # type: ignore[operator]
    assert matmul_check(torch.device("cpu"), 64) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_known_answer_matmul_is_exact_on_the_gpu() -> None:
    assert matmul_check(torch.device("cuda", 0)) == 0


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_bandwidth_gbs(8 * 10**9, 1.0, 8) == pytest.approx(14.0)
    assert bus_bandwidth_gbs(10**9, 1.0, 1) == 0.0
    assert bus_bandwidth_gbs(10**9, 0.0, 4) == 0.0
