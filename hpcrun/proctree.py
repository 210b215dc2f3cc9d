"""Process trees: list a process's descendants and kill a whole tree at once.

A node power loss is emulated by SIGKILLing a node's agent and everything it started in one
sweep, so nothing in the tree can react or respawn (the ``nodecrash`` injection,
``hpcrun signal RUN --crash-node``). Linux only: the tree is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def crash_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants at once, as a node power loss would.

    The tree is listed first and the root killed first, so nothing can react or respawn; each
    descendant's process group goes too (ranks lead their own sessions with their helpers). The
    calling process, when part of the tree, dies last.
    """
    tree = [pid, *descendants(pid)]
    me = os.getpid()
    leaders = [t for t in tree if t != me and _leads_group(t)]
    for target in tree:
        if target != me:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    if me in tree and _leads_group(me):
        os.killpg(me, signal.SIGKILL)
    elif me in tree:
        os.kill(me, signal.SIGKILL)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False
