"""Object formats: how to digest, scan and randomly read one immutable data object.

Supported formats (:class:`ObjectFormat`):

- ``npy``: one ``.npy`` file of integer tokens; 1-D = one record (document), 2-D = one record
  per row. A directory of them is a source.
- ``jsonl``: JSON Lines, one record per line, either ``{"tokens": [int, ...]}`` (pre-tokenized)
  or ``{"text": "..."}`` (tokenized as UTF-8 bytes). Random access uses a byte-offset index
  built once at ``data build`` time and stored, digest-pinned, next to the manifest.
- ``hdf5``: an HDF5 file with a ``tokens`` dataset: 2-D (one record per row) or 1-D with an
  ``offsets`` dataset of ``records + 1`` boundaries.

Compressed inputs are refused: random access by record needs uncompressed bytes.
Everything here is per object and side-effect free apart from reading the object.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import re
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import h5py
import numpy as np
import xxhash

from hpcrun.errors import DataError

__all__ = ["NpyLayout", "ObjectFormat", "ObjectReader", "ObjectScan", "TokenMap", "detect_format",
           "digest_file", "npy_layout", "npy_token_span", "parse_npy_header", "scan_object"]

DIGEST_ALGO = "xxh3-128"
_READ_BLOCK = 8 << 20
_SUFFIXES = {".npy": "npy", ".jsonl": "jsonl", ".json": "jsonl", ".h5": "hdf5",
             ".hdf5": "hdf5"}
_COMPRESSED = (".gz", ".zst", ".bz2", ".xz", ".lz4")


class ObjectFormat(StrEnum):
    """On-disk layout of one data object."""

    NPY = "npy"
    JSONL = "jsonl"
    HDF5 = "hdf5"


@dataclass(frozen=True, slots=True)
class ObjectScan:
    """What one pass over an object learned: identity, size, records and their token lengths."""

    path: str
    digest: str
    nbytes: int
    lengths: np.ndarray
    offsets: np.ndarray
    record_hashes: np.ndarray


def detect_format(path: str | os.PathLike[str]) -> ObjectFormat:
    """Format of ``path`` from its suffix.

    Raises:
        DataError: compressed or unknown suffix.
    """
    name = os.fspath(path)
    if name.endswith(_COMPRESSED):
        raise DataError(f"{name}: compressed objects are not supported (records need random "
                        "access); decompress it first")
    fmt = _SUFFIXES.get(Path(name).suffix)
    if fmt is None:
        raise DataError(f"{name}: unknown object format, expected one of "
                        f"{sorted(_SUFFIXES)}; rename it or convert it")
    return ObjectFormat(fmt)


def digest_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Content digest (``xxh3-128:<hex>``) and byte size of a file, streamed."""
    h = xxhash.xxh3_128()
    nbytes = 0
    with open(path, "rb") as fh:
        while block := fh.read(_READ_BLOCK):
            h.update(block)
            nbytes += len(block)
    return f"{DIGEST_ALGO}:{h.hexdigest()}", nbytes


def scan_object(path: str, fmt: str, with_hashes: bool = False) -> ObjectScan:
    """Digest an object and measure its records (runs in a worker process at build time).

    Args:
        path: Resolved path of the object.
        fmt: An :class:`ObjectFormat` value.
        with_hashes: Also return a 64-bit content hash per record (for deduplication).

    Returns:
        The :class:`ObjectScan`; ``offsets`` is empty except for ``jsonl``.
    """
    digest, nbytes = digest_file(path)
    scanner = {ObjectFormat.NPY: _scan_npy, ObjectFormat.JSONL: _scan_jsonl,
               ObjectFormat.HDF5: _scan_hdf5}[ObjectFormat(fmt)]
    lengths, offsets, hashes = scanner(path, with_hashes)
    return ObjectScan(path=path, digest=digest, nbytes=nbytes, lengths=lengths,
                      offsets=offsets, record_hashes=hashes)


class ObjectReader:
    """Random access to the records of one object; keeps the object open (thread-safe reads).

    ``npy`` keeps only its parsed header and reads a record with one ``pread`` (no mapping
    or descriptor held, so a million one-document objects cost no file handles), ``jsonl``
    reads with ``pread`` at indexed offsets, ``hdf5`` keeps one read-only handle (h5py
    serialises its calls internally).
    """

    def __init__(self, path: str, fmt: ObjectFormat, offsets: np.ndarray) -> None:
        self.path, self.fmt, self._offsets = path, fmt, offsets
        self._npy: NpyLayout | None = None
        self._fd: int | None = None
        self._h5: h5py.File | None = None
        if fmt is ObjectFormat.NPY:
            self._npy = npy_layout(path)
        elif fmt is ObjectFormat.JSONL:
            self._fd = os.open(path, os.O_RDONLY)
        else:
            self._h5 = h5py.File(path, "r", locking=False)

    def read(self, record: int) -> np.ndarray:
        """Tokens of physical record ``record``, as ``int64``."""
        if self._npy is not None:
            return self._npy.read(self.path, record)
        if self._fd is not None:
            lo, hi = int(self._offsets[record]), int(self._offsets[record + 1])
            return _tokens_of_line(os.pread(self._fd, hi - lo, lo), self.path, record)
        assert self._h5 is not None
        return _h5_record(self._h5, record)

    def token_map(self) -> TokenMap | None:
        """Every token of the object as one flat read-only memory map, or ``None`` when the
        records are not plain contiguous integers on disk (JSON Lines, chunked or compressed
        HDF5, an empty object); those are read record by record with :meth:`read`."""
        if self._npy is not None:
            return self._npy.token_map(self.path)
        if self._h5 is not None:
            return _h5_token_map(self._h5, self.path)
        return None

    def close(self) -> None:
        """Release the file handle or mapping."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None
        self._npy = None


@dataclass(frozen=True, slots=True)
class NpyLayout:
    """Where the records of a C-ordered ``.npy`` file lie: data offset, dtype, shape."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    def read(self, path: str, record: int) -> np.ndarray:
        per = self.shape[1] if len(self.shape) == 2 else self.shape[0]
        start = self.offset + (record * per * self.dtype.itemsize if len(self.shape) == 2 else 0)
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = os.pread(fd, per * self.dtype.itemsize, start)
        finally:
            os.close(fd)
        if len(raw) != per * self.dtype.itemsize:
            raise DataError(f"{path}: record {record} is truncated ({len(raw)} bytes); the "
                            "object changed since the manifest was built")
        return np.frombuffer(raw, dtype=self.dtype).astype(np.int64)


    def token_map(self, path: str) -> TokenMap | None:
        total = int(np.prod(self.shape))
        if total == 0:
            return None
        flat = _map_tokens(path, self.dtype, self.offset, total)
        return TokenMap(tokens=flat, per_record=self.shape[1] if len(self.shape) == 2 else 0)


def _map_tokens(path: str, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """``count`` items of ``dtype`` at byte ``offset`` of ``path``, mapped read-only.

    A plain array over :class:`mmap.mmap` (not ``np.memmap``, whose Python-level
    ``__getitem__`` costs more than the copy for a short document); the mapping lives as long
    as the array and holds no file descriptor.
    """
    with open(path, "rb") as fh:
        region = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return np.frombuffer(region, dtype=dtype, count=count, offset=offset)
    except ValueError as exc:
        region.close()
        raise DataError(f"{path}: holds fewer than {count} tokens after byte {offset}; the "
                        "object changed since the manifest was built, rebuild it") from exc


@dataclass(frozen=True, slots=True)
class TokenMap:
    """One object's tokens as a flat memory map, and where each physical record starts in it.

    Holding a map costs no file descriptor; the dataset bounds how many it keeps.
    """

    tokens: np.ndarray
    """Every token of the object, in record order (read-only ``np.memmap``)."""
    per_record: int
    """Tokens per record for fixed-length rows (0 for a single-record object)."""
    bounds: np.ndarray | None = None
    """Record boundaries (``records + 1``) for variable-length records, else ``None``."""

    def starts(self, physical: np.ndarray) -> np.ndarray:
        """Flat index of the first token of each physical record in ``physical``."""
        if self.bounds is not None:
            return self.bounds[physical]
        return physical * self.per_record


def _h5_token_map(f: h5py.File, path: str) -> TokenMap | None:
    """Map an uncompressed, contiguous ``tokens`` dataset straight from the file."""
    tokens = f["tokens"]
    offset = tokens.id.get_offset() if tokens.chunks is None else None
    if offset is None or tokens.size == 0:
        return None
    flat = _map_tokens(path, tokens.dtype, offset, tokens.size)
    if tokens.ndim == 2:
        return TokenMap(tokens=flat, per_record=int(tokens.shape[1]))
    return TokenMap(tokens=flat, per_record=0, bounds=_h5_offsets(f, path))


_NPY_HEADER = re.compile(rb"\{'descr': '([<>|][a-z]\d+)', 'fortran_order': False, "
                         rb"'shape': \((\d+),?(?: (\d+))?\), \}\s*\Z")
"""The header numpy's writer emits for a C-ordered 1-D or 2-D array (format 1.0), matched on
the bytes (no decode: it runs once per document of a one-file-per-document corpus)."""


def npy_layout(path: str) -> NpyLayout:
    """Where the tokens of the ``.npy`` at ``path`` lie: the header parsed with a regex
    (numpy's own writer format), or by numpy for any other header."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    return parse_npy_header(head) or _npy_layout_slow(path)


def _npy_header(head: bytes) -> tuple[int, str, int, int | None] | None:
    """``(data offset, descr, rows, cols or None)`` from a ``.npy``'s first bytes, or None."""
    if head[:8] != b"\x93NUMPY\x01\x00" or len(head) < 10:
        return None
    end = 10 + head[8] + (head[9] << 8)
    match = _NPY_HEADER.match(head, 10, end) if end <= len(head) else None
    if match is None:
        return None
    descr, rows, cols = match.groups()
    return end, descr.decode(), int(rows), None if cols is None else int(cols)


def npy_token_span(head: bytes) -> tuple[int, np.dtype, int] | None:
    """``(data offset, dtype, token count)`` of a 1-D or 2-D ``.npy`` from its first bytes
    (no layout object: a document file's reader needs only these)."""
    found = _npy_header(head)
    if found is None:
        return None
    end, descr, rows, cols = found
    return end, _dtype(descr), rows * (1 if cols is None else cols)


def parse_npy_header(head: bytes) -> NpyLayout | None:
    """Data offset, dtype and shape of a C-ordered 1-D or 2-D ``.npy`` from its first bytes.

    Handles the header numpy's writer emits (format 1.0); ``None`` for anything else (the
    caller falls back to ``numpy.load``).
    """
    found = _npy_header(head)
    if found is None:
        return None
    end, descr, rows, cols = found
    shape = (rows,) if cols is None else (rows, cols)
    return NpyLayout(offset=end, dtype=_dtype(descr), shape=shape)


NPY_LOCK = threading.Lock()
"""Held around every ``.npy``/``.npz`` header read. numpy parses a header with
``ast.literal_eval``, and CPython 3.11's AST constructor is not thread-safe (two threads at once
can raise ``SystemError: AST constructor recursion depth mismatch``); the bytes after the header
are read outside it."""


@functools.lru_cache(maxsize=64)
def _dtype(descr: str) -> np.dtype:
    """``np.dtype(descr)``, cached: a corpus of one file per document has one or two."""
    return np.dtype(descr)


def _npy_layout_slow(path: str) -> NpyLayout:
    with NPY_LOCK:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    if arr.ndim not in (1, 2) or not arr.flags.c_contiguous or not isinstance(arr, np.memmap):
        raise DataError(f"{path}: expected a C-ordered 1-D or 2-D token array, found shape "
                        f"{arr.shape}; rewrite it with numpy.save")
    layout = NpyLayout(offset=int(arr.offset), dtype=arr.dtype, shape=tuple(arr.shape))
    del arr  # release the mapping at once
    return layout


def _empty() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


def _scan_npy(path: str, with_hashes: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with NPY_LOCK:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    if arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer) \
            or not arr.flags.c_contiguous:
        raise DataError(f"{path}: expected a C-ordered 1-D or 2-D integer token array, found "
                        f"shape {arr.shape} dtype {arr.dtype}; rewrite it with numpy.save")
    rows = [arr] if arr.ndim == 1 else list(arr)
    lengths = np.asarray([r.shape[0] for r in rows], dtype=np.int64)
    hashes = _hashes(rows) if with_hashes else _empty()
    return lengths, _empty(), hashes


def _scan_jsonl(path: str, with_hashes: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets, lengths, hashes = [0], [], []
    with open(path, "rb") as fh:
        for i, line in enumerate(fh):
            tokens = _tokens_of_line(line, path, i)
            offsets.append(offsets[-1] + len(line))
            lengths.append(tokens.size)
            if with_hashes:
                hashes.append(xxhash.xxh3_64_intdigest(tokens.tobytes()))
    return (np.asarray(lengths, dtype=np.int64), np.asarray(offsets, dtype=np.int64),
            np.asarray(hashes, dtype=np.uint64))


def _scan_hdf5(path: str, with_hashes: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with h5py.File(path, "r", locking=False) as f:
        if "tokens" not in f:
            raise DataError(f"{path}: expected an HDF5 dataset 'tokens', found {list(f)}")
        tokens = f["tokens"]
        if tokens.ndim == 2:
            lengths = np.full(tokens.shape[0], tokens.shape[1], dtype=np.int64)
        else:
            bounds = _h5_offsets(f, path)
            lengths = np.diff(bounds).astype(np.int64)
        count = lengths.size
        hashes = (_hashes([_h5_record(f, i) for i in range(count)]) if with_hashes
                  else _empty())
    return lengths, _empty(), hashes


def _h5_offsets(f: h5py.File, path: str) -> np.ndarray:
    if "offsets" not in f:
        raise DataError(f"{path}: a 1-D 'tokens' dataset needs an 'offsets' dataset of record "
                        "boundaries; add it or store one record per row (2-D)")
    bounds = np.asarray(f["offsets"][...], dtype=np.int64)
    if bounds.ndim != 1 or bounds.size < 1 or np.any(np.diff(bounds) < 0) \
            or bounds[0] != 0 or bounds[-1] != f["tokens"].shape[0]:
        raise DataError(f"{path}: 'offsets' must rise from 0 to len(tokens), found "
                        f"{bounds[:3]}...{bounds[-3:]}")
    return bounds


def _h5_record(f: h5py.File, record: int) -> np.ndarray:
    tokens = f["tokens"]
    if tokens.ndim == 2:
        return np.asarray(tokens[record], dtype=np.int64)
    lo, hi = (int(v) for v in f["offsets"][record:record + 2])
    return np.asarray(tokens[lo:hi], dtype=np.int64)


def _tokens_of_line(line: bytes, path: str, record: int) -> np.ndarray:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise DataError(f"{path}: record {record} is not valid JSON ({exc})") from exc
    if isinstance(obj, dict) and isinstance(obj.get("tokens"), list):
        return np.asarray(obj["tokens"], dtype=np.int64)
    if isinstance(obj, dict) and isinstance(obj.get("text"), str):
        return np.frombuffer(obj["text"].encode(), dtype=np.uint8).astype(np.int64)
    raise DataError(f"{path}: record {record} must be an object with 'tokens' (list of ints) "
                    f"or 'text' (string), found {str(obj)[:60]!r}")


def _hashes(rows: list[np.ndarray]) -> np.ndarray:
    return np.asarray([xxhash.xxh3_64_intdigest(np.asarray(r, dtype=np.int64).tobytes())
                       for r in rows], dtype=np.uint64)
