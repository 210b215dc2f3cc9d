"""docs/quickstart.md cannot rot: its commands run as written, on the local backend.

The page's convention (its source comment says the same): every fenced ``console`` block is run
in page order; a line starting with ``$ `` is a command, ``cd DIR`` moves the commands after it,
other lines are sample output; ``RUN`` stands for the run id ``hpcrun submit`` printed. The
commands run in a temporary copy of ``examples/quickstart/`` with ``HPCRUN_RUNS`` in a temporary
directory and the project's ``.venv/bin`` first on ``PATH``. The ``diff`` block must be the real
``diff -u`` of the two example scripts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
EXAMPLE = REPO / "examples" / "quickstart"
_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\n", re.S | re.M)
_RUN = re.compile(r"\bRUN\b")


def blocks(text: str, info: str) -> list[str]:
    """Bodies of the page's fenced blocks with this info string, in page order."""
    return [body for kind, body in _FENCE.findall(text) if kind == info]


def commands(text: str) -> list[str]:
    """The ``$ `` lines of the ``console`` blocks, without the prompt."""
    return [line[2:] for body in blocks(text, "console") for line in body.splitlines()
            if line.startswith("$ ")]


@dataclass
class Ran:
    """One command of the page as it ran."""

    command: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def follow(cmds: list[str], cwd: Path, env: dict[str, str]) -> list[Ran]:
    """Run the page's commands in order, as a reader would in one shell."""
    run_id: str | None = None
    out: list[Ran] = []
    for cmd in cmds:
        if run_id is not None:
            cmd = _RUN.sub(run_id, cmd)
        assert run_id is not None or not _RUN.search(cmd), f"`{cmd}` uses RUN before a submit"
        words = shlex.split(cmd)
        if words[0] == "cd":
            cwd = (cwd / words[1]).resolve()
            out.append(Ran(cmd, 0, "", "", 0.0))
            continue
        t0 = time.monotonic()
        done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        ran = Ran(cmd, done.returncode, done.stdout, done.stderr, time.monotonic() - t0)
        out.append(ran)
        assert done.returncode == 0, f"`{cmd}` exited {done.returncode}:\n{done.stderr[-3000:]}"
        if words[:2] == ["hpcrun", "submit"]:
            run_id = done.stdout.split()[0]
    return out


def real_diff() -> str:
    """``diff -u`` of the two example scripts, with the header timestamps left out."""
    done = subprocess.run(["diff", "-u", "train_ddp.py", "train_hpcrun.py"], cwd=EXAMPLE,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr  # 1: the files differ
    lines = done.stdout.splitlines(keepends=True)
    return "".join([line.split("\t")[0] + "\n" for line in lines[:2]] + lines[2:])


def test_the_page_shows_the_real_diff_of_the_two_example_scripts() -> None:
    shown = blocks(PAGE.read_text(), "diff")
    assert len(shown) == 1, "the quickstart shows one diff"
    assert shown[0] == real_diff(), (
        "docs/quickstart.md's diff is stale; regenerate it with `cd examples/quickstart && "
        "diff -u --label train_ddp.py --label train_hpcrun.py train_ddp.py train_hpcrun.py`")


def test_following_the_quickstart_gives_a_preempted_and_resumed_run(tmp_path: Path) -> None:
    work, runs = tmp_path / "work", tmp_path / "runs"
    shutil.copytree(EXAMPLE, work / "examples" / "quickstart",
                    ignore=shutil.ignore_patterns("__pycache__", "data", "*.pt"))
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "HPCRUN_RUNS": str(runs),
           "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.monotonic()
    ran = follow(commands(PAGE.read_text()), work, env)
    wall = time.monotonic() - t0
    project = work / "myproject"

    # The "before" script is real: torchrun trained 100 steps and saved its own snapshot.
    snapshot = torch.load(project / "snapshot.pt", weights_only=True)
    assert snapshot["step"] == 100 and set(snapshot) == {"model", "optim", "step"}

    submit = next(r for r in ran if r.command.startswith("hpcrun submit"))
    run_id = submit.stdout.split()[0]
    run_dir = (runs / run_id).resolve()
    record = read_record(run_dir)
    assert (str(record.state), record.step) == ("SUCCEEDED", 300), record.state_info
    assert record.requeues == 1 and record.generation == 2
    _, valid = fold_fences(RunLog(run_dir).read())
    states = [e.payload["state"] for e in valid if e.kind == "state"]
    assert states.count("PREEMPTED") == 1 and states.count("REQUEUED") == 1, states
    running = [e.payload for e in valid if e.kind == "state" and e.payload["state"] == "RUNNING"]
    commits = sorted(int(e.payload["step"]) for e in valid if e.kind == "commit")
    restored = running[1]["restored_step"]
    assert restored in commits and 120 <= restored < 300, (restored, commits)

    # The project is not a git repository: the run executed the snapshot submit took of it.
    code = json.loads((run_dir / "spec.json").read_text())["spec"]["code"]
    assert code["commit"] is None and code["content"].startswith("sha256:")
    assert (run_dir / "code" / "train_hpcrun.py").read_bytes() == \
        (project / "train_hpcrun.py").read_bytes()

    status = next(r for r in ran if r.command.startswith("hpcrun status") and "--json" in r.command)
    assert json.loads(status.stdout)["state"] == "SUCCEEDED"  # top level, for scripts
    report = project / "report.html"
    assert report.stat().st_size > 10_000 and run_id in report.read_text()
    listing = next(r for r in ran if r.command.startswith("hpcrun ckpt ls"))
    assert f"s{restored:010d}" in listing.stdout
    logs = next(r for r in ran if r.command.startswith("hpcrun logs"))
    assert "step 300" in logs.stdout

    print(f"quickstart: {len(ran)} commands in {wall:.1f} s; "
          + "; ".join(f"{r.command[:40]}: {r.seconds:.1f} s" for r in ran if r.seconds >= 1))
