"""Directories hpcrun writes into belong to the user running it.

A node-local path like ``/tmp/hpcrun-$USER`` is predictable: another user of the node can create
it first (or a symlink by that name) and read, replace or redirect every shard written there.
So the node-local root and the run directory are created if missing and then checked: owned by
this user, not writable by group or others unless the sticky bit is set. The node-local path is
refused when any of its components is a symlink (configure the real path in the site config) or
when an existing ancestor is writable by others without the sticky bit (they could swap the
directory under us).

:func:`dir_problem` and :func:`ancestor_problem` are pure (stat values in, a problem or None
out); :func:`ensure_private_dir` is the shell.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from hpcrun.errors import UnsafeDirectoryError

__all__ = ["ancestor_problem", "dir_problem", "ensure_private_dir"]

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def dir_problem(st: os.stat_result, *, uid: int) -> str | None:
    """What is wrong with a directory hpcrun writes into (its ``lstat``), or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by {_owner(st.st_uid)}, not by {_owner(uid)}"
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        return f"is writable by group or others without the sticky bit (mode {st.st_mode:o})"
    return None


def ancestor_problem(st: os.stat_result, *, uid: int) -> str | None:
    """What is wrong with an existing ancestor of the node-local root (its ``lstat``), or None.

    Ancestors may belong to anyone (``/``, ``/local``); they must not be symlinks, and must not
    let other users rename entries in them (group/world-writable without the sticky bit).
    """
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX and st.st_uid != uid:
        return f"is writable by group or others without the sticky bit (mode {st.st_mode:o})"
    return None


def _refuse(path: Path, what: str, problem: str, fix: str) -> UnsafeDirectoryError:
    return UnsafeDirectoryError(f"{what} {path} {problem}; expected a directory of your own "
                                f"that only you can write; {fix}")


def _check_ancestors(path: Path, *, what: str, uid: int) -> None:
    for parent in reversed(path.parents):
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            return  # created below, by us
        problem = ancestor_problem(st, uid=uid)
        if problem is not None:
            raise _refuse(parent, f"an ancestor of the {what}", problem,
                          "point the site config at the real path (no symlinks) on a "
                          "filesystem only its owners can rename entries in")


def ensure_private_dir(path: str | os.PathLike[str], *, what: str, uid: int | None = None,
                       check_ancestors: bool = False, mode: int = 0o700) -> Path:
    """Create ``path`` (and missing parents) if needed, then refuse it unless it is safe.

    Args:
        path: the directory.
        what: what it is, for the message ("node-local directory", "run directory").
        uid: whose it must be (default: this process's user).
        check_ancestors: also refuse symlinked or others-writable ancestors (node-local paths).
        mode: permission bits of a directory created here (before the umask).

    Raises:
        UnsafeDirectoryError: it is another user's, others can write it, or (with
            ``check_ancestors``) its path runs through a symlink.
    """
    path = Path(os.path.abspath(path))
    uid = os.getuid() if uid is None else uid
    if check_ancestors:
        _check_ancestors(path, what=what, uid=uid)
    with contextlib.suppress(FileExistsError):  # a dangling symlink or a file: reported below
        path.mkdir(parents=True, exist_ok=True, mode=mode)
    problem = dir_problem(os.lstat(path), uid=uid)
    if problem is not None:
        raise _refuse(path, what, problem,
                      f"remove or rename it (ls -ld {path}) or choose another path")
    return path
