"""Script mode on the local backend: a plain torchrun DDP script run unchanged, and the same
script with ``hpcrun.lite`` (``examples/torchrun_ddp``).

The plain script handles its own preemption (SIGTERM: save with ``torch.save`` and exit) and
resumes from its own file; hpcrun relays the preemption, requeues, restarts a crashed rank and
says honestly what it cannot see. The lite variant stops at a step boundary with a commit and
resumes exactly: its final checkpoint equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hpcrun.control.record import read_record
from hpcrun.observe.tracker import tracker_run_id
from hpcrun.proctree import crash_process_tree
from hpcrun.testing.runs import wait_for_state
from tests.integration.local_helpers import REPO_ROOT, cli, states, submit

EXAMPLE = REPO_ROOT / "examples" / "torchrun_ddp"
STEPS = 60


def example_spec(name: str, args: list[str]) -> dict[str, Any]:
    """The example's own run.yaml; only the script's arguments change (where it saves, pace)."""
    spec: dict[str, Any] = yaml.safe_load((EXAMPLE / name).read_text())
    spec["args"] = args
    return spec


def rank_log(run: Path, rank: int) -> str:
    found = sorted(run.glob(f"logs/*/rank-{rank:05d}.out"))
    return "".join(p.read_text(errors="replace") for p in found)


def wait_for_log(run: Path, rank: int, pattern: str, *, timeout: float = 90) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hit = re.search(pattern, rank_log(run, rank))
        if hit:
            return hit
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never logged {pattern!r}; its log:\n{rank_log(run, rank)}")


def script_rank_pid(run: Path, rank: int) -> int:
    """The PID of the running script process of ``rank`` in ``run`` (read from /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0")
                       if b"=" in kv)
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (env.get(b"HPCRUN_RUN_ID") == run.name.encode() and env.get(b"RANK") == b"%d" % rank
                and b"train.py" in cmd):
            return int(proc.name)
    raise AssertionError(f"no running script process of rank {rank} in {run.name}")


def reported_step(run: Path) -> int:
    """The newest step a rank reported (``step`` events in the node streams)."""
    newest = 0
    for path in run.glob("events/*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            if '"kind":"step"' in line:
                newest = max(newest, int(json.loads(line)["step"]))
    return newest


def status_text(root: Path, run: Path) -> str:
    out = cli(root, "status", run.name)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plain_script_survives_a_preemption_and_resumes_through_its_own_file(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ddp.pt"
    spec = example_spec("run.yaml", ["--steps", str(STEPS), "--ckpt", str(ckpt),
                                     "--step-time", "0.3", "--save-every", "1000"])
    run = submit(tmp_path, spec, wait=False)
    wait_for_log(run, 0, r"step 10 loss")
    out = cli(tmp_path, "signal", run.name)
    assert out.returncode == 0, out.stderr
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
    assert str(record.state) == "SUCCEEDED"
    assert record.requeues == 1 and states(run).count("PREEMPTED") == 1
    # the script saved on SIGTERM and the next incarnation resumed from its own file
    saved = int(wait_for_log(run, 0, r"saved step (\d+) to").group(1))
    assert 10 <= saved < STEPS
    assert f"rank 0/2 starts at step {saved}" in rank_log(run, 0)
    assert f"rank 1/2 starts at step {saved}" in rank_log(run, 1)
    assert torch.load(ckpt, weights_only=True)["step"] == STEPS
    text = status_text(tmp_path, run)
    assert "steps not reported by the script" in text
    assert "step 0" not in text and "ETTR 0.0%" not in text


def test_submit_wait_of_a_silent_script_does_not_say_step_0(tmp_path: Path) -> None:
    spec = {"name": "silent", "command": [sys.executable, "-c", "print('trained')"],
            "site": "local", "resources": {"nodes": 1, "tasks_per_node": 1, "time_limit_min": 5}}
    root = tmp_path
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = cli(root, "submit", str(path), "--backend", "local", "--wait")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].endswith(
        "SUCCEEDED, steps not reported by the script (generation 1)"), out.stdout


_PRINT_WANDB = ("import os; print('wandb', os.environ['RANK'], os.environ.get('WANDB_RUN_ID'), "
                "os.environ.get('WANDB_RESUME'))")


def test_rank_0_of_a_script_gets_the_runs_one_wandb_run(tmp_path: Path) -> None:
    """A script's own ``wandb.init()`` on rank 0 resumes one run per hpcrun run: the id is the
    run's (what a ``main(ctx)`` run's tracker uses), the same in every incarnation."""
    spec = {"name": "tracked", "command": [sys.executable, "-c", _PRINT_WANDB], "site": "local",
            "resources": {"nodes": 1, "tasks_per_node": 2, "time_limit_min": 5}}
    run = submit(tmp_path, spec)
    assert str(read_record(run).state) == "SUCCEEDED"
    assert f"wandb 0 {tracker_run_id(run.name)} allow" in rank_log(run, 0)
    assert "wandb 1 None None" in rank_log(run, 1)


_MLFLOW_SCRIPT = """
import os, signal, mlflow
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with mlflow.start_run() as run:
    mlflow.log_metric("loss", 1.0 / (attempt + 1), step=attempt)
    print("mlflow", run.info.run_id, flush=True)
if attempt == 0:
    os.kill(os.getpid(), signal.SIGKILL)  # restarted in the allocation
"""


def test_a_scripts_own_mlflow_run_is_one_run_across_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``observe.tracker: mlflow`` rank 0 gets ``MLFLOW_RUN_ID`` and the run's store: the
    script's own ``mlflow.start_run()`` logs into one MLflow run, killed and restarted."""
    from mlflow.tracking import MlflowClient

    spec = {"name": "mlflow-script", "command": [sys.executable, "-c", _MLFLOW_SCRIPT],
            "site": "local", "observe": {"tracker": "mlflow", "project": "scripts"},
            "resources": {"nodes": 1, "tasks_per_node": 1, "time_limit_min": 5}}
    run = submit(tmp_path, spec)
    record = read_record(run)
    assert (str(record.state), record.restarts) == ("SUCCEEDED", 1), record
    ids = re.findall(r"^mlflow (\w+)$", rank_log(run, 0), re.M)
    assert len(ids) == 2 and ids[0] == ids[1], ids
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in, as the run's
    client = MlflowClient(tracking_uri=(run / "tracker" / "mlruns").resolve().as_uri())
    history = client.get_metric_history(ids[0], "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5)]
    assert client.get_run(ids[0]).data.tags["hpcrun.run_id"] == tracker_run_id(run.name)


def test_a_killed_script_rank_is_restarted_in_the_allocation(tmp_path: Path) -> None:
    ckpt = tmp_path / "ddp.pt"
    spec = example_spec("run.yaml", ["--steps", str(STEPS), "--ckpt", str(ckpt),
                                     "--step-time", "0.1", "--save-every", "20"])
    run = submit(tmp_path, spec, wait=False)
    wait_for_log(run, 0, r"saved step 20 to")
    os.kill(script_rank_pid(run, 1), signal.SIGKILL)
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
    assert str(record.state) == "SUCCEEDED", record
    assert record.restarts == 1 and record.requeues == 0
    assert [f.fault for f in record.faults] == ["process_crash"]
    resumed = [int(s) for s in re.findall(r"rank 1/2 starts at step (\d+)", rank_log(run, 1))]
    assert resumed[0] == 0 and resumed[1] >= 20
    assert torch.load(ckpt, weights_only=True)["step"] == STEPS


def _parent(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
def test_a_plain_script_survives_the_loss_of_a_node_through_its_own_file(
        tmp_path: Path) -> None:
    """Node local1 loses power (its agent and its rank SIGKILLed at once, as ``nodecrash`` does
    to a ``main(ctx)`` run): a node failure, a new incarnation, and the script's own resume
    logic picks up its newest save."""
    ckpt = tmp_path / "ddp.pt"
    spec = example_spec("run.yaml", ["--steps", str(STEPS), "--ckpt", str(ckpt),
                                     "--step-time", "0.1", "--save-every", "20"])
    run = submit(tmp_path, spec, wait=False)
    wait_for_log(run, 0, r"saved step 20 to")
    crash_process_tree(_parent(script_rank_pid(run, 1)))  # node 1's agent, and all it started
    record = wait_for_state(run, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=180)
    assert str(record.state) == "SUCCEEDED", record
    assert "node_failure" in [f.fault for f in record.faults], record.faults
    assert record.generation >= 2
    resumed = [int(s) for s in re.findall(r"rank 0/2 starts at step (\d+)", rank_log(run, 0))]
    assert resumed[0] == 0 and resumed[-1] >= 20, resumed
    assert torch.load(ckpt, weights_only=True)["step"] == STEPS


def test_script_ranks_get_the_torchrun_environment(tmp_path: Path) -> None:
    dump = tmp_path / "env"
    dump.mkdir()
    names = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS"]
    code = ("import json, os, sys; import torch.distributed as d; d.init_process_group('gloo');"
            f"json.dump({{k: os.environ[k] for k in {names!r}}} | {{'cwd': os.getcwd()}},"
            f" open(os.path.join({str(dump)!r}, os.environ['RANK']), 'w')); d.barrier()")
    spec = {"name": "env-dump", "command": [sys.executable, "-c", code], "site": "local",
            "resources": {"nodes": 2, "tasks_per_node": 1, "time_limit_min": 5}}
    run = submit(tmp_path, spec)
    assert str(read_record(run).state) == "SUCCEEDED"
    seen = {r: json.loads((dump / str(r)).read_text()) for r in (0, 1)}
    for rank, env in seen.items():
        assert (env["RANK"], env["ROLE_RANK"], env["GROUP_RANK"]) == (str(rank),) * 3
        assert (env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "0", "1")
        assert env["TORCHELASTIC_RUN_ID"] == run.name
        assert Path(env["cwd"]) in (REPO_ROOT, run / "code")  # the code directory (or its snapshot)
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]


def test_lite_script_stops_at_a_boundary_and_resumes_exactly(tmp_path: Path) -> None:
    args = ["--steps", str(STEPS), "--step-time", "0.1"]
    whole = submit(tmp_path / "a", example_spec("run_lite.yaml", args))
    assert (str(read_record(whole).state), read_record(whole).step) == ("SUCCEEDED", STEPS)

    cut = submit(tmp_path / "b", example_spec("run_lite.yaml", args), wait=False)
    deadline = time.monotonic() + 90
    while reported_step(cut) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    out = cli(tmp_path / "b", "signal", cut.name)
    assert out.returncode == 0, out.stderr
    record = wait_for_state(cut, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=120)
    assert (str(record.state), record.step, record.requeues) == ("SUCCEEDED", STEPS, 1)
    stop = [c.step for c in record.checkpoints if 0 < c.step < STEPS]
    assert stop, "the stop committed no checkpoint"
    diff = cli(tmp_path, "ckpt", "diff", str(whole), str(cut))
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_steps_without_restore_are_warned_in_the_rank_log_and_status(tmp_path: Path) -> None:
    code = ("import torch.distributed as d; import hpcrun.lite as lite; "
            "d.init_process_group('gloo')\n"
            "for step in range(5):\n"
            "    if lite.should_stop(): break\n"
            "    lite.report(step + 1, loss=1.0 / (step + 1))\n"
            "d.destroy_process_group()")
    spec = {"name": "no-restore", "command": [sys.executable, "-c", code], "site": "local",
            "resources": {"nodes": 2, "tasks_per_node": 1, "time_limit_min": 5}}
    run = submit(tmp_path, spec)
    record = read_record(run)
    assert str(record.state) == "SUCCEEDED"
    for rank in (0, 1):  # once per start of the rank (gloo's teardown can abort a rank once)
        assert rank_log(run, rank).count("no checkpoint will be committed") == \
            1 + record.restarts
    text = status_text(tmp_path, run)
    assert "warning     no checkpoint will be committed; a preemption will lose all progress" \
        in text
    assert "progress    step 5 reported, none committed" in text
