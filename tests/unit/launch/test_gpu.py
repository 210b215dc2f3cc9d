"""The GPU settings of a run: backend choice, timeouts, NCCL environment, GPU count, topology."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrun.control.spec import RunSpec
from hpcrun.errors import EnvError
from hpcrun.launch.gpu import (
    DEFAULT_NCCL_ENV,
    CollectiveTimeouts,
    GpuSettings,
    backend_problem,
    format_cpulist,
    gpu_shortfall,
    needed_gpus,
    parse_cpulist,
    physical_gpu,
    rank_environ,
    resolve_backend,
    resolve_timeouts,
    visible_gpu_count,
)
from hpcrun.launch.site import load_site, site_from_dict
from hpcrun.launch.topology import (
    GpuPlacement,
    gpu_cpus,
    parse_bus_ids,
    parse_topo_matrix,
    placement_from_sysfs,
)
from hpcrun.testing import FakeRunner
from hpcrun.vocab import DistBackend

GOLDEN = Path(__file__).parent / "golden" / "gpu"


def _site(**kw: object):  # type: ignore[no-untyped-def]
    return site_from_dict({"name": "s", "node_local_path": "/l", "shared_path": "/s", **kw})


def _spec(**kw: object) -> RunSpec:
    return RunSpec.from_dict({"name": "t", "entrypoint": "m:f", **kw})


GPU_SPEC = {"resources": {"gpus_per_node": 4, "tasks_per_node": 4}}


def test_auto_is_nccl_only_when_the_run_has_gpus() -> None:
    assert resolve_backend(DistBackend.AUTO, gpus=4) is DistBackend.NCCL
    assert resolve_backend(DistBackend.AUTO, gpus=0) is DistBackend.GLOO
    assert resolve_backend(DistBackend.GLOO, gpus=8) is DistBackend.GLOO
    env = rank_environ(_spec(**GPU_SPEC), _site(gpus_per_node=8), diagnostics_dir=Path("/d"))
    assert env["HPCRUN_DIST_BACKEND"] == "nccl"
    cpu = rank_environ(_spec(), _site(gpus_per_node=8), diagnostics_dir=Path("/d"))
    assert cpu["HPCRUN_DIST_BACKEND"] == "gloo" and "NCCL_DEBUG" not in cpu


def test_nccl_on_a_site_without_gpus_is_one_clear_problem() -> None:
    problem = backend_problem(_spec(dist={"backend": "nccl"}), _site())
    assert problem == ("dist.backend is nccl but site 's' has no GPUs (gpus_per_node: 0); NCCL "
                       "needs a GPU per rank; set dist.backend: gloo (or auto), or submit to a "
                       "GPU site")
    site_default = backend_problem(_spec(), _site(dist_backend="nccl"))
    assert site_default is not None and site_default.startswith("site 's' default is nccl")
    no_request = backend_problem(_spec(dist={"backend": "nccl"}), _site(gpus_per_node=8))
    assert no_request is not None and "resources.gpus_per_node: 0" in no_request
    assert backend_problem(_spec(dist={"backend": "nccl"}, **GPU_SPEC),
                           _site(gpus_per_node=8)) is None


def test_the_spec_section_is_left_out_of_the_digest_when_default() -> None:
    plain = _spec()
    assert "dist" not in plain.to_dict()
    asked = _spec(dist={"backend": "gloo"})
    assert asked.to_dict()["dist"]["backend"] == "gloo" and asked.spec_id != plain.spec_id
    assert RunSpec.from_dict(asked.to_dict()) == asked


def test_timeouts_come_from_the_spec_else_the_site() -> None:
    site = _site(pg_init_timeout_s=900, step_timeout_s=60, checkpoint_timeout_s=1200)
    assert resolve_timeouts(_spec(), site) == CollectiveTimeouts(init_s=900, step_s=60,
                                                                 checkpoint_s=1200)
    spec = _spec(dist={"step_timeout_s": 30})
    assert resolve_timeouts(spec, site).step_s == 30
    assert resolve_timeouts(_spec(), _site()) == CollectiveTimeouts(
        init_s=300, step_s=120, checkpoint_s=600)


def test_settings_travel_to_the_rank_and_back() -> None:
    settings = GpuSettings(backend=DistBackend.NCCL,
                           timeouts=CollectiveTimeouts(init_s=1.5, step_s=2, checkpoint_s=3),
                           cpus=(0, 1, 2, 3, 8))
    env = settings.to_environ()
    assert env["HPCRUN_CPU_AFFINITY"] == "0-3,8"
    assert GpuSettings.from_environ(env) == settings
    assert GpuSettings.from_environ({}) == GpuSettings()
    with pytest.raises(EnvError, match="HPCRUN_STEP_TIMEOUT_S='soon' is not a number"):
        GpuSettings.from_environ({"HPCRUN_STEP_TIMEOUT_S": "soon"})
    with pytest.raises(EnvError, match="expected nccl or gloo"):
        GpuSettings.from_environ({"HPCRUN_DIST_BACKEND": "auto"})


def test_nccl_environment_defaults_dump_path_and_site_overrides() -> None:
    site = _site(gpus_per_node=8, nccl_env={"NCCL_DEBUG": "INFO",
                                            "TORCH_NCCL_DUMP_ON_TIMEOUT": "",
                                            "NCCL_IB_HCA": "mlx5"})
    env = rank_environ(_spec(**GPU_SPEC), site, diagnostics_dir=Path("/runs/r/diag/g0001"))
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_HCA"] == "mlx5"
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env, "an empty override unsets the variable"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/runs/r/diag/g0001/nccl-trace-rank-"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == DEFAULT_NCCL_ENV["TORCH_NCCL_TRACE_BUFFER_SIZE"]


def test_the_shipped_gpu_site_loads_with_gpu_settings() -> None:
    site = load_site("generic-gpu")
    assert site.gpus_per_node == 8 and site.dist_backend is DistBackend.AUTO
    assert site.pg_init_timeout_s >= site.step_timeout_s


def test_a_bad_site_timeout_names_the_key() -> None:
    with pytest.raises(Exception, match="step_timeout_s"):
        _site(step_timeout_s=0)


def test_gpu_count_shortfall_names_the_node_and_both_counts() -> None:
    spec, site = _spec(**GPU_SPEC), _site(gpus_per_node=8)
    assert needed_gpus(spec, site) == 4
    assert needed_gpus(_spec(resources={"tasks_per_node": 4}), site) == 0
    seen = visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2"}, ["a", "b", "c", "d"])
    assert seen == 3
    assert gpu_shortfall("gpu017", needed=4, seen=seen) == (
        "node gpu017 sees 3 GPU(s) but the run needs 4 per node (resources.gpus_per_node, and "
        "one per rank with NCCL); the node is quarantined. Check the node's driver "
        "(nvidia-smi), CUDA_VISIBLE_DEVICES and the GPU request")
    assert gpu_shortfall("gpu017", needed=4, seen=4) is None
    assert visible_gpu_count({}, ["0000:18:00.0", "0000:2a:00.0"]) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, ["x"]) == 0


def test_local_rank_maps_through_cuda_visible_devices() -> None:
    assert physical_gpu({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 1) == 5
    assert physical_gpu({}, 3) == 3


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpulist_round_trips(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(sorted(cpus))) == tuple(sorted(cpus))


def test_cpulist_errors_are_clear() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    with pytest.raises(EnvError, match="runs backwards"):
        parse_cpulist("5-2")


# -- topology ------------------------------------------------------------------------------------

def test_topo_matrix_golden_four_gpus_two_numa_nodes() -> None:
    found = parse_topo_matrix((GOLDEN / "topo_4gpu_2numa.txt").read_text())
    near = tuple(range(0, 24)) + tuple(range(48, 72))
    far = tuple(range(24, 48)) + tuple(range(72, 96))
    assert found == {0: GpuPlacement(gpu=0, cpus=near, numa_node=0),
                     1: GpuPlacement(gpu=1, cpus=near, numa_node=0),
                     2: GpuPlacement(gpu=2, cpus=far, numa_node=1),
                     3: GpuPlacement(gpu=3, cpus=far, numa_node=1)}


def test_topo_matrix_without_affinity_is_unknown() -> None:
    found = parse_topo_matrix((GOLDEN / "topo_1gpu_unknown.txt").read_text())
    assert found == {0: GpuPlacement(gpu=0, cpus=(), numa_node=None)}
    assert parse_topo_matrix("") == {}


def test_sysfs_fallback_reads_the_gpus_numa_node() -> None:
    buses = parse_bus_ids((GOLDEN / "bus_ids.csv").read_text())
    assert buses == {0: "0000:18:00.0", 1: "0000:2a:00.0"}
    files = {"/sys/bus/pci/devices/0000:2a:00.0/numa_node": "1\n",
             "/sys/devices/system/node/node1/cpulist": "24-47,72-95\n",
             "/sys/bus/pci/devices/0000:18:00.0/numa_node": "-1\n"}

    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    assert placement_from_sysfs(1, buses[1], read).numa_node == 1
    assert placement_from_sysfs(0, buses[0], read) == GpuPlacement(gpu=0, cpus=(),
                                                                   numa_node=None)
    runner = FakeRunner({"nvidia-smi --query-gpu=index,pci.bus_id":
                         (GOLDEN / "bus_ids.csv").read_text()})
    found = gpu_cpus(1, runner=runner, read_text=read, allowed=range(0, 40))
    assert found.cpus == tuple(range(24, 40)), "cut to the cores this job may use"


def test_topology_from_nvidia_smi_first() -> None:
    runner = FakeRunner({"nvidia-smi topo -m": (GOLDEN / "topo_4gpu_2numa.txt").read_text()})
    found = gpu_cpus(2, runner=runner, read_text=lambda p: "")
    assert found.numa_node == 1 and found.cpus[0] == 24
    nothing = gpu_cpus(2, runner=FakeRunner(), read_text=lambda p: (_ for _ in ()).throw(
        OSError(p)))
    assert nothing == GpuPlacement(gpu=2, cpus=(), numa_node=None)


def test_gpu_site_settings_survive_the_run_directory_snapshot() -> None:
    site = load_site("generic-gpu")
    again = site_from_dict(site.to_dict())
    assert again == site and dict(again.nccl_env) == {"NCCL_IB_HCA": "mlx5",
                                                      "NCCL_SOCKET_IFNAME": "ib0"}
