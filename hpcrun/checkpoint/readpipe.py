"""Restore's read pipeline: parallel chunk reads, checksums overlapped, every phase timed.

1. The file's page-cache residency is measured (``mincore`` over a mapping of the file, no page
   touched): a chunk mostly in the cache is read buffered (a memcpy from the cache), the others
   O_DIRECT (the device writes straight into the destination, no copy through the cache). The
   choice is made per chunk, by measurement, not fixed.
2. Every dataset is split into :data:`~.rawio.CHUNK` requests; :data:`~.rawio.IO_THREADS`
   readers fill them, submitted in file order, straight into the destination buffer.
3. The calling thread folds each dataset's chunks, in order, into a streaming checksum as soon
   as each chunk lands (xxhash and hashlib release the GIL), so chunk k is hashed while chunk
   k+1 is read; after the last read only the hashing of the last chunks is left.
4. The digests are compared with the manifest's; a dataset that disagrees is refused
   (:class:`~hpcrun.errors.CorruptCheckpointError` names it) and nothing of it is used.

This module touches the OS (reads, ``mincore``); the phases it measures are pure values.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import mmap
import os
import queue
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from hpcrun.checkpoint.rawio import (
    ALIGN,
    CHUNK,
    IO_THREADS,
    aligned_buffer,
    drop_cache,
    open_pair,
    pread_into,
)
from hpcrun.errors import CheckpointError, StorageError

RESIDENT = 0.5
"""A chunk with at least this fraction of its pages in the page cache is read buffered."""
_O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class RestorePhases:
    """Where one restore's time went on this rank (seconds; the ``restored`` event's split)."""

    fault_s: float = 0.0
    """Faulting in (pre-touching) the read buffer: 0 when a warm buffer is reused."""
    read_s: float = 0.0
    """Bytes moving from the tier into the buffer: the shard's header check (its metadata and
    the small datasets stored inline), then first request to last byte."""
    checksum_s: float = 0.0
    """Hashing left after the last byte arrived (the rest overlapped the reads)."""
    hash_s: float = 0.0
    """All hashing work, overlapped or not."""
    copy_s: float = 0.0
    """Landing the verified pieces in the state's tensors (and the node exchange)."""
    direct_bytes: int = 0
    """Bytes read O_DIRECT (chunks found out of the page cache)."""
    buffered_bytes: int = 0
    """Bytes read through the page cache (chunks found resident, unaligned tails, datasets
    small enough to live inside the HDF5 file's metadata, a peer's copy)."""

    def fields(self) -> dict[str, float | int]:
        """The split as event fields (``<phase>_s`` rounded to microseconds, byte counts)."""
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k in self.__slots__ for v in (getattr(self, k),)}  # type: ignore[attr-defined]

    def plus(self, **more: float) -> RestorePhases:
        """These phases with ``more`` seconds (or bytes) added per field."""
        values = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        for k, v in more.items():
            values[k] += v
        return RestorePhases(**values)


@dataclass(frozen=True, kw_only=True, slots=True)
class Wanted:
    """One dataset to read and verify: where it is in the file, where it lands, its digest."""

    offset: int
    """Byte offset in the file; -1 when its bytes are already in ``dest`` (a small dataset
    HDF5 stores inline): only verified."""
    dest: np.ndarray
    """uint8 destination, the dataset's length."""
    digest: str
    """``<algorithm>:<hex>`` the manifest records."""


@dataclass(frozen=True, slots=True)
class _Chunk:
    item: int
    file_offset: int
    view: memoryview


def new_hasher(algorithm: str) -> Any:
    """A streaming hasher whose digest equals :func:`~.shards.checksum` of the same bytes."""
    if algorithm == "xxh3":
        return xxhash.xxh3_64()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise CheckpointError(f"unknown checksum {algorithm!r}; expected xxh3 or sha256")


def plan_chunks(items: Sequence[Wanted], chunk: int = CHUNK) -> list[_Chunk]:
    """Every read request, in file order per dataset (pure)."""
    out = []
    for i, w in enumerate(items):
        if w.offset < 0:
            continue
        view = w.dest.data
        for start in range(0, len(view), chunk):
            out.append(_Chunk(i, w.offset + start, view[start:start + chunk]))
    return out


def resident_pages(fd: int, size: int) -> np.ndarray | None:
    """One byte per page of the file, odd when the page is in the page cache (None: unknown)."""
    libc = _libc()
    if libc is None or size <= 0:
        return None
    pages = -(-size // mmap.PAGESIZE)
    vec = np.zeros(pages, dtype=np.uint8)
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        arr = np.frombuffer(mm, dtype=np.uint8)
        try:
            rc = libc.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(size),
                              ctypes.c_void_p(vec.ctypes.data))
        finally:
            del arr  # the mapping closes only once no array points into it
    return vec if rc == 0 else None


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return lib
    except (OSError, AttributeError):
        return None


def choose_direct(chunks: Sequence[_Chunk], vec: np.ndarray | None) -> list[bool]:
    """Per chunk: read it O_DIRECT (mostly not cached) or buffered (pure)."""
    if vec is None:
        return [True] * len(chunks)
    out = []
    for c in chunks:
        a, b = c.file_offset // mmap.PAGESIZE, -(-(c.file_offset + len(c.view)) // mmap.PAGESIZE)
        part = vec[a:b] & 1
        out.append(not part.size or float(part.mean()) < RESIDENT)
    return out


class _Bounce:
    """Reused, pre-touched aligned chunk buffers: O_DIRECT into a destination whose address is
    not block-aligned (a torch tensor's storage is 64-byte aligned) lands here first, then is
    copied on (a warm-memory copy, far faster than the device)."""

    def __init__(self) -> None:
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()

    def take(self) -> np.ndarray:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return aligned_buffer(CHUNK)

    def give(self, buf: np.ndarray) -> None:
        self._free.put(buf)


_BOUNCE = _Bounce()
"""Process-wide: at most one buffer per concurrent reader is ever created."""


def _read_chunk(fd: int, direct: int | None, c: _Chunk) -> tuple[float, int]:
    """Fill one chunk; (when it finished, bytes that went O_DIRECT)."""
    n = len(c.view) - len(c.view) % ALIGN if direct is not None and not c.file_offset % ALIGN \
        else 0
    if n and np.frombuffer(c.view, dtype=np.uint8).ctypes.data % ALIGN == 0:
        pread_into(direct, c.view[:n], c.file_offset)  # type: ignore[arg-type]
    elif n:
        bounce = _BOUNCE.take()
        try:
            pread_into(direct, bounce.data[:n], c.file_offset)  # type: ignore[arg-type]
            np.copyto(np.frombuffer(c.view[:n], dtype=np.uint8), bounce[:n])
        finally:
            _BOUNCE.give(bounce)
    if n < len(c.view):
        pread_into(fd, c.view[n:], c.file_offset + n)
    return time.perf_counter(), n


def read_verified(path: str | os.PathLike[str], items: Sequence[Wanted], *, algorithm: str,
                  threads: int = IO_THREADS, chunk: int = CHUNK, cold: bool = False,
                  ) -> tuple[list[int], RestorePhases]:
    """Read ``items`` from ``path`` into their destinations, hashing while reading.

    ``cold`` (verification: bytes served from the page cache prove nothing about the medium):
    every chunk O_DIRECT, and without O_DIRECT the file's cached pages are dropped first.

    Returns:
        The indices of the items whose checksum disagrees with ``digest`` (empty: all verified)
        and the phases measured.

    Raises:
        StorageError: the file is missing, shorter than an extent, or unreadable.
    """
    chunks = plan_chunks(items, min(chunk, CHUNK))  # a bounce buffer holds one CHUNK
    t0 = time.perf_counter()
    try:
        with open_pair(os.fspath(path), os.O_RDONLY) as (fd, direct), \
                ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            if cold and direct is None:
                drop_cache(fd)
            how = choose_direct(chunks, resident_pages(fd, os.fstat(fd).st_size)
                                if direct is not None and not cold else None)
            futures = [pool.submit(_read_chunk, fd, direct if d else None, c)
                       for c, d in zip(chunks, how, strict=True)]
            bad, hash_s = _hash_as_landed(items, chunks, futures, algorithm)
    except OSError as exc:
        raise StorageError(f"reading {os.fspath(path)!r} failed: {exc}; the shard is missing "
                           "or truncated") from exc
    done = time.perf_counter()
    last = max((f.result()[0] for f in futures), default=t0)
    direct_bytes = sum(f.result()[1] for f in futures)
    total = sum(len(c.view) for c in chunks)
    return bad, RestorePhases(read_s=last - t0, checksum_s=max(0.0, done - last), hash_s=hash_s,
                              direct_bytes=direct_bytes, buffered_bytes=total - direct_bytes)


def _hash_as_landed(items: Sequence[Wanted], chunks: Sequence[_Chunk],
                    futures: Sequence[Future[tuple[float, int]]], algorithm: str,
                    ) -> tuple[list[int], float]:
    """Hash each item's chunks in order as their reads complete; (bad items, hash seconds)."""
    by_item: dict[int, list[int]] = {}
    for k, c in enumerate(chunks):
        by_item.setdefault(c.item, []).append(k)
    bad, hash_s = [], 0.0
    for i, w in enumerate(items):
        h = new_hasher(algorithm)
        for k in by_item.get(i, []):
            futures[k].result()  # this chunk's bytes have landed (or its error is raised)
            t = time.perf_counter()
            h.update(chunks[k].view)
            hash_s += time.perf_counter() - t
        if w.offset < 0:
            t = time.perf_counter()
            h.update(w.dest.data)
            hash_s += time.perf_counter() - t
        if f"{algorithm}:{h.hexdigest()}" != w.digest:
            bad.append(i)
    return bad, hash_s


__all__ = ["RESIDENT", "RestorePhases", "Wanted", "choose_direct", "new_hasher", "plan_chunks",
           "read_verified", "resident_pages"]
