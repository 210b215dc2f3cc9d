"""The job script: one set of flags, golden renderings, and a batch shell that behaves.

Golden files live in ``tests/unit/launch/golden/``. When a rendering changes on purpose, accept
it with ``HPCRUN_ACCEPT_GOLDEN=1 .venv/bin/pytest tests/unit/launch/test_sbatch.py
tests/unit/launch/test_submit.py -q`` and review the diff in version control.
"""

from __future__ import annotations

import difflib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpcrun.control.spec import RunSpec
from hpcrun.errors import ConfigError
from hpcrun.launch.sbatch import (
    agent_step,
    format_flag,
    job_exit_path,
    render_sbatch,
    sbatch_args,
)
from hpcrun.launch.site import SiteConfig, load_site

GOLDEN_DIR = Path(__file__).parent / "golden"
RUN_DIR = Path("/shared/runs/tiny-20250101-000000-abcd")
PYTHON = "/opt/hpcrun/venv/bin/python"


def assert_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>``; print a unified diff and how to accept it."""
    path = GOLDEN_DIR / name
    if os.environ.get("HPCRUN_ACCEPT_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"golden/{name}", "rendered now"))
        pytest.fail(f"rendering differs from golden/{name}:\n{diff}\nIf the change is intended, "
                    "accept it with: HPCRUN_ACCEPT_GOLDEN=1 .venv/bin/pytest "
                    "tests/unit/launch/test_sbatch.py tests/unit/launch/test_submit.py -q",
                    pytrace=False)


def make_spec(**resources: object) -> RunSpec:
    base: dict[str, object] = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1,
                               "time_limit_min": 30}
    base.update(resources)
    return RunSpec.from_dict({"name": "tiny", "entrypoint": "examples.tiny_lm.train:main",
                              "resources": base})


def rendered(spec: RunSpec, site: SiteConfig, **kw: object) -> str:
    text = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="tiny.submit.0", python=PYTHON,
                         **kw)  # type: ignore[arg-type]
    return text.replace(spec.spec_id, "<spec-id>")  # the spec schema has its own golden tests


def test_golden_testbed_script() -> None:
    text = rendered(make_spec(exclude=["node4"]), load_site("testbed"), exclude=["node3"])
    assert_golden("sbatch_testbed.sh", text)


def test_golden_gpu_site_with_gres_and_modules() -> None:
    spec = make_spec(nodes=4, tasks_per_node=4, gpus_per_node=4, cpus_per_task=8,
                     time_limit_min=720, account="proj42")
    assert_golden("sbatch_preemptible.sh", rendered(spec, load_site("preemptible"),
                                                    begin="now+120"))


def test_golden_gpu_site_with_gpus_per_node() -> None:
    spec = make_spec(nodes=2, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12,
                     spare_nodes=1)
    assert_golden("sbatch_generic_gpu.sh", rendered(spec, load_site("generic-gpu")))


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines()
            if line.startswith("#SBATCH ")]


def test_script_flags_are_exactly_sbatch_args() -> None:
    spec, site = make_spec(), load_site("testbed")
    args = sbatch_args(spec, site, run_dir=RUN_DIR, op_id="op-7", exclude=["node2"])
    script = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="op-7", exclude=["node2"])
    assert sbatch_lines(script) == [format_flag(k, v) for k, v in args]


def test_flags_carry_gang_signal_requeue_and_tags() -> None:
    spec = make_spec(nodes=3, tasks_per_node=2, cpus_per_task=2, exclude=["node9", "node1"])
    flags = dict(sbatch_args(spec, load_site("testbed"), run_dir=RUN_DIR, op_id="op-1",
                             exclude=["node1", "node5"]))
    assert flags["nodes"] == "3" and flags["ntasks-per-node"] == "1"
    assert flags["cpus-per-task"] == "4", "the agent's step holds all of its node's ranks"
    assert flags["signal"] == "USR1@60", "to the steps (no B:), where the agents are"
    assert flags["requeue"] == "" and flags["open-mode"] == "append"
    assert flags["comment"] == "hpcrun:op-1"
    assert flags["exclude"] == "node1,node5,node9", "quarantine + spec, sorted, once each"
    assert flags["output"].startswith(str(RUN_DIR / "logs"))
    assert flags["partition"] == "batch" and flags["time"] == "30"


def test_spec_overrides_site_defaults_and_requeue_can_be_disallowed() -> None:
    site = SiteConfig(name="s", node_local_path="/l", shared_path="/s", partition="p",
                      account="a", qos="q", constraint="c", requeue_allowed=False,
                      preempt_signal="SIGUSR2", preempt_lead_s=300)
    flags = dict(sbatch_args(make_spec(partition="big", account="mine"), site, run_dir=RUN_DIR,
                             op_id="o"))
    assert (flags["partition"], flags["account"], flags["qos"]) == ("big", "mine", "q")
    assert "requeue" not in flags and flags["no-requeue"] == ""
    assert flags["signal"] == "USR2@300"


def test_more_gpus_than_the_site_has_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="gpus_per_node=2") as info:
        sbatch_args(make_spec(gpus_per_node=2), load_site("testbed"), run_dir=RUN_DIR,
                    op_id="o")
    assert "testbed" in str(info.value)


def test_rendered_scripts_are_valid_bash() -> None:
    for site in ("testbed", "generic-gpu", "preemptible", "local"):
        text = render_sbatch(make_spec(), load_site(site), run_dir=RUN_DIR, op_id="o")
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


# -- the batch shell, run for real with a stand-in srun ---------------------------------------

FAKE_SRUN = """#!/bin/bash
# Stands in for srun: records its argv and each USR1 it gets, exits 7 on SIGUSR1's second
# delivery or after ~20 s.
printf "%s\n" "$*" > "$MARK_DIR/argv"
got=0
trap 'got=$((got+1)); echo usr1 >> "$MARK_DIR/usr1"' USR1
echo started > "$MARK_DIR/started"
for _ in $(seq 200); do
    sleep 0.1
    if [ "$got" -ge 2 ]; then exit 7; fi
done
exit 9
"""


def wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_batch_shell_forwards_the_signal_survives_sigterm_and_returns_srun_status(
        tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(make_spec(), load_site("testbed"), run_dir=tmp_path,
                                    op_id="o", python=shlex.quote("/usr/bin/python3")))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "MARK_DIR": str(tmp_path)}
    shell = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tmp_path / "started")
        shell.send_signal(signal.SIGTERM)      # preemption grace / time limit: keep waiting
        time.sleep(0.3)
        assert shell.poll() is None, "SIGTERM must not end the batch shell before the agents"
        shell.send_signal(signal.SIGUSR1)      # scancel --batch --signal=USR1
        wait_for(tmp_path / "usr1")
        shell.send_signal(signal.SIGUSR1)
        rc = shell.wait(timeout=10)
    finally:
        if shell.poll() is None:
            shell.kill()
    assert rc == 7, "the job's exit status is the agent step's"
    assert (tmp_path / "usr1").read_text().count("usr1") == 2
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:5] == ["-n", "2", "--ntasks-per-node=1", "--cpus-per-task=2",
                        "--kill-on-bad-exit=0"]
    # the agents start with the signal ignored until they hold it (argv joined, then split)
    assert argv[5:10] == ["/bin/sh", "-c", "trap", '""', "USR1;"]
    assert argv[-6:] == ["hpcrun-agent", "/usr/bin/python3", "-m", "hpcrun.runtime",
                         "--run-dir", str(tmp_path)]
    assert "got SIGTERM" in (shell.stderr.read() if shell.stderr else "")


LOST_NODE_SRUN = """#!/bin/bash
# Stands in for the agent step after a node loss repaired in the allocation: the supervisor
# wrote the run's exit status ($RUN_STATUS, none when unset), the lost node's task was killed.
if [ -n "${RUN_STATUS:-}" ]; then echo "$RUN_STATUS" > "$LOGS/job-$SLURM_JOB_ID.exit"; fi
exit 137
"""


@pytest.mark.parametrize(("run_status", "job_rc"), [("0", 0), ("1", 1), ("", 137), ("x", 137)])
def test_the_job_exits_with_the_runs_status_once_the_run_has_ended(
        tmp_path: Path, run_status: str, job_rc: int) -> None:
    bindir, logs = tmp_path / "bin", tmp_path / "logs"
    bindir.mkdir()
    logs.mkdir()
    (bindir / "srun").write_text(LOST_NODE_SRUN)
    (bindir / "srun").chmod(0o755)
    (logs / "job-42.exit").write_text("0\n")  # an earlier run of this job id: removed at start
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(make_spec(nodes=2, spare_nodes=1), load_site("testbed"),
                                    run_dir=tmp_path, op_id="o"))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "RUN_STATUS": run_status, "LOGS": str(logs)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == job_rc, done.stderr
    assert job_exit_path(tmp_path, "42") == logs / "job-42.exit"


def test_spare_nodes_start_an_agent_on_every_allocated_node_and_survive_a_node_loss() -> None:
    spec, site = make_spec(nodes=2, spare_nodes=1), load_site("testbed")
    flags = dict(sbatch_args(spec, site, run_dir=RUN_DIR, op_id="op-1"))
    assert flags["nodes"] == "3" and flags["no-kill"] == ""
    srun = agent_step(spec, site).srun_args()
    assert srun[:2] == ["-n", "3"], "the spare's agent starts too, and idles warm"
    assert "--no-kill" in srun, "a step without it dies on every node when one node is DOWN"


def test_without_spares_a_node_loss_still_ends_the_job_for_slurm_to_requeue() -> None:
    spec, site = make_spec(nodes=2), load_site("testbed")
    assert "no-kill" not in dict(sbatch_args(spec, site, run_dir=RUN_DIR, op_id="op-1"))
    assert "--no-kill" not in agent_step(spec, site).srun_args()


def elastic_spec(nodes: int = 3, min_nodes: int = 2, **resources: object) -> RunSpec:
    raw = make_spec(nodes=nodes, **resources).to_dict()
    raw["membership"] = {"mode": "elastic", "min_nodes": min_nodes}
    return RunSpec.from_dict(raw)


def test_golden_elastic_resubmission_asks_for_a_node_range_and_an_agent_per_granted_node(
        ) -> None:
    text = rendered(elastic_spec(), load_site("testbed"), requeue=True)
    assert_golden("sbatch_testbed_elastic.sh", text)
    assert "#SBATCH --nodes=2-3\n" in text and "#SBATCH --no-kill\n" in text
    # no task count: srun starts one agent on each node Slurm granted (2 or 3), counted from
    # the allocation, not from the first job's SLURM_NTASKS a requeued job keeps
    assert "srun --ntasks-per-node=1 " in text and "srun -n" not in text
    assert 'export SLURM_NTASKS="$SLURM_JOB_NUM_NODES"\n' in text
    assert "SLURM_NTASKS" not in rendered(make_spec(), load_site("testbed"))
    # the first job asks for what the spec says (Slurm grants the low end of a range)
    first = rendered(elastic_spec(), load_site("testbed"))
    assert first == text.replace("#SBATCH --nodes=2-3\n", "#SBATCH --nodes=3\n")


def test_an_elastic_job_survives_a_node_loss_and_its_spares_widen_the_range() -> None:
    site = load_site("testbed")
    srun = agent_step(elastic_spec(), site).srun_args()
    assert "--no-kill" in srun and "-n" not in srun
    flags = dict(sbatch_args(elastic_spec(spare_nodes=1), site, run_dir=RUN_DIR, op_id="o",
                             requeue=True))
    assert flags["nodes"] == "2-4" and flags["no-kill"] == ""


def test_a_fixed_gang_or_an_elastic_one_at_its_floor_asks_for_exactly_its_nodes() -> None:
    site = load_site("testbed")
    for spec in (elastic_spec(nodes=2, min_nodes=2), make_spec(nodes=3)):
        flags = dict(sbatch_args(spec, site, run_dir=RUN_DIR, op_id="o", requeue=True))
        assert flags["nodes"] == str(spec.resources.nodes)


# -------------------------------------------------- site setup, containers and sbatch_extra


def test_golden_pyxis_site_with_setup_and_sbatch_extra() -> None:
    """generic-gpu: setup lines after the modules, Pyxis flags on the agents' srun, extra
    sbatch options after hpcrun's own; the spec overrides the site's mail-type."""
    spec = make_spec(nodes=2, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12,
                     sbatch_extra={"mail-type": "FAIL", "reservation": "maint-42"})
    text = rendered(spec, load_site("generic-gpu"))
    assert_golden("sbatch_generic_gpu_site_setup.sh", text)
    assert "#SBATCH --mail-type=FAIL" in text and "#SBATCH --reservation=maint-42" in text
    assert "#SBATCH --exclusive\n" in text and "#SBATCH --mem=0\n" in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--container-image='nvcr.io#nvidia/pytorch:24.05-py3'" in srun
    assert "--container-mounts=/lustre:/lustre,/local/nvme:/local/nvme" in srun


def test_golden_pyxis_image_and_mounts_are_each_one_quoted_argument() -> None:
    """A squashfs image and mounts whose paths hold a space, a ``;`` and a ``$``: each reaches
    the agents' ``srun`` as one argument, nothing of it runs."""
    import dataclasses

    from hpcrun.launch.container import ContainerConfig, ContainerRuntime

    site = load_site("generic-gpu")
    container = ContainerConfig(runtime=ContainerRuntime.PYXIS,
                                image="/images/py torch;$(id).sqsh",
                                mounts=("/lustre/my data:/data:ro", "/scratch/$USER:/scratch"),
                                flags=("--container-writable",))
    spec = make_spec(nodes=2, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12)
    text = rendered(spec, dataclasses.replace(site, container=container))
    assert_golden("sbatch_pyxis_quoted.sh", text)
    srun = " ".join(line.rstrip("\\ ") for line in text.splitlines()
                    if line.startswith("srun ") or "-m hpcrun.runtime " in line)
    words = shlex.split(srun.removesuffix("&"))
    assert "--container-image=/images/py torch;$(id).sqsh" in words
    assert "--container-mounts=/lustre/my data:/data:ro,/scratch/$USER:/scratch" in words


def test_golden_apptainer_site_keeps_the_agents_on_the_host() -> None:
    """Apptainer starts the ranks in the image (the agent does it); the job script runs the
    agents with the host's interpreter, no runtime on their srun."""
    spec = make_spec(nodes=2, tasks_per_node=4, gpus_per_node=4)
    site = load_site("preemptible")
    text = render_sbatch(spec, site, run_dir=RUN_DIR, op_id="tiny.submit.0")
    assert_golden("sbatch_preemptible_apptainer.sh", text.replace(spec.spec_id, "<spec-id>"))
    assert "apptainer" not in text.replace("module load apptainer", "")
    assert "python3 -m hpcrun.runtime --run-dir" in text


def test_unknown_or_modeled_sbatch_options_are_refused_with_one_clear_line() -> None:
    site = load_site("testbed")
    with pytest.raises(ConfigError, match=r"sbatch_extra.memory: --memory is not an sbatch "
                       r"option \(did you mean mem, mem-bind, mem-per-cpu, mem-per-gpu\?\)"):
        sbatch_args(make_spec(sbatch_extra={"memory": "4G"}), site, run_dir=RUN_DIR,
                    op_id="o")
    with pytest.raises(ConfigError, match=r"hpcrun sets --time itself from "
                       r"resources.time_limit_min; set it there instead"):
        sbatch_args(make_spec(sbatch_extra={"time": "10"}), site, run_dir=RUN_DIR, op_id="o")


def test_site_sbatch_extra_and_container_are_checked_when_the_site_loads(
        tmp_path: Path) -> None:
    base = "name: x\nnode_local_path: /l\nshared_path: /s\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "sbatch_extra: {exclusiv: true}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: sbatch_extra.exclusiv: --exclusiv is "
                       r"not an sbatch option \(did you mean exclusive\?\)"):
        load_site(str(bad))
    bad.write_text(base + "container: {runtime: docker, image: x}\n")
    with pytest.raises(ConfigError,
                       match=r"container\.runtime': expected pyxis, apptainer, charliecloud"):
        load_site(str(bad))
    good = tmp_path / "good.yaml"
    good.write_text(base + "sbatch_extra: {exclusive: true, mem: 0, mail-type: false}\n"
                    "setup: ['source /opt/venv/bin/activate']\n"
                    "container: {runtime: pyxis, image: 'img:1', mounts: ['/s:/s']}\n")
    site = load_site(str(good))
    assert dict(site.sbatch_extra) == {"exclusive": "", "mem": "0"}
    from hpcrun.launch.site import site_from_dict

    assert site_from_dict(site.to_dict()) == site  # the run directory's snapshot round-trips


def test_a_failing_setup_line_ends_the_job_before_the_agents(tmp_path: Path) -> None:
    site = SiteConfig(name="s", node_local_path="/l", shared_path="/s",
                      setup=("export HPCRUN_SETUP_OK=1", "false"))
    script = render_sbatch(make_spec(), site, run_dir=tmp_path, op_id="o")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\necho srun-started\n")
    (fake_bin / "srun").chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    out = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True,
                         env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 1 and "srun-started" not in out.stdout
    assert "hpcrun: site setup line failed: false" in out.stderr
