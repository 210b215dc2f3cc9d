"""An in-memory :class:`hpcrun.storage.Storage` for the scale simulation.

It keeps the directory tree and every file's size, and the content only of files the
simulation reads back (``keep``), so a 16,384-rank checkpoint with gigabytes of sub-manifests
fits in memory. It implements the same contract as ``LocalStorage`` (exclusive create, atomic
replace, sorted listing) so the run log and the commit protocol run on it unchanged.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from hpcrun.errors import StorageError
from hpcrun.storage import PathLike


def _norm(path: PathLike) -> str:
    return posixpath.normpath(os.fspath(path))


class MemStorage:
    """Directories, file sizes and (selected) contents, in memory."""

    def __init__(self, keep: Callable[[str], bool] = lambda path: True) -> None:
        self.keep = keep
        self.dirs: set[str] = {"/"}
        self.children: dict[str, set[str]] = {"/": set()}
        self.sizes: dict[str, int] = {}
        self.data: dict[str, bytes] = {}
        self.dirs_created = 0
        self.files_created = 0

    def _parent_ok(self, path: str) -> None:
        if posixpath.dirname(path) not in self.dirs:
            raise StorageError(f"create {path!r} failed: no such directory")

    def put(self, path: PathLike, data: bytes | int) -> None:
        """Create or replace a file (``int``: its size only, content not kept)."""
        p = _norm(path)
        self._parent_ok(p)
        if p not in self.sizes:
            self.files_created += 1
            self.children[posixpath.dirname(p)].add(posixpath.basename(p))
        self.sizes[p] = data if isinstance(data, int) else len(data)
        self.data.pop(p, None)
        if isinstance(data, bytes) and self.keep(p):
            self.data[p] = data

    def create_exclusive(self, path: PathLike, data: bytes) -> bool:
        if _norm(path) in self.sizes:
            return False
        self.put(path, data)
        return True

    def write_atomic(self, path: PathLike, data: bytes) -> None:
        self.put(path, data)

    def read_bytes(self, path: PathLike) -> bytes:
        p = _norm(path)
        if p not in self.data:
            raise StorageError(f"read {p!r} failed: missing (or its content was not kept)")
        return self.data[p]

    def exists(self, path: PathLike) -> bool:
        p = _norm(path)
        return p in self.sizes or p in self.dirs

    def size(self, path: PathLike) -> int:
        p = _norm(path)
        if p not in self.sizes:
            raise StorageError(f"stat {p!r} failed: missing")
        return self.sizes[p]

    def listdir(self, path: PathLike) -> list[str]:
        return sorted(self.children.get(_norm(path), ()))

    def makedirs(self, path: PathLike, mode: int = 0o750) -> None:
        p = _norm(path)
        while p not in self.dirs:
            self.dirs.add(p)
            self.children[p] = set()
            self.dirs_created += 1
            self.children.setdefault(posixpath.dirname(p), set()).add(posixpath.basename(p))
            p = posixpath.dirname(p)

    def rename(self, src: PathLike, dst: PathLike) -> None:
        s, d = _norm(src), _norm(dst)
        if s not in self.sizes:
            raise StorageError(f"rename {s!r} failed: missing")
        self._parent_ok(d)
        self.children[posixpath.dirname(s)].discard(posixpath.basename(s))
        self.children[posixpath.dirname(d)].add(posixpath.basename(d))
        self.sizes[d] = self.sizes.pop(s)
        if s in self.data:
            self.data[d] = self.data.pop(s)

    def fsync_path(self, path: PathLike) -> None:
        if not self.exists(path):
            raise StorageError(f"fsync {os.fspath(path)!r} failed: missing")

    def remove(self, path: PathLike) -> None:
        p = _norm(path)
        if self.sizes.pop(p, None) is not None:
            self.children[posixpath.dirname(p)].discard(posixpath.basename(p))
        self.data.pop(p, None)

    def rmtree(self, path: PathLike) -> None:
        p = _norm(path)
        prefix = p + "/"
        for f in [f for f in self.sizes if f.startswith(prefix)]:
            self.remove(f)
        gone = {d for d in self.dirs if d == p or d.startswith(prefix)}
        self.dirs -= gone
        for d in gone:
            self.children.pop(d, None)
        self.children.get(posixpath.dirname(p), set()).discard(posixpath.basename(p))
