"""Which CPU cores sit next to each GPU: parsers of ``nvidia-smi topo -m`` and of sysfs (pure).

A rank is bound to the cores of its GPU's NUMA node, so its host-side work (the data loader,
staging copies into pinned memory) does not cross the socket interconnect. Two sources, first
that answers wins (:func:`gpu_cpus`):

1. ``nvidia-smi topo -m``: the matrix's ``CPU Affinity`` column, per ``GPU<n>`` row;
2. sysfs: ``/sys/bus/pci/devices/<bus id>/numa_node`` of the GPU (bus id from
   ``nvidia-smi --query-gpu=index,pci.bus_id``), then that node's
   ``/sys/devices/system/node/node<N>/cpulist``.

When neither is readable (no driver, a container without sysfs) the rank is not bound, and its
start event says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpcrun.errors import EnvError, HpcrunError
from hpcrun.launch.gpu import parse_cpulist
from hpcrun.runner import CommandRunner

_GPU_ROW = re.compile(r"^GPU(\d+)$")
TOPO_ARGV = ("nvidia-smi", "topo", "-m")
BUS_ID_ARGV = ("nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuPlacement:
    """Where one GPU sits relative to the CPUs."""

    gpu: int
    """The driver's GPU index."""
    cpus: tuple[int, ...]
    """Cores of the GPU's NUMA node (empty: unknown)."""
    numa_node: int | None
    """The GPU's NUMA node, when known."""


def parse_topo_matrix(text: str) -> dict[int, GpuPlacement]:
    """``nvidia-smi topo -m`` → placement per GPU index.

    The header lists the device columns (``GPU0 ... NIC0 ...``) then ``CPU Affinity``,
    ``NUMA Affinity`` and, on newer drivers, ``GPU NUMA ID``; each ``GPU<n>`` row has one link
    cell per device column, then the affinity cells (``N/A`` when unknown).
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln.split() for ln in lines if "Affinity" in ln), None)
    if header is None:
        return {}
    devices = header.index("CPU")
    out: dict[int, GpuPlacement] = {}
    for line in lines:
        if "Affinity" in line:
            continue
        cells = line.split()
        match = _GPU_ROW.match(cells[0]) if cells else None
        if match is None or len(cells) < devices + 2:
            continue
        rest = cells[1 + devices:]
        cpus = () if rest[0] == "N/A" else parse_cpulist(rest[0], source="nvidia-smi topo -m")
        numa = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
        gpu = int(match.group(1))
        out[gpu] = GpuPlacement(gpu=gpu, cpus=cpus, numa_node=numa)
    return out


def parse_bus_ids(text: str) -> dict[int, str]:
    """``nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`` → sysfs bus id per GPU.

    nvidia-smi prints an 8-digit PCI domain in upper case (``00000000:18:00.0``); sysfs names
    the device with a 4-digit domain in lower case (``0000:18:00.0``).
    """
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        domain, _, rest = parts[1].partition(":")
        out[int(parts[0])] = f"{domain[-4:]}:{rest}".lower()
    return out


def placement_from_sysfs(gpu: int, bus_id: str,
                         read_text: Callable[[str], str]) -> GpuPlacement:
    """The GPU's NUMA node and its cores from sysfs; unknown parts are left empty.

    Args:
        read_text: reads a sysfs file (raises OSError when it is not there).
    """
    try:
        node = int(read_text(f"/sys/bus/pci/devices/{bus_id}/numa_node").strip())
    except (OSError, ValueError):
        return GpuPlacement(gpu=gpu, cpus=(), numa_node=None)
    if node < 0:  # the kernel's "no NUMA information"
        return GpuPlacement(gpu=gpu, cpus=(), numa_node=None)
    try:
        cpus = parse_cpulist(read_text(f"/sys/devices/system/node/node{node}/cpulist"),
                             source=f"node{node}/cpulist")
    except (OSError, EnvError):
        cpus = ()
    return GpuPlacement(gpu=gpu, cpus=cpus, numa_node=node)


def gpu_cpus(gpu: int, *, runner: CommandRunner, read_text: Callable[[str], str],
             allowed: Sequence[int] | None = None) -> GpuPlacement:
    """Where ``gpu`` sits, from ``nvidia-smi topo -m``, else sysfs (the effectful shell).

    Args:
        allowed: the cores this process may use (its cgroup/cpuset); the result is cut to
            them, since binding to a core outside the allocation fails.
    """
    found = _from_topo(gpu, runner)
    if not found.cpus:
        found = _from_sysfs(gpu, runner, read_text)
    if allowed is not None and found.cpus:
        found = GpuPlacement(gpu=gpu, cpus=tuple(c for c in found.cpus if c in set(allowed)),
                             numa_node=found.numa_node)
    return found


def _from_topo(gpu: int, runner: CommandRunner) -> GpuPlacement:
    unknown = GpuPlacement(gpu=gpu, cpus=(), numa_node=None)
    try:
        result = runner.run(list(TOPO_ARGV), timeout=30)
    except (HpcrunError, OSError):
        return unknown
    if result.returncode != 0:
        return unknown
    try:
        return parse_topo_matrix(result.stdout).get(gpu, unknown)
    except EnvError:
        return unknown


def _from_sysfs(gpu: int, runner: CommandRunner,
                read_text: Callable[[str], str]) -> GpuPlacement:
    unknown = GpuPlacement(gpu=gpu, cpus=(), numa_node=None)
    try:
        result = runner.run(list(BUS_ID_ARGV), timeout=30)
    except (HpcrunError, OSError):
        return unknown
    bus = parse_bus_ids(result.stdout).get(gpu) if result.returncode == 0 else None
    return unknown if bus is None else placement_from_sysfs(gpu, bus, read_text)


def placement_fields(found: GpuPlacement | None) -> Mapping[str, object]:
    """The start event's binding fields (``gpu``, ``numa_node``, ``cpus``)."""
    if found is None:
        return {"gpu": None, "numa_node": None, "cpus": None}
    from hpcrun.launch.gpu import format_cpulist

    return {"gpu": found.gpu, "numa_node": found.numa_node,
            "cpus": format_cpulist(found.cpus) or None}
