"""The storage seam: every metadata-visible file operation of the record and checkpoint code.

Parallel filesystems (Lustre, GPFS) are slow at metadata, not at bytes, so the operations that
matter at scale (create, stat, rename, fsync, list) go through one :class:`Storage` object that a
benchmark can wrap with :class:`CountingStorage`. Bulk shard bytes may bypass it (h5py, O_DIRECT)
but their files are still created, renamed and fsynced through it.
"""

from __future__ import annotations

import collections
import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Protocol, runtime_checkable

from hpcrun.errors import StorageError

PathLike = str | os.PathLike[str]


@runtime_checkable
class Storage(Protocol):
    """File operations on one tier."""

    def create_exclusive(self, path: PathLike, data: bytes) -> bool:
        """Create ``path`` with ``data`` iff it does not exist, atomically and durably.

        Returns False when the name is taken. This is the log's atomic primitive.
        """
        ...

    def write_atomic(self, path: PathLike, data: bytes) -> None:
        """Durably replace ``path``: temp file in the same directory, fsync, rename, fsync dir."""
        ...

    def read_bytes(self, path: PathLike) -> bytes: ...

    def exists(self, path: PathLike) -> bool: ...

    def size(self, path: PathLike) -> int: ...

    def listdir(self, path: PathLike) -> list[str]:
        """Names in ``path``, sorted; empty when it does not exist."""
        ...

    def makedirs(self, path: PathLike, mode: int = 0o750) -> None: ...

    def rename(self, src: PathLike, dst: PathLike) -> None: ...

    def fsync_path(self, path: PathLike) -> None:
        """fsync a file or a directory."""
        ...

    def remove(self, path: PathLike) -> None: ...

    def rmtree(self, path: PathLike) -> None: ...


def _wrap(op: str, path: PathLike, exc: OSError) -> StorageError:
    return StorageError(f"{op} {os.fspath(path)!r} failed: {exc.strerror or exc}; "
                        "check that the tier is mounted, writable and not full")


class LocalStorage:
    """POSIX implementation, correct on local disks, Lustre, GPFS and NFSv3+."""

    def create_exclusive(self, path: PathLike, data: bytes) -> bool:
        # Write the bytes under a private name, then link(2) them into place: link is atomic
        # and fails with EEXIST when the name is taken (POSIX, Lustre, GPFS, NFSv3+), so a
        # reader never sees the name with partial content, unlike O_CREAT|O_EXCL then write.
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.new")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        except OSError as exc:
            raise _wrap("create", path, exc) from exc
        self.fsync_path(target.parent)
        return True

    def write_atomic(self, path: PathLike, data: bytes) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            self.fsync_path(target.parent)
        except OSError as exc:
            raise _wrap("write", path, exc) from exc

    def read_bytes(self, path: PathLike) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise _wrap("read", path, exc) from exc

    def exists(self, path: PathLike) -> bool:
        return os.path.exists(path)

    def size(self, path: PathLike) -> int:
        try:
            return os.stat(path).st_size
        except OSError as exc:
            raise _wrap("stat", path, exc) from exc

    def listdir(self, path: PathLike) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _wrap("list", path, exc) from exc

    def makedirs(self, path: PathLike, mode: int = 0o750) -> None:
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
        except OSError as exc:
            raise _wrap("mkdir", path, exc) from exc

    def rename(self, src: PathLike, dst: PathLike) -> None:
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise _wrap("rename", src, exc) from exc

    def fsync_path(self, path: PathLike) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise _wrap("open", path, exc) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EBADF):  # some filesystems refuse dir fsync
                raise _wrap("fsync", path, exc) from exc
        finally:
            os.close(fd)

    def remove(self, path: PathLike) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _wrap("remove", path, exc) from exc

    def rmtree(self, path: PathLike) -> None:
        shutil.rmtree(path, ignore_errors=True)


class CountingStorage:
    """Wraps a :class:`Storage` and counts each operation by name (for scale benchmarks)."""

    _OPS = ("create_exclusive", "write_atomic", "read_bytes", "exists", "size", "listdir",
            "makedirs", "rename", "fsync_path", "remove", "rmtree")

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.counts: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name not in self._OPS:
            raise AttributeError(name)
        fn = getattr(self.inner, name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted


LOCAL_STORAGE = LocalStorage()
