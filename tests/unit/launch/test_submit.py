"""Submission: submitit carries exactly hpcrun's flags, and its own requeue handler is off.

No Slurm here: ``sbatch`` and ``srun`` are small stand-in programs on PATH, so submitit really
writes its script, pickles the callable and runs its submission command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcrun.errors import SchedulerError
from hpcrun.launch.sbatch import format_flag, sbatch_args
from hpcrun.launch.site import load_site
from hpcrun.launch.submit import (
    SUBMITIT_DIR,
    parse_parsable_job_id,
    submit_sbatch,
    submit_submitit,
    submitit_entry,
)
from hpcrun.runner import CommandResult
from hpcrun.runtime.agent import agent_main
from hpcrun.testing.fakes import FakeRunner
from tests.unit.launch.test_sbatch import assert_golden, elastic_spec, make_spec

PYTHON = "/opt/hpcrun/venv/bin/python"

FAKE_SBATCH = """#!/bin/bash
cp "$1" "$CAPTURE_DIR/submitted.sh"
echo "Submitted batch job 4242"
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("sbatch", FAKE_SBATCH), ("srun", "#!/bin/bash\nexit 0\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("CAPTURE_DIR", str(tmp_path))
    return tmp_path


def submit_tiny(run_dir: Path, **kw: object) -> str:
    return submit_submitit(make_spec(), load_site("testbed"), run_dir=run_dir,
                           op_id="tiny.submit.0", entry=agent_main, python=PYTHON,
                           **kw)  # type: ignore[arg-type]


def test_submitit_script_golden_and_job_id(fake_slurm: Path) -> None:
    run_dir = fake_slurm / "runs" / "tiny-1"
    job_id = submit_tiny(run_dir, exclude=["node3"])
    assert job_id == "4242"
    text = (fake_slurm / "submitted.sh").read_text().replace(str(fake_slurm), "<tmp>")
    assert_golden("submitit_testbed.sh", text)
    assert (run_dir / "logs").is_dir(), "Slurm does not create the output directory"


def test_submitit_script_has_exactly_hpcrun_flags_and_no_submitit_signal(
        fake_slurm: Path) -> None:
    run_dir = fake_slurm / "run"
    submit_tiny(run_dir, exclude=["node3"], begin="now+30")
    text = (fake_slurm / "submitted.sh").read_text()
    lines = [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH")]
    expected = [format_flag(k, v) for k, v in sbatch_args(
        make_spec(), load_site("testbed"), run_dir=run_dir, op_id="tiny.submit.0",
        exclude=["node3"], begin="now+30")]
    submitit_own = {"--wckey=submitit"}
    assert sorted(set(lines) - submitit_own) == sorted(expected)
    assert [ln for ln in lines if ln.startswith("--signal")] == ["--signal=USR1@60"]
    srun_line = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    assert "-n 2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=0" in srun_line
    assert f"export HPCRUN_RUN_DIR={run_dir}" in text


def test_submitted_callable_is_the_agent_entry_with_the_run_dir(fake_slurm: Path) -> None:
    from submitit.core.utils import DelayedSubmission

    run_dir = fake_slurm / "run"
    submit_tiny(run_dir)
    pickles = list((run_dir / SUBMITIT_DIR).glob("4242_submitted.pkl"))
    assert len(pickles) == 1
    delayed = DelayedSubmission.load(pickles[0])  # submitit's own format, written just now
    assert delayed.function is submitit_entry
    assert delayed.args == (str(run_dir), "USR1", agent_main)
    assert not hasattr(delayed.function, "checkpoint"), "not a submitit Checkpointable"


def test_submitit_failure_is_one_scheduler_error(fake_slurm: Path) -> None:
    (fake_slurm / "bin" / "sbatch").write_text("#!/bin/bash\necho 'invalid account' >&2\n"
                                                "exit 1\n")
    with pytest.raises(SchedulerError, match="submitit could not submit run 'tiny'"):
        submit_tiny(fake_slurm / "run")


def test_submitit_starts_an_elastic_job_on_its_nodes_with_an_agent_per_granted_node(
        fake_slurm: Path) -> None:
    run_dir = fake_slurm / "run"
    spec = elastic_spec()
    submit_submitit(spec, load_site("testbed"), run_dir=run_dir, op_id="tiny.submit.0",
                    entry=agent_main, python=PYTHON)
    text = (fake_slurm / "submitted.sh").read_text()
    lines = [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert [ln for ln in lines if ln.startswith("--nodes")] == ["--nodes=3"]
    expected = [format_flag(k, v) for k, v in sbatch_args(
        spec, load_site("testbed"), run_dir=run_dir, op_id="tiny.submit.0")]
    assert sorted(set(lines) - {"--wckey=submitit"}) == sorted(expected)
    srun_line = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    assert " -n " not in srun_line and "--ntasks-per-node=1" in srun_line
    assert text.index('export SLURM_NTASKS="$SLURM_JOB_NUM_NODES"') < text.index(srun_line)
    assert "--no-kill" in srun_line


# -- submitit's handler, switched off: checked in a real submitit task environment ------------

TASK = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from submitit.core import utils
    from submitit.slurm.slurm import SlurmJobEnvironment

    def work():
        return 0

    folder = Path(sys.argv[1])
    delayed = utils.DelayedSubmission(work)
    delayed.set_timeout(30, 3)
    env = SlurmJobEnvironment()
    env._handle_signals(utils.JobPaths(folder, job_id="77", task_id=0), delayed)
    if sys.argv[2] == "hpcrun":
        from hpcrun.launch.submit import neutralise_submitit_handler
        assert neutralise_submitit_handler("USR1") == signal.SIGUSR2
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
    except BaseException as exc:
        print("handler raised", type(exc).__name__)
        raise
    print("still running")
""")


@pytest.mark.parametrize("mode", ["submitit", "hpcrun"])
def test_submitit_requeue_handler_is_switched_off(tmp_path: Path, mode: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/scontrol\n")
    (bindir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SUBMITIT_EXECUTOR": "slurm",
           "SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    env.pop("SUBMITIT_PREEMPT_SIGNAL", None)
    proc = subprocess.run([sys.executable, "-c", TASK, str(tmp_path), mode], env=env,
                          capture_output=True, text=True, timeout=60)
    requeued = (tmp_path / "scontrol").exists()
    if mode == "submitit":  # what hpcrun guards against: submitit requeues before any commit
        assert requeued and "requeue 77" in (tmp_path / "scontrol").read_text()
        assert proc.returncode != 0
    else:
        assert proc.returncode == 0, proc.stderr
        assert not requeued, "no requeue from submitit's handler"
        assert "still running" in proc.stdout
        assert "ignoring SIGUSR2" in proc.stderr


def test_submitit_entry_outside_submitit_runs_the_agent_and_returns_its_status(
        tmp_path: Path) -> None:
    status = submitit_entry(str(tmp_path / "no-such-run"), "USR1", agent_main)
    assert isinstance(status, int) and status != 0, "a missing run directory is an error exit"


# -- plain sbatch -------------------------------------------------------------------------------

def test_submit_sbatch_sends_the_script_on_stdin_and_parses_the_id() -> None:
    seen: list[str | None] = []

    class Recording(FakeRunner):
        def run(self, argv, *, input=None, env=None, timeout=None):  # type: ignore[no-untyped-def]
            seen.append(input)
            return super().run(argv, input=input, env=env, timeout=timeout)

    runner = Recording({"sbatch --parsable": "5151;cluster1\n"})
    assert submit_sbatch("#!/bin/bash\n", runner=runner) == "5151"
    assert runner.calls == [("sbatch", "--parsable")] and seen == ["#!/bin/bash\n"]


def test_submit_sbatch_refusal_and_garbage_are_scheduler_errors() -> None:
    refused = FakeRunner({"sbatch": CommandResult(
        argv=("sbatch",), returncode=1, stdout="",
        stderr="sbatch: error: Batch job submission failed: Invalid account")})
    with pytest.raises(SchedulerError, match="Invalid account"):
        submit_sbatch("x", runner=refused)
    with pytest.raises(SchedulerError, match="expected a job id"):
        submit_sbatch("x", runner=FakeRunner({"sbatch": "hello\n"}))
    assert parse_parsable_job_id("\n 77 \n") == "77"


def test_submitit_batch_shell_survives_sigterm_and_the_preempt_signal(fake_slurm: Path) -> None:
    import signal
    import time

    run_dir = fake_slurm / "run"
    submit_tiny(run_dir)
    (fake_slurm / "bin" / "srun").write_text(
        f"#!/bin/bash\necho started > {fake_slurm}/started\nsleep 1.5\n"
        f"echo done > {fake_slurm}/done\nexit 5\n")
    shell = subprocess.Popen(["bash", str(fake_slurm / "submitted.sh")],
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not (fake_slurm / "started").exists():
            assert time.monotonic() < deadline, "srun never started"
            time.sleep(0.05)
        shell.send_signal(signal.SIGTERM)
        shell.send_signal(signal.SIGUSR1)
        rc = shell.wait(timeout=15)
    finally:
        if shell.poll() is None:
            shell.kill()
    assert (fake_slurm / "done").exists(), "the agent step ran to its end"
    assert rc == 5, "the job's exit status is the agent step's"
    stderr = shell.stderr.read() if shell.stderr else ""
    assert "got SIGTERM" in stderr and "got SIGUSR1" in stderr
