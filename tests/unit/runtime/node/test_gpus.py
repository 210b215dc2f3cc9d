"""The agent's GPU side: the node's GPU count, each rank's environment and binding, and a
collective timeout's abort read as a hang."""

from __future__ import annotations

from pathlib import Path

from hpcrun.control.spec import RunSpec
from hpcrun.launch.gpu import GpuSettings
from hpcrun.launch.site import site_from_dict
from hpcrun.runtime.incarnation import Incarnation, RankExit
from hpcrun.runtime.node.gpus import NodeGpus, diagnostics_dir, exit_fault, timeout_fault
from hpcrun.testing import FakeRunner
from hpcrun.vocab import DistBackend

TOPO = (Path(__file__).parents[2] / "launch" / "golden" / "gpu" / "topo_4gpu_2numa.txt")
SITE = site_from_dict({"name": "g", "node_local_path": "/l", "shared_path": "/s",
                       "gpus_per_node": 4})
SPEC = RunSpec.from_dict({"name": "t", "entrypoint": "m:f",
                          "resources": {"tasks_per_node": 4, "gpus_per_node": 4}})


def _gpus(environ: dict[str, str], driver: list[str], runner: FakeRunner | None = None,
          spec: RunSpec = SPEC) -> NodeGpus:
    return NodeGpus(spec=spec, site=SITE, environ=environ, runner=runner or FakeRunner(),
                    driver_gpus=lambda: driver, read_text=lambda p: "",
                    allowed_cpus=lambda: None)


def test_shortfall_counts_what_the_node_sees() -> None:
    assert _gpus({}, ["a", "b", "c", "d"]).shortfall("n1") is None
    short = _gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, ["a", "b", "c", "d"]).shortfall("n1")
    assert short is not None and short.startswith("node n1 sees 2 GPU(s) but the run needs 4")
    cpu_spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    assert _gpus({}, [], spec=cpu_spec).shortfall("n1") is None, "a CPU run needs no GPU"


def test_without_the_driver_directory_nvidia_smi_lists_the_gpus() -> None:
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-8a1f0c2e-1d2b-4c3a-9e8f-0a1b2c3d4e5f)\n"
               "GPU 1: NVIDIA H200 (UUID: GPU-1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b)\n")
    gpus = NodeGpus(spec=SPEC, site=SITE, environ={}, driver_gpus=lambda: None,
                    runner=FakeRunner({"nvidia-smi -L": listing}), read_text=lambda p: "")
    short = gpus.shortfall("n1")
    assert short is not None and "sees 2 GPU(s) but the run needs 4" in short
    alone = NodeGpus(spec=SPEC, site=SITE, environ={}, driver_gpus=lambda: None,
                     runner=FakeRunner(), read_text=lambda p: "")
    assert "sees 0 GPU(s)" in (alone.shortfall("n1") or "")


def test_each_rank_is_bound_to_its_gpus_numa_node(tmp_path: Path) -> None:
    runner = FakeRunner({"nvidia-smi topo -m": TOPO.read_text()})
    gpus = _gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, [], runner)
    env = gpus.rank_environ(2, diagnostics_dir=tmp_path)
    settings = GpuSettings.from_environ(env)
    assert settings.backend is DistBackend.NCCL
    assert settings.cpus and settings.cpus[0] >= 24, "GPU2 sits on NUMA node 1 (cores 24-47)"
    gpus.rank_environ(3, diagnostics_dir=tmp_path)
    assert runner.calls.count(("nvidia-smi", "topo", "-m")) == 2  # once per GPU, cached
    gpus.rank_environ(2, diagnostics_dir=tmp_path)
    assert runner.calls.count(("nvidia-smi", "topo", "-m")) == 2


def test_a_cpu_run_reads_no_topology(tmp_path: Path) -> None:
    runner = FakeRunner()
    cpu_spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    env = _gpus({}, [], runner, spec=cpu_spec).rank_environ(0, diagnostics_dir=tmp_path)
    assert env["HPCRUN_DIST_BACKEND"] == "gloo" and env["HPCRUN_CPU_AFFINITY"] == ""
    assert runner.calls == []


def test_an_abort_after_a_flight_recorder_dump_is_a_hang(tmp_path: Path) -> None:
    assert timeout_fault("process_crash", returncode=-6, dumped=True) == "hang"
    assert timeout_fault("process_crash", returncode=-6, dumped=False) == "process_crash"
    assert timeout_fault("user_error", returncode=1, dumped=True) == "user_error"
    inc = Incarnation(run_dir=tmp_path, run_id="r", generation=3, holder="h", fence_slot=1,
                      job_id="j", restart_count=0, attempt=0, node="n1", node_local_root=None)
    killed = RankExit(rank=5, returncode=-6)
    assert exit_fault(killed, inc) == "process_crash"
    diag = diagnostics_dir(inc)
    diag.mkdir(parents=True)
    (diag / "nccl-trace-rank-5").write_bytes(b"dump")
    assert exit_fault(killed, inc) == "hang"
    assert exit_fault(RankExit(rank=4, returncode=-6), inc) == "process_crash"


def test_the_flight_recorder_dumps_name_the_rank_that_did_not_arrive(tmp_path: Path) -> None:
    """The watchdog's dumps (plain pickles) show rank 6 one collective behind: the hang fault
    names it and the node its heartbeat came from; a dump that would run code is skipped."""
    import pickle

    from hpcrun.observe.heartbeat import HeartbeatAggregator, write_rank_heartbeat
    from hpcrun.runtime.node.gpus import exit_culprit

    inc = Incarnation(run_dir=tmp_path, run_id="r", generation=3, holder="h", fence_slot=1,
                      job_id="j", restart_count=0, attempt=0, node="n1", node_local_root=None)
    assert exit_culprit(inc) == {}
    diag = diagnostics_dir(inc)
    diag.mkdir(parents=True)
    for rank, seq in {4: 9, 5: 9, 6: 8}.items():
        status = {"0": {"last_enqueued_collective": seq}}
        (diag / f"nccl-trace-rank-{rank}").write_bytes(pickle.dumps(
            {"version": "2.10", "pg_status": status, "entries": []}))
    (diag / "nccl-trace-rank-7").write_bytes(
        b"cos\nsystem\n(S'touch " + str(tmp_path / "ran").encode() + b"'\ntR.")
    for node, rank in (("n1", 4), ("n1", 5), ("n2", 6)):
        hb_dir = tmp_path / "hb" / node
        write_rank_heartbeat(hb_dir, rank=rank, step=3, ts=1.0, step_time_s=None, pid=1)
        HeartbeatAggregator(tmp_path, node=node, hb_dir=hb_dir, generation=3).poll()
    found = exit_culprit(inc)
    assert (found["node"], found["rank"], found["culprit_ranks"], found["culprit_nodes"],
            found["signature"]) == ("n2", 6, [6], ["n2"], "hang:culprit:n2:6")
    assert "rank 6 on n2 did not arrive" in found["detail"]
    assert not (tmp_path / "ran").exists()
