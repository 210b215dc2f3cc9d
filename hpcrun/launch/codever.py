"""What code a run executes: the git commit, and a snapshot of a dirty work tree.

A flag that says "dirty" does not let anyone rerun the run; the snapshot does. When the tree is
dirty, every tracked and untracked-but-not-ignored file is copied into ``RUN_DIR/code/`` and the
run executes from there, so later edits in the work tree cannot leak into a requeued job.

A project that is not a git repository has no commit to name its code, so its code files (by
suffix, hidden and environment directories left out, bounded in count and size) are read at
submit, hashed into ``code.content`` (``sha256:`` of each relative path and its bytes) and
written to ``RUN_DIR/code/``: the run and every requeue of it execute those bytes. A project too
large to snapshot gets a one-line warning at submit instead: a requeue then runs whatever is on
disk at that time.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.control.spec import CodeVersion
from hpcrun.runner import CommandRunner
from hpcrun.version import __version__

SNAPSHOT_DIR = "code"
CODE_SUFFIXES = frozenset({".py", ".pyi", ".pyx", ".pxd", ".yaml", ".yml", ".toml", ".cfg",
                           ".ini", ".json", ".txt", ".sh", ".j2", ".jinja"})
"""Files of a non-git project that are code or its configuration (data and checkpoints are not)."""
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
"""Directories never snapshotted (besides hidden ones and virtual environments)."""
MAX_FILE_BYTES = 1 << 20
"""A larger file is not code: it is left out of the snapshot."""
MAX_PROJECT_FILES = 5000
"""More code files than this: no snapshot (the directory is not one project)."""
MAX_PROJECT_BYTES = 64 << 20
"""More code bytes than this: no snapshot."""
MAX_WALKED = 50_000
"""Directory entries looked at before giving up (submitting from a home directory)."""


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


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectSnapshot:
    """A non-git project's code, read once at submit."""

    files: tuple[tuple[str, bytes], ...] = ()
    """(path relative to the project, bytes), sorted by path."""
    digest: str | None = None
    """``sha256:`` of the files (:func:`content_digest`); None when refused."""
    refused: str | None = None
    """Why no snapshot was taken (then a requeue runs what is on disk at that time)."""


def content_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """``sha256:<hex>`` over each file's relative path and the SHA-256 of its bytes, in path
    order (pure): the same code gives the same digest wherever it was copied."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return "sha256:" + h.hexdigest()


def is_code_file(rel: str, nbytes: int) -> bool:
    """Whether a project file belongs in its code snapshot (pure)."""
    return Path(rel).suffix in CODE_SUFFIXES and nbytes <= MAX_FILE_BYTES


def _walk(root: Path, exclude: Sequence[Path]) -> Iterator[tuple[str, int] | None]:
    """(relative path, size) of the project's regular files; ``None`` once per directory entry
    looked at, so a caller can bound the walk."""
    skip = {p.resolve() for p in exclude}
    for top, dirs, names in os.walk(root):
        yield None
        here = Path(top)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and (here / d).resolve() not in skip
                         and not (here / d / "pyvenv.cfg").exists())
        for name in sorted(names):
            yield None
            path = here / name
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            yield path.relative_to(root).as_posix(), path.stat().st_size


def read_project(root: Path, *, exclude: Sequence[Path] = ()) -> ProjectSnapshot:
    """Read the code files of the project at ``root`` (not a git repository) for a snapshot.

    Args:
        exclude: Directories inside ``root`` to leave out (the runs root).
    """
    chosen: list[tuple[str, int]] = []
    walked = 0
    for entry in _walk(root, exclude):
        if entry is None:
            walked += 1
            if walked > MAX_WALKED:
                return ProjectSnapshot(refused=f"{root} holds more than {MAX_WALKED:,} files")
        elif is_code_file(*entry):
            chosen.append(entry)
    total = sum(n for _, n in chosen)
    if len(chosen) > MAX_PROJECT_FILES or total > MAX_PROJECT_BYTES:
        return ProjectSnapshot(refused=f"{root} holds {len(chosen):,} code files of "
                               f"{total / 2**20:.1f} MiB (a snapshot takes at most "
                               f"{MAX_PROJECT_FILES:,} files, {MAX_PROJECT_BYTES >> 20} MiB)")
    files = tuple((rel, (root / rel).read_bytes()) for rel, _ in sorted(chosen))
    return ProjectSnapshot(files=files, digest=content_digest(files))


def write_snapshot(snapshot: ProjectSnapshot, dest: Path) -> None:
    """Write the snapshot's files under ``dest`` (the run's ``code/``)."""
    for rel, data in snapshot.files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        target.write_bytes(data)


def code_version(commit: str | None, dirty: bool,
                 project: ProjectSnapshot | None) -> CodeVersion:
    """What the spec says about the code (pure): the commit (a dirty tree snapshotted), or for a
    project outside git the digest of its snapshot."""
    if project is not None and project.digest is not None:
        return CodeVersion(commit=None, dirty=False, snapshot=SNAPSHOT_DIR,
                           content=project.digest)
    return CodeVersion(commit=commit, dirty=dirty, snapshot=SNAPSHOT_DIR if dirty else None)


def no_snapshot_warning(project: ProjectSnapshot | None) -> str | None:
    """The one line submit prints when a project outside git could not be snapshotted."""
    if project is None or project.refused is None:
        return None
    return (f"the project is not a git repository and was not snapshotted ({project.refused}): "
            "a requeue runs whatever is on disk then; put it under git, or submit from the "
            "project's own directory")


def runtime_versions() -> dict[str, str]:
    """python / torch / hpcrun versions of this interpreter."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "absent"
    return {"python": platform.python_version(), "torch": torch_version, "hpcrun": __version__}
