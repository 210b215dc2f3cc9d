"""The agent's side of the GPU path: check the node's GPUs, bind and configure each rank.

At agent start, :meth:`NodeGpus.shortfall` compares the GPUs this node sees with what the run
needs; a short node is a ``node_failure`` (so the retry policy quarantines it) found before any
rank starts, never a hang in the first collective. For each rank, :meth:`NodeGpus.rank_environ`
gives the variables of :func:`hpcrun.launch.gpu.rank_environ` (backend, timeouts, NCCL settings)
plus the cores of the rank's GPU's NUMA node (:mod:`hpcrun.launch.topology`), read once per
agent and only on runs that have GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrun.errors import HpcrunError
from hpcrun.launch.gpu import (
    FLIGHT_RECORDER_FILE,
    gpu_shortfall,
    needed_gpus,
    physical_gpu,
    rank_environ,
    run_gpus,
    visible_gpu_count,
)
from hpcrun.launch.topology import GpuPlacement, gpu_cpus
from hpcrun.runner import CommandRunner, SubprocessRunner

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.site import SiteConfig
    from hpcrun.observe.culprit import Culprit
    from hpcrun.runtime.incarnation import Incarnation, RankExit

DRIVER_GPUS_DIR = "/proc/driver/nvidia/gpus"
LIST_ARGV = ("nvidia-smi", "-L")


def _driver_dir() -> list[str] | None:
    try:
        return sorted(os.listdir(DRIVER_GPUS_DIR))
    except OSError:
        return None


def listed_gpus(text: str) -> list[str]:
    """GPU lines of ``nvidia-smi -L`` (``GPU 0: NVIDIA H100 ... (UUID: GPU-...)``)."""
    return [ln for ln in text.splitlines() if ln.startswith("GPU ")]


def _read_text(path: str) -> str:
    return Path(path).read_text()


def _allowed_cpus() -> Sequence[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return None


class NodeGpus:
    """This node's GPUs as the run sees them; reads the topology once, on GPU runs only."""

    def __init__(self, *, spec: RunSpec, site: SiteConfig, environ: Mapping[str, str],
                 runner: CommandRunner | None = None,
                 driver_gpus: Callable[[], list[str] | None] = _driver_dir,
                 read_text: Callable[[str], str] = _read_text,
                 allowed_cpus: Callable[[], Sequence[int] | None] = _allowed_cpus) -> None:
        self._spec = spec
        self._site = site
        self._environ = environ
        self._runner = runner or SubprocessRunner()
        self._driver_gpus = driver_gpus
        self._read_text = read_text
        self._allowed_cpus = allowed_cpus
        self._placements: dict[int, GpuPlacement] = {}

    def shortfall(self, node: str) -> str | None:
        """Why this node cannot run its ranks (too few GPUs), or None."""
        needed = needed_gpus(self._spec, self._site)
        if needed == 0:
            return None
        seen = visible_gpu_count(self._environ, self._node_gpus())
        return gpu_shortfall(node, needed=needed, seen=seen)

    def _node_gpus(self) -> list[str]:
        """The driver's GPUs: ``/proc/driver/nvidia/gpus``, else ``nvidia-smi -L`` (containers
        often lack the former)."""
        found = self._driver_gpus()
        if found:
            return found
        try:
            result = self._runner.run(list(LIST_ARGV), timeout=60)
        except (HpcrunError, OSError):
            return []
        return listed_gpus(result.stdout) if result.returncode == 0 else []

    def placement(self, local_rank: int) -> GpuPlacement | None:
        """Where the GPU of ``local_rank`` sits; None on a run without GPUs."""
        if run_gpus(self._spec, self._site) == 0:
            return None
        gpu = physical_gpu(self._environ, local_rank)
        if gpu not in self._placements:
            self._placements[gpu] = gpu_cpus(gpu, runner=self._runner,
                                             read_text=self._read_text,
                                             allowed=self._allowed_cpus())
        return self._placements[gpu]

    def rank_environ(self, local_rank: int, *, diagnostics_dir: Path) -> dict[str, str]:
        """Backend, timeouts, NCCL settings and CPU binding of one rank."""
        found = self.placement(local_rank)
        return rank_environ(self._spec, self._site, diagnostics_dir=diagnostics_dir,
                            cpus=found.cpus if found is not None else ())


def diagnostics_dir(inc: Incarnation) -> Path:
    """The incarnation's hang diagnostics directory (stacks, NCCL flight recorder dumps)."""
    from hpcrun.observe.hang import stacks_path

    return stacks_path(inc.run_dir, generation=inc.generation, rank=0).parent


def timeout_fault(fault: str, *, returncode: int, dumped: bool) -> str:
    """A rank killed by a signal after its NCCL flight recorder dumped is a collective
    timeout, so a ``hang``; anything else keeps its class (pure)."""
    return "hang" if returncode < 0 and dumped else fault


def exit_fault(ex: RankExit, inc: Incarnation) -> str:
    """The fault class of a rank's exit, reading a flight recorder dump as a hang.

    With ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` NCCL's watchdog aborts the process when a
    collective times out (no exit report); the flight recorder writes its dump just before.
    """
    dump = diagnostics_dir(inc) / f"{FLIGHT_RECORDER_FILE}{ex.rank}"
    return timeout_fault(ex.fault, returncode=ex.returncode, dumped=dump.exists())


def flight_recorder_culprit(inc: Incarnation, rank_nodes: Mapping[int, str]) -> Culprit | None:
    """The ranks the incarnation's NCCL flight recorder dumps show behind the others, with
    their nodes from ``rank_nodes``; None without dumps or when they name nobody. The dumps
    are read with an unpickler that builds plain containers only
    (:func:`~hpcrun.observe.culprit.parse_flight_dump`)."""
    from hpcrun.observe.culprit import flight_culprit, read_flight_dumps

    return flight_culprit(read_flight_dumps(diagnostics_dir(inc), FLIGHT_RECORDER_FILE),
                          rank_nodes)


def exit_culprit(inc: Incarnation) -> dict[str, Any]:
    """What a ``hang`` read from a rank's exit adds to its fault when the flight recorder
    dumps name the ranks that did not arrive: those ranks, their nodes (from the published
    heartbeats), and the culprit signature the quarantine counts; {} when they name nobody."""
    from hpcrun.observe.hang import CULPRIT_SIGNATURE
    from hpcrun.observe.heartbeat import read_heartbeats

    rank_nodes = {r: n for n, hb in read_heartbeats(inc.run_dir).items() for r in hb.ranks}
    found = flight_recorder_culprit(inc, rank_nodes)
    if found is None:
        return {}
    node = found.nodes[0] if found.nodes else None
    return {"node": node, "rank": found.ranks[0], "culprit_ranks": list(found.ranks),
            "culprit_nodes": list(found.nodes), "detail": found.describe(),
            "signature": f"{CULPRIT_SIGNATURE}{node or '?'}:{found.ranks[0]}"}
