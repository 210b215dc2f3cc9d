"""Documents stored one per ``.npy`` file, read with ``pread`` straight into a batch buffer.

A corpus of one file per document pays a file-system bill per document: mapping each file
(open, header read, ``mmap``, page faults, ``munmap`` when the map is evicted) costs several
times the bytes it brings. :class:`DocumentFiles` reads a segment of such a document with one
``pread``, the way a plain sequential read would:

- the first touch of a file reads its header and, for files up to :data:`HEAD_BYTES`, the whole
  document in the same ``pread``; the parsed layout (data offset, dtype, token count) is kept,
  a few bytes per object, so later touches read exactly the segment's bytes;
- the segments come back as views of the bytes read, in the batch's order, so the caller
  copies a whole batch's documents into place with one ``concatenate``;
- descriptors stay open in a bounded LRU per reader thread (``max_open`` each), so a document
  split across rows or batches, or read again in a later epoch while still open, costs no
  ``open``; each thread closes only its own descriptors, so no read ever races a ``close``
  (a thread that has ended leaves its descriptors to be closed when the next one starts).

Nothing here decides order: it returns the tokens the order named, in that order.
"""

from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import Sequence

import numpy as np

from hpcrun.data.formats import npy_layout, npy_token_span
from hpcrun.errors import DataError

__all__ = ["HEAD_BYTES", "DocumentFiles"]

HEAD_BYTES = 64 << 10
"""Bytes of a file read on first touch: its header and, for a document up to this size, all
of it (one system call per small document, like a plain read)."""

_MAX_OPEN = 128
"""Descriptors kept open per reader thread (the process limit is shared with everything
else the rank opens)."""


class DocumentFiles:
    """Segments of single-record ``.npy`` objects, read with ``pread``.

    Args:
        paths: Path of each object of the source (indexed by object number).
        nbytes: Byte size of each object (from the manifest).
        single: Per object, whether it holds exactly one record (only those are read here).
        max_open: Descriptors kept open per reader thread.
    """

    def __init__(self, paths: Sequence[str], nbytes: Sequence[int], single: np.ndarray, *,
                 max_open: int = _MAX_OPEN) -> None:
        self.paths, self.single, self.max_open = list(paths), single, max(1, max_open)
        self._head = [min(int(n), HEAD_BYTES) for n in nbytes]
        self._layouts: list[tuple[int, np.dtype, int] | None] = [None] * len(self.paths)
        self._local = threading.local()
        self._caches: dict[threading.Thread, collections.OrderedDict[int, int]] = {}
        self._lock = threading.Lock()

    def read_segments(self, objects: np.ndarray, offsets: np.ndarray,
                      lengths: np.ndarray) -> list[np.ndarray]:
        """Tokens ``offsets[i]..offsets[i]+lengths[i]`` of ``objects[i]``, in the given order
        (views of the bytes read; the caller copies them into the batch).

        Consecutive segments of one object (a document split across rows) are read with one
        ``pread`` of the span they cover.

        Raises:
            DataError: a segment ends past its file's tokens (the object changed since the
                manifest was built).
        """
        fds, objs = self._fds(), objects.tolist()
        lo, hi = offsets.tolist(), (offsets + lengths).tolist()
        out: list[np.ndarray] = []
        i, n = 0, len(objs)
        while i < n:
            obj, j = objs[i], i + 1
            while j < n and objs[j] == obj:
                j += 1
            if j == i + 1:  # the common case: the span is the segment
                out.append(self._span(fds, obj, lo[i], hi[i]))
            else:
                s_lo, s_hi = min(lo[i:j]), max(hi[i:j])
                toks = self._span(fds, obj, s_lo, s_hi)
                out.extend([toks[lo[t] - s_lo:hi[t] - s_lo] for t in range(i, j)])
            i = j
        return out

    def open_count(self) -> int:
        """Descriptors open now, over all reader threads."""
        with self._lock:
            return sum(len(c) for c in self._caches.values())

    def close(self) -> None:
        """Close every kept descriptor (call once no reader thread is reading)."""
        with self._lock:
            for cache in self._caches.values():
                _close_all(cache)
            self._caches.clear()
        self._local = threading.local()

    def _fds(self) -> collections.OrderedDict[int, int]:
        cache: collections.OrderedDict[int, int] | None = getattr(self._local, "fds", None)
        if cache is None:
            cache = self._local.fds = collections.OrderedDict()
            with self._lock:
                # A restarted reader runs on new threads: the old threads' descriptors go.
                for thread in [t for t in self._caches if not t.is_alive()]:
                    _close_all(self._caches.pop(thread))
                self._caches[threading.current_thread()] = cache
        return cache

    def _open(self, fds: collections.OrderedDict[int, int], obj: int) -> int:
        """A new descriptor for ``obj``, kept in this thread's LRU (the oldest closed)."""
        fd = fds[obj] = os.open(self.paths[obj], os.O_RDONLY)
        if len(fds) > self.max_open:
            os.close(fds.popitem(last=False)[1])
        return fd

    def _span(self, fds: collections.OrderedDict[int, int], obj: int, lo: int,
              hi: int) -> np.ndarray:
        """Tokens ``lo..hi`` of object ``obj`` (one ``pread``, or none past the first)."""
        fd = fds.get(obj)
        if fd is None:
            fd = self._open(fds, obj)
        else:
            fds.move_to_end(obj)
        layout = self._layouts[obj]
        head = b""
        if layout is None:
            head = os.pread(fd, self._head[obj], 0)
            layout = self._layouts[obj] = self._layout(head, obj)
        offset, dtype, count = layout
        if lo < 0 or hi > count:
            raise DataError(f"{self.paths[obj]}: tokens {lo}..{hi} end past the object's "
                            f"{count} tokens; the object changed since the manifest was built, "
                            "rebuild it")
        start, size = offset + lo * dtype.itemsize, (hi - lo) * dtype.itemsize
        if start + size <= len(head):  # the first touch read it with the header
            return np.frombuffer(head, dtype=dtype, count=hi - lo, offset=start)
        raw = os.pread(fd, size, start)
        if len(raw) != size:
            raise DataError(f"{self.paths[obj]}: tokens {lo}..{hi} are past the end of the "
                            f"file ({len(raw)} of {size} bytes read); the object changed since "
                            "the manifest was built, rebuild it")
        return np.frombuffer(raw, dtype=dtype)

    def _layout(self, head: bytes, obj: int) -> tuple[int, np.dtype, int]:
        fast = npy_token_span(head)
        if fast is not None:
            return fast
        found = npy_layout(self.paths[obj])
        return found.offset, found.dtype, math.prod(found.shape)


def _close_all(cache: collections.OrderedDict[int, int]) -> None:
    for fd in cache.values():
        os.close(fd)
    cache.clear()
