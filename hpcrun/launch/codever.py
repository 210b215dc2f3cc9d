"""What code a run executes: the git commit, and a snapshot of a dirty work tree.

A flag that says "dirty" does not let anyone rerun the run; the snapshot does. When the tree is
dirty, every tracked and untracked-but-not-ignored file is copied into ``RUN_DIR/code/`` and the
run executes from there, so later edits in the work tree cannot leak into a requeued job.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from hpcrun.runner import CommandRunner
from hpcrun.version import __version__

SNAPSHOT_DIR = "code"


def repo_root(cwd: Path, runner: CommandRunner) -> Path:
    """The top of the git tree holding ``cwd`` (the job's code directory); ``cwd`` outside one."""
    out = runner.run(["git", "-C", str(cwd), "rev-parse", "--show-toplevel"])
    return Path(out.stdout.strip()) if out.returncode == 0 else cwd


def git_state(cwd: Path, runner: CommandRunner) -> tuple[str | None, bool]:
    """(commit, dirty) of the git tree at ``cwd``; (None, False) outside a repository."""
    head = runner.run(["git", "-C", str(cwd), "rev-parse", "HEAD"])
    if head.returncode != 0:
        return None, False
    status = runner.run(["git", "-C", str(cwd), "status", "--porcelain"])
    return head.stdout.strip(), bool(status.stdout.strip())


def tree_files(cwd: Path, runner: CommandRunner) -> list[str]:
    """Tracked and untracked-not-ignored files of the tree (relative paths)."""
    out = runner.run(["git", "-C", str(cwd), "ls-files", "-co", "--exclude-standard", "-z"])
    out.check()
    return [p for p in out.stdout.split("\0") if p]


def snapshot_tree(cwd: Path, dest: Path, runner: CommandRunner) -> int:
    """Copy the work tree's files into ``dest``; return how many were copied."""
    count = 0
    for rel in tree_files(cwd, runner):
        src = cwd / rel
        if not src.is_file() or src.is_symlink():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        shutil.copy2(src, target)
        count += 1
    return count


def runtime_versions() -> dict[str, str]:
    """python / torch / hpcrun versions of this interpreter."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "absent"
    return {"python": platform.python_version(), "torch": torch_version, "hpcrun": __version__}
