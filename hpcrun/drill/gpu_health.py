"""GPU health for ``hpcrun preflight``: parsers and verdicts (pure), then the probes.

Per node (the one preflight runs on; under ``srun`` one per allocated node):

- ``nvidia-smi --query-gpu`` (CSV): uncorrectable ECC errors, pending page retirement,
  temperature, SM clock against its maximum; ``nvidia-smi --query-remapped-rows``: pending or
  failed row remapping (both need a GPU reset);
- Xid lines from the kernel log (``dmesg``), when this user may read it: the Xids that mean
  a broken GPU or link (:data:`FATAL_XIDS`);
- a deterministic matmul per GPU whose exact answer is known (:func:`known_answer`);
- an NCCL all-reduce across the node's GPUs, reported as bus bandwidth (the number NCCL's own
  tests print: algorithm bandwidth x 2(n-1)/n).

A failing GPU names its node; the row's fix says to quarantine it (``resources.exclude``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcrun.errors import HpcrunError
from hpcrun.runner import CommandRunner

GPU_FIELDS = ("index", "pci.bus_id", "name", "temperature.gpu", "clocks.sm", "clocks.max.sm",
              "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
"""``--query-gpu`` fields, in the order :func:`parse_gpu_query` reads them."""
QUERY_ARGV = ("nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.uncorrectable", "remapped_rows.pending",
                "remapped_rows.failure")
REMAP_ARGV = ("nvidia-smi", f"--query-remapped-rows={','.join(REMAP_FIELDS)}",
              "--format=csv,noheader,nounits")
XID_ARGV = ("dmesg", "--notime")
FATAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error", 64: "row remapping failed", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error",
}
"""Xids that mean the GPU (or its link) is broken, not the application."""
MAX_TEMPERATURE_C = 85
"""A GPU hotter than this at rest will throttle under load."""
_NA = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"}
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)[^)]*\): (\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuStatus:
    """One GPU's ``nvidia-smi`` health fields (None: not reported by this GPU or driver)."""

    index: int
    """The driver's GPU index."""
    bus_id: str
    """PCI bus id as nvidia-smi prints it (``00000000:18:00.0``)."""
    name: str
    """Product name."""
    temperature_c: int | None
    """Core temperature."""
    sm_clock_mhz: int | None
    """Current SM clock."""
    max_sm_clock_mhz: int | None
    """Maximum SM clock."""
    ecc_uncorrected: int | None
    """Uncorrectable ECC errors since the driver loaded."""
    retired_pending: bool | None
    """A page retirement waits for a reset."""
    remap_pending: bool | None = None
    """A row remap waits for a reset."""
    remap_failed: bool | None = None
    """Row remapping failed (the GPU is out of spare rows)."""


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in _NA else text


def _int(text: str) -> int | None:
    value = _value(text)
    try:
        return None if value is None else int(float(value))
    except ValueError:
        return None


def _yes(text: str) -> bool | None:
    value = _value(text)
    return None if value is None else value.lower() in ("yes", "1", "true")


def parse_gpu_query(text: str) -> list[GpuStatus]:
    """Rows of ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits``."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_FIELDS) or not cells[0].isdigit():
            continue
        out.append(GpuStatus(
            index=int(cells[0]), bus_id=cells[1], name=cells[2], temperature_c=_int(cells[3]),
            sm_clock_mhz=_int(cells[4]), max_sm_clock_mhz=_int(cells[5]),
            ecc_uncorrected=_int(cells[6]), retired_pending=_yes(cells[7])))
    return out


def parse_remapped_rows(text: str) -> dict[str, tuple[bool | None, bool | None]]:
    """``--query-remapped-rows`` → (pending, failed) per bus id."""
    out: dict[str, tuple[bool | None, bool | None]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(REMAP_FIELDS) or ":" not in cells[0]:
            continue
        out[_short_bus(cells[0])] = (_yes(cells[2]), _yes(cells[3]))
    return out


def _short_bus(bus_id: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00`` both → ``18:00`` (what Xid lines and nvidia-smi
    share)."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def with_remaps(gpus: Sequence[GpuStatus],
                remaps: Mapping[str, tuple[bool | None, bool | None]]) -> list[GpuStatus]:
    """The GPUs with their row-remapping state filled in (by bus id)."""
    from dataclasses import replace

    return [replace(g, remap_pending=remaps.get(_short_bus(g.bus_id), (None, None))[0],
                    remap_failed=remaps.get(_short_bus(g.bus_id), (None, None))[1])
            for g in gpus]


def parse_xids(kernel_log: str) -> list[tuple[str, int]]:
    """``(bus id, xid)`` of every ``NVRM: Xid`` line in a kernel log."""
    return [(_short_bus(m.group(1)), int(m.group(2))) for m in _XID_RE.finditer(kernel_log)]


def gpu_problems(gpu: GpuStatus, xids: Sequence[tuple[str, int]], *,
                 max_temperature_c: int = MAX_TEMPERATURE_C) -> list[str]:
    """What is wrong with one GPU (empty: healthy)."""
    problems = []
    if gpu.ecc_uncorrected:
        problems.append(f"{gpu.ecc_uncorrected} uncorrectable ECC error(s)")
    if gpu.retired_pending:
        problems.append("a page retirement is pending (needs a GPU reset)")
    if gpu.remap_pending:
        problems.append("a row remap is pending (needs a GPU reset)")
    if gpu.remap_failed:
        problems.append("row remapping failed")
    if gpu.temperature_c is not None and gpu.temperature_c > max_temperature_c:
        problems.append(f"temperature {gpu.temperature_c} C above {max_temperature_c} C")
    bus = _short_bus(gpu.bus_id)
    for xid in sorted({x for b, x in xids if b == bus and x in FATAL_XIDS}):
        problems.append(f"Xid {xid} in the kernel log ({FATAL_XIDS[xid]})")
    return problems


def node_verdict(node: str, gpus: Sequence[GpuStatus],
                 xids: Sequence[tuple[str, int]]) -> tuple[bool, str]:
    """(healthy, one line) for a node: each failing GPU named with its problems."""
    if not gpus:
        return False, f"node {node}: nvidia-smi reported no GPUs"
    bad = {g.index: gpu_problems(g, xids) for g in gpus}
    bad = {i: p for i, p in bad.items() if p}
    if not bad:
        temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
        hottest = f", hottest {max(temps)} C" if temps else ""
        return True, f"node {node}: {len(gpus)} GPU(s) healthy ({gpus[0].name}{hottest})"
    listed = "; ".join(f"GPU{i}: {', '.join(p)}" for i, p in sorted(bad.items()))
    return False, (f"node {node}: {listed}; quarantine it (add {node} to resources.exclude) "
                   "and report it to the site")


# -- known answers and bandwidth ----------------------------------------------------------------

def known_answer(n: int = 256) -> tuple[object, object, object]:
    """(A, B, A@B) with small integer entries: float32 computes A@B exactly on any device.

    Entries are in -3..3 and -2..2, so every partial sum is an integer below 2**24.
    """
    import torch

    idx = torch.arange(n * n, dtype=torch.int64).view(n, n)
    a = ((idx * 7 + 3) % 7 - 3).to(torch.float32)
    b = ((idx.T * 5 + 1) % 5 - 2).to(torch.float32)
    return a, b, (a.double() @ b.double()).to(torch.float32)


def matmul_check(device: object, n: int = 256) -> int:
    """Mismatching entries of A@B on ``device`` against the known answer (0: correct)."""
    import torch

    a, b, want = known_answer(n)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would round the exact answer
    try:
        got = (a.to(device) @ b.to(device)).cpu()  # type: ignore[attr-defined]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return int((got != want).sum().item())


def bus_bandwidth_gbs(nbytes: int, seconds: float, world: int) -> float:
    """All-reduce bus bandwidth (GB/s): algorithm bandwidth x 2(n-1)/n, as nccl-tests report."""
    if seconds <= 0 or world < 1:
        return 0.0
    return nbytes / seconds / 1e9 * (2 * (world - 1) / world)


# -- the probes ---------------------------------------------------------------------------------

def query_node(runner: CommandRunner) -> tuple[list[GpuStatus], list[tuple[str, int]], str]:
    """nvidia-smi and the kernel log of this node: (GPUs, Xids, note on what was unreadable)."""
    notes = []
    gpus = parse_gpu_query(_stdout(runner, QUERY_ARGV) or "")
    remaps = _stdout(runner, REMAP_ARGV)
    if remaps is not None:
        gpus = with_remaps(gpus, parse_remapped_rows(remaps))
    log = _stdout(runner, XID_ARGV)
    if log is None:
        notes.append("kernel log not readable (Xids not checked)")
    return gpus, parse_xids(log or ""), "; ".join(notes)


def _stdout(runner: CommandRunner, argv: Sequence[str]) -> str | None:
    try:
        result = runner.run(list(argv), timeout=60)
    except (HpcrunError, OSError):
        return None
    return result.stdout if result.returncode == 0 else None
