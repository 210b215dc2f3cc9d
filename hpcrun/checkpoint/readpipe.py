"""Restore's read pipeline: parallel chunk reads, checksums overlapped, every phase timed.

1. The file's page-cache residency is measured (``mincore`` over a mapping of the file, no page
   touched): a chunk mostly in the cache is read buffered (a memcpy from the cache).
2. The chunks out of the cache are read the way this device reads cold bytes faster, measured:
   O_DIRECT (the device writes straight into the destination) or buffered with readahead asked
   for ahead of the readers (``POSIX_FADV_SEQUENTIAL``, ``WILLNEED`` :data:`READAHEAD_CHUNKS`
   ahead; on some virtual disks kernel readahead outruns O_DIRECT requests). The first restore
   from a device in a process probes it: :data:`PROBE_CHUNKS` cold chunks each way, the bytes
   the restore needs anyway; :func:`faster_mode` picks, and the process keeps the choice.
3. Every dataset is split into :data:`~.rawio.CHUNK` requests; :data:`~.rawio.IO_THREADS`
   readers fill them, submitted in file order, straight into the destination buffer.
4. The calling thread folds each dataset's chunks, in order, into a streaming checksum as soon
   as each chunk lands (xxhash and hashlib release the GIL), so chunk k is hashed while chunk
   k+1 is read; after the last read only the hashing of the last chunks is left.
5. The digests are compared with the manifest's; a dataset that disagrees is refused
   (:class:`~hpcrun.errors.CorruptCheckpointError` names it) and nothing of it is used.

This module touches the OS (reads, ``mincore``); the phases it measures are pure values.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import mmap
import os
import queue
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import xxhash

from hpcrun.checkpoint.rawio import (
    ALIGN,
    CHUNK,
    IO_THREADS,
    aligned_buffer,
    drop_cache,
    libc,
    open_pair,
    pread_into,
)
from hpcrun.errors import CheckpointError, StorageError

RESIDENT = 0.5
"""A chunk with at least this fraction of its pages in the page cache is read buffered."""
PROBE_CHUNKS = 4
"""Cold chunks the probe reads each way (O_DIRECT, then buffered) to pick a device's mode."""
READAHEAD_CHUNKS = 8
"""A buffered cold read asks the kernel (``WILLNEED``) for the chunk this many ahead of it."""
BUFFERED_MARGIN = 1.05
"""Buffered cold reads are chosen only when the probe measured them this much faster: O_DIRECT
costs no copy through the page cache and leaves the cache to training."""
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_log = logging.getLogger(__name__)


class ReadMode(StrEnum):
    """How chunks out of the page cache are read."""

    DIRECT = "direct"
    """O_DIRECT: the device writes into the destination (or an aligned bounce buffer)."""
    BUFFERED = "buffered"
    """Through the page cache, kernel readahead asked for ahead of the readers."""


_COLD_MODE: dict[int, ReadMode] = {}
"""Per device (``st_dev``): the cold-read mode its probe measured faster, in this process."""


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
    lib = libc()
    if lib is None or size <= 0:
        return None
    pages = -(-size // mmap.PAGESIZE)
    vec = np.zeros(pages, dtype=np.uint8)
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        arr = np.frombuffer(mm, dtype=np.uint8)
        try:
            rc = lib.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(size),
                             ctypes.c_void_p(vec.ctypes.data))
        finally:
            del arr  # the mapping closes only once no array points into it
    return vec if rc == 0 else None


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


def faster_mode(rates: Mapping[ReadMode, float], margin: float = BUFFERED_MARGIN) -> ReadMode:
    """The cold-read mode to use from the probe's measured rates (bytes/s; pure)."""
    direct, buffered = rates.get(ReadMode.DIRECT, 0.0), rates.get(ReadMode.BUFFERED, 0.0)
    return ReadMode.BUFFERED if buffered > margin * direct else ReadMode.DIRECT


def readahead_hints(chunks: Sequence[_Chunk], buffered_cold: Sequence[bool],
                    ahead: int = READAHEAD_CHUNKS) -> list[tuple[int, int] | None]:
    """Per chunk, the ``(offset, length)`` its reader asks the kernel to read ahead: the chunk
    ``ahead`` places later when that one is a buffered cold read too (pure)."""
    out: list[tuple[int, int] | None] = []
    for k in range(len(chunks)):
        j = k + ahead
        hint = buffered_cold[k] and j < len(chunks) and buffered_cold[j]
        out.append((chunks[j].file_offset, len(chunks[j].view)) if hint else None)
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


def _read_chunk(fd: int, direct: int | None, c: _Chunk,
                hint: tuple[int, int] | None = None) -> tuple[float, int]:
    """Fill one chunk; (when it finished, bytes that went O_DIRECT). ``hint``: a range to ask
    the kernel to read ahead first (buffered cold reads)."""
    if hint is not None and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, hint[0], hint[1], os.POSIX_FADV_WILLNEED)
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
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            out_of_cache = choose_direct(chunks, resident_pages(fd, os.fstat(fd).st_size)
                                         if direct is not None and not cold else None)
            futures = _submit(pool, _Files(fd=fd, direct=direct, cold=cold), chunks,
                              out_of_cache)
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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Files:
    fd: int
    """Buffered descriptor."""
    direct: int | None
    """O_DIRECT descriptor (None: the filesystem refuses O_DIRECT)."""
    cold: bool
    """Verification: every chunk from the medium, never a probe."""


def _submit(pool: ThreadPoolExecutor, files: _Files, chunks: Sequence[_Chunk],
            out_of_cache: Sequence[bool]) -> list[Future[tuple[float, int]]]:
    """Queue every chunk's read; those out of the cache by the device's measured cold mode
    (probed first, on the first chunks out of the cache, when this process has not yet)."""
    futures: dict[int, Future[tuple[float, int]]] = {}
    mode = _cold_mode(files) or _probe(pool, files, chunks, out_of_cache, futures)
    buffered_cold = [c and mode is ReadMode.BUFFERED for c in out_of_cache]
    hints = readahead_hints(chunks, buffered_cold)
    for k, c in enumerate(chunks):
        if k not in futures:
            d = files.direct if out_of_cache[k] and mode is ReadMode.DIRECT else None
            futures[k] = pool.submit(_read_chunk, files.fd, d, c, hints[k])
    return [futures[k] for k in range(len(chunks))]


def _cold_mode(files: _Files) -> ReadMode | None:
    """The mode for chunks out of the cache when no probe is needed (None: probe)."""
    if files.direct is None:
        return ReadMode.BUFFERED
    if files.cold:
        return ReadMode.DIRECT
    return _COLD_MODE.get(os.fstat(files.fd).st_dev)


def _probe(pool: ThreadPoolExecutor, files: _Files, chunks: Sequence[_Chunk],
           out_of_cache: Sequence[bool], futures: dict[int, Future[tuple[float, int]]],
           ) -> ReadMode:
    """Read :data:`PROBE_CHUNKS` cold chunks O_DIRECT, then as many buffered, each group with
    all its requests in flight; keep the faster mode for this device (too few cold chunks to
    measure: O_DIRECT, not kept). The probe's destinations are faulted in first, so it
    measures the device, not the first touch of a new buffer (which the two modes pay
    differently)."""
    cold = [k for k, c in enumerate(out_of_cache) if c]
    if len(cold) < 3 * PROBE_CHUNKS:
        return ReadMode.DIRECT
    for k in cold[:2 * PROBE_CHUNKS]:
        np.frombuffer(chunks[k].view, dtype=np.uint8)[::mmap.PAGESIZE] = 0
    rates = {}
    for mode, group in ((ReadMode.DIRECT, cold[:PROBE_CHUNKS]),
                        (ReadMode.BUFFERED, cold[PROBE_CHUNKS:2 * PROBE_CHUNKS])):
        d = files.direct if mode is ReadMode.DIRECT else None
        t = time.perf_counter()
        batch = {k: pool.submit(_read_chunk, files.fd, d, chunks[k]) for k in group}
        futures_wait(batch.values())
        rates[mode] = sum(len(chunks[k].view) for k in group) / max(time.perf_counter() - t,
                                                                     1e-9)
        futures.update(batch)
    choice = _COLD_MODE[os.fstat(files.fd).st_dev] = faster_mode(rates)
    _log.info("cold reads measured at %.2f GB/s O_DIRECT, %.2f GB/s buffered with readahead: "
              "reading %s", rates[ReadMode.DIRECT] / 1e9, rates[ReadMode.BUFFERED] / 1e9, choice)
    return choice


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


__all__ = ["BUFFERED_MARGIN", "PROBE_CHUNKS", "READAHEAD_CHUNKS", "RESIDENT", "ReadMode",
           "RestorePhases", "Wanted", "choose_direct", "faster_mode", "new_hasher",
           "plan_chunks", "read_verified", "readahead_hints", "resident_pages"]
