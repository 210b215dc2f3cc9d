"""A dataset opened for a run: objects verified against the manifest, records by sample ID.

Opening checks every object before anything is read: a missing or changed object raises
:class:`~hpcrun.errors.DataError` naming the object, the expected digest and the found one,
never a silent substitution. Indexes (kept record numbers, token lengths, byte offsets) are a
cache keyed by their content digest and re-verified on load.
"""

from __future__ import annotations

import collections
import io
import os
import threading
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from hpcrun.data.docfiles import DocumentFiles
from hpcrun.data.formats import NPY_LOCK, ObjectFormat, ObjectReader, TokenMap, digest_file
from hpcrun.data.manifest import DatasetManifest, ObjectEntry, SourceEntry, digest_arrays
from hpcrun.errors import DataError, OutOfRangeError
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = ["Dataset", "SourceView", "Verify", "audit_objects", "index_path", "load_index",
           "load_manifest", "write_index"]

_INDEX_KEYS = ("lengths", "offsets", "records")
_MAX_MAPS = 4096
"""Token maps kept open at once (each is one mapping; the kernel caps mappings per process)."""


class Verify(StrEnum):
    """How much of each object to check when a dataset is opened."""

    FULL = "full"
    """Hash every byte (the default; catches any change)."""
    SIZE = "size"
    """Check existence and byte size only (fast; misses same-size edits)."""


def index_path(manifest_path: str | os.PathLike[str], index_digest: str) -> Path:
    """Where the index with ``index_digest`` of a manifest lives."""
    m = Path(manifest_path)
    return m.with_name(f"{m.stem}.index") / f"{index_digest.split(':', 1)[-1]}.npz"


def write_index(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Durably write an index (an ``.npz`` of plain integer arrays, no pickle)."""
    LOCAL_STORAGE.makedirs(path.parent)
    buf = io.BytesIO()
    named: dict[str, Any] = {k: np.asarray(arrays[k], dtype=np.int64) for k in _INDEX_KEYS}
    np.savez(buf, **named)
    LOCAL_STORAGE.write_atomic(path, buf.getvalue())


def load_index(path: Path, expected: str, obj: ObjectEntry) -> dict[str, np.ndarray]:
    """Load an index and verify it against its digest and its object's counts.

    Raises:
        DataError: missing, unreadable, or not the index the manifest names.
    """
    try:
        with NPY_LOCK, np.load(path, allow_pickle=False) as npz:  # small: headers and all
            arrays = {k: np.asarray(npz[k], dtype=np.int64) for k in _INDEX_KEYS}
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"index {path} of object {obj.path} is missing or unreadable "
                        f"({exc}); expected digest {expected}; rerun `hpcrun data build`"
                        ) from exc
    found = digest_arrays(**arrays)
    if found != expected or arrays["lengths"].size != obj.kept:
        raise DataError(f"index {path} of object {obj.path} changed: expected digest "
                        f"{expected}, found {found}; rerun `hpcrun data build`")
    return arrays


def load_manifest(path: str | os.PathLike[str], *, storage: Storage = LOCAL_STORAGE
                  ) -> DatasetManifest:
    """Read and validate the manifest at ``path`` (shape, schema, seal): every reader's door.

    Raises:
        DataError: the file is not a well-formed manifest, or its ``dataset_id`` does not match
            its content (one line naming the file, what was found and the fix).
        StorageError: the file cannot be read.
    """
    return DatasetManifest.from_json(storage.read_bytes(path), origin=os.fspath(path))


def audit_objects(manifest: DatasetManifest, manifest_path: str | os.PathLike[str], *,
                  digest: Collection[str] = (), workers: int = 4) -> list[DataError]:
    """Every problem with the manifest's objects, without stopping at the first.

    Each object is checked for presence and byte size and its index for presence (metadata
    only); the objects whose paths are in ``digest`` are also hashed in full and their indexes
    verified against their digests.

    Returns:
        One :class:`DataError` per bad object (or index), in manifest order; empty when all
        checked objects match.
    """
    def one(obj: ObjectEntry, source: str) -> DataError | None:
        try:
            verify_object(obj, source, Verify.FULL if obj.path in digest else Verify.SIZE)
            idx = index_path(manifest_path, obj.index_digest)
            if obj.path in digest:
                load_index(idx, obj.index_digest, obj)
            elif not idx.is_file():
                raise DataError(f"index {idx} of object {obj.path} is missing: expected digest "
                                f"{obj.index_digest}; rerun `hpcrun data build`")
        except DataError as exc:
            return exc
        except OSError as exc:
            return DataError(f"data object {obj.path} (source {source!r}) cannot be read "
                             f"({exc.strerror or exc}); check its permissions and the tier")
        return None

    jobs = [(o, s.name) for s in manifest.sources for o in s.objects]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = list(pool.map(lambda job: one(*job), jobs))
    return [exc for exc in found if exc is not None]


def verify_object(obj: ObjectEntry, source: str, mode: Verify) -> None:
    """Raise :class:`DataError` unless ``obj`` is present and (per ``mode``) unchanged."""
    if not os.path.isfile(obj.path):
        raise DataError(f"data object {obj.path} (source {source!r}) is missing: expected "
                        f"digest {obj.digest}, found no file; restore it or rebuild the manifest")
    if mode is Verify.SIZE:
        size = os.path.getsize(obj.path)
        if size != obj.nbytes:
            raise DataError(f"data object {obj.path} (source {source!r}) changed: expected "
                            f"{obj.nbytes} bytes (digest {obj.digest}), found {size} bytes; "
                            "restore it or rebuild the manifest")
        return
    found, _ = digest_file(obj.path)
    if found != obj.digest:
        raise DataError(f"data object {obj.path} (source {source!r}) changed: expected digest "
                        f"{obj.digest}, found {found}; restore it or rebuild the manifest")


@dataclass(frozen=True, slots=True)
class SourceView:
    """What the order needs of a source: size, sample-ID base, token length per record."""

    name: str
    size: int
    base: int
    lengths: np.ndarray

    @property
    def mean_tokens(self) -> float:
        return float(self.lengths.mean())


class Dataset:
    """Random access to the records of a verified manifest.

    Args:
        manifest: The manifest.
        manifest_path: Where it was read from (indexes live next to it).
        verify: How much of each object to check now.
        workers: Threads used to verify objects (default: every core).
    """

    def __init__(self, manifest: DatasetManifest, manifest_path: str | os.PathLike[str], *,
                 verify: Verify | str = Verify.FULL, workers: int | None = None) -> None:
        self.manifest = manifest
        self.manifest_path = Path(manifest_path)
        self._verify_all(Verify(verify), workers or os.cpu_count() or 1)
        self._indexes = [[load_index(index_path(manifest_path, o.index_digest), o.index_digest,
                                     o) for o in s.objects] for s in manifest.sources]
        self.sources = tuple(self._view(s, idx) for s, idx in
                             zip(manifest.sources, self._indexes, strict=True))
        self._starts = [np.asarray([o.start for o in s.objects], dtype=np.int64)
                        for s in manifest.sources]
        self._physical = [np.concatenate([i["records"] for i in idx]) if idx
                          else np.empty(0, dtype=np.int64) for idx in self._indexes]
        self._readers: dict[tuple[int, int], ObjectReader] = {}
        self._maps: collections.OrderedDict[tuple[int, int], TokenMap | None] = \
            collections.OrderedDict()
        self._lock = threading.Lock()
        self._files = [self._document_files(s) for s in manifest.sources]

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: Verify | str = Verify.FULL,
             workers: int | None = None) -> Dataset:
        """Read, validate and verify the manifest at ``path``."""
        return cls(load_manifest(path), path, verify=verify, workers=workers)

    @property
    def dataset_id(self) -> str:
        return self.manifest.dataset_id

    def read(self, source: int, record: int) -> np.ndarray:
        """Tokens of logical record ``record`` of source ``source``."""
        view = self.sources[source]
        if not 0 <= record < view.size:
            raise OutOfRangeError(f"record {record} is outside source {view.name!r}, which "
                                  f"holds records 0..{view.size - 1}")
        obj = int(np.searchsorted(self._starts[source], record, side="right")) - 1
        entry = self.manifest.sources[source].objects[obj]
        physical = int(self._indexes[source][obj]["records"][record - entry.start])
        return self._reader(source, obj).read(physical)

    def locate(self, source: int, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Objects and physical record numbers of logical ``records`` of ``source`` (vectorized).

        Raises:
            OutOfRangeError: a record is outside the source.
        """
        view = self.sources[source]
        if records.size and (int(records.min()) < 0 or int(records.max()) >= view.size):
            raise OutOfRangeError(f"records {int(records.min())}..{int(records.max())} are "
                                  f"outside source {view.name!r}, which holds records "
                                  f"0..{view.size - 1}")
        objects = np.searchsorted(self._starts[source], records, side="right") - 1
        return objects, self._physical[source][records]

    def token_map(self, source: int, obj: int) -> TokenMap | None:
        """Object ``obj`` of ``source`` as a flat token map (``None``: read by record)."""
        key = (source, obj)
        with self._lock:
            if key in self._maps:
                self._maps.move_to_end(key)
                return self._maps[key]
        found = self._reader(source, obj).token_map()
        with self._lock:
            self._maps[key] = found
            while len(self._maps) > _MAX_MAPS:
                self._maps.popitem(last=False)
        return found

    def document_files(self, source: int) -> DocumentFiles | None:
        """The ``pread`` reader of ``source``'s single-record ``.npy`` objects, or ``None``
        when the source has none (its objects are read through token maps)."""
        return self._files[source]

    def read_physical(self, source: int, obj: int, physical: int) -> np.ndarray:
        """Tokens of physical record ``physical`` of object ``obj`` (record-by-record path)."""
        return self._reader(source, obj).read(physical)

    def read_sample(self, sample_id: int) -> np.ndarray:
        """Tokens of global sample ``sample_id``."""
        bases = [s.base for s in self.sources]
        source = int(np.searchsorted(bases, sample_id, side="right")) - 1
        if source < 0:
            raise OutOfRangeError(f"sample ID {sample_id} is negative; sample IDs start at 0")
        return self.read(source, sample_id - bases[source])

    def close(self) -> None:
        """Close every open object."""
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
            self._maps.clear()
        for files in self._files:
            if files is not None:
                files.close()

    def _reader(self, source: int, obj: int) -> ObjectReader:
        key = (source, obj)
        reader = self._readers.get(key)
        if reader is None:
            with self._lock:
                reader = self._readers.get(key)
                if reader is None:
                    entry = self.manifest.sources[source]
                    reader = ObjectReader(entry.objects[obj].path, ObjectFormat(entry.format),
                                          self._indexes[source][obj]["offsets"])
                    self._readers[key] = reader
        return reader

    def _verify_all(self, mode: Verify, workers: int) -> None:
        jobs = [(o, s.name) for s in self.manifest.sources for o in s.objects]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(verify_object, o, name, mode) for o, name in jobs]:
                fut.result()

    @staticmethod
    def _document_files(source: SourceEntry) -> DocumentFiles | None:
        single = np.asarray([o.records == 1 for o in source.objects], dtype=bool)
        if ObjectFormat(source.format) is not ObjectFormat.NPY or not single.any():
            return None
        return DocumentFiles([o.path for o in source.objects], [o.nbytes for o in source.objects],
                             single)

    @staticmethod
    def _view(source: SourceEntry, indexes: list[dict[str, np.ndarray]]) -> SourceView:
        lengths = np.concatenate([i["lengths"] for i in indexes]) if indexes else np.empty(0)
        return SourceView(name=source.name, size=source.records, base=source.base,
                          lengths=lengths.astype(np.int64))
