"""HDF5 shards: one self-describing file per rank, readable with plain h5py or h5dump.

A shard holds one dataset per piece at ``/<logical key>`` (the key's ``/`` separate groups), plus
``/__meta__`` (the rank's JSON meta tree as bytes). Root attributes: ``format``,
``schema_version``, ``run_id``, ``ckpt_id``, ``generation``, ``step``, ``rank``, ``world_size``,
``node``, ``keys``. Dataset attributes: ``key``, ``dtype`` (the true torch dtype; bfloat16 is
stored as uint16), ``placement``, ``global_shape``, ``row_start``, ``row_stop``, ``checksum``.

Large datasets are contiguous and allocated when created, at 4 KiB-aligned offsets, so their
bytes are written by :mod:`hpcrun.checkpoint.rawio` at those offsets instead of through h5py.
Files are opened with HDF5 file locking off (parallel filesystems do not support it) and written
under a temporary name that is renamed into place only once complete and fsynced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import h5py
import numpy as np
import xxhash

from hpcrun.checkpoint.blocks import block_ranges, digest_spans, rows_per_block
from hpcrun.checkpoint.keys import SMALL_DATASET, Placement, inline, stored_as
from hpcrun.checkpoint.manifest import DatasetRecord, ShardRecord
from hpcrun.checkpoint.rawio import (
    ALIGN,
    CHUNK,
    Extent,
    align_up,
    read_extents,
    write_extents,
)
from hpcrun.checkpoint.readpipe import RestorePhases, Wanted, read_verified
from hpcrun.errors import CheckpointError, CorruptCheckpointError, StorageError
from hpcrun.storage import LOCAL_STORAGE, Storage

if TYPE_CHECKING:
    from hpcrun.checkpoint.stage import StagedPiece, StageProgress, StagingBuffer

SHARD_FORMAT = "hpcrun-shard"
SHARD_SCHEMA_VERSION = 2
"""2: chunk datasets (DTensor boxes) carry ``offsets``, ``lengths`` and ``placements``
attributes; version-1 shards read unchanged."""
CHECKSUMS = ("xxh3", "sha256")

FaultHook = Callable[[str], None]
Ready = Callable[..., None]
"""``ready(piece index, upto=None)``: block until that many bytes of the staged piece landed."""


def checksum(algorithm: str, data: Any) -> str:
    """``<algorithm>:<hex digest>`` of a bytes-like object."""
    if algorithm == "xxh3":
        return "xxh3:" + xxhash.xxh3_64_hexdigest(data)
    if algorithm == "sha256":
        return "sha256:" + hashlib.sha256(data).hexdigest()
    raise CheckpointError(f"unknown checksum {algorithm!r}; expected one of {CHECKSUMS}")


def shard_relpath(node: str, rank: int) -> str:
    """Path of a rank's shard inside a checkpoint directory."""
    return f"{node}/rank-{rank:05d}.h5"


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardHeader:
    """Root attributes of a shard."""

    run_id: str
    """Run."""
    ckpt_id: str
    """Checkpoint."""
    generation: int
    """Generation of the writer."""
    step: int
    """Step captured."""
    rank: int
    """Writer rank."""
    world_size: int
    """Ranks in the checkpoint."""
    node: str
    """Writer's node."""


def _h5path(key: str) -> str:
    return "/" + key


def _early_dcpl() -> h5py.h5p.PropDCID:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


def _create_dataset(f: h5py.File, sp: StagedPiece, data: np.ndarray) -> int:
    p = sp.piece
    if inline(p.nbytes):
        ds = f.create_dataset(_h5path(p.key), data=data)
        offset = -1
    else:
        ds = f.create_dataset(_h5path(p.key), shape=p.shape, dtype=data.dtype, dcpl=_early_dcpl())
        offset = ds.id.get_offset()
        if offset is None or offset % ALIGN:
            raise CheckpointError(f"HDF5 placed {p.key!r} at offset {offset}, expected an "
                                  f"allocated {ALIGN}-aligned extent; check the h5py version")
    ds.attrs.update({"key": p.key, "dtype": p.dtype, "placement": str(p.placement),
                     "global_shape": json.dumps(list(p.global_shape)),
                     "row_start": p.row_start, "row_stop": p.row_stop, "checksum": ""})
    if p.placement is Placement.CHUNK:
        ds.attrs.update({"offsets": json.dumps(list(p.offsets)),
                         "lengths": json.dumps(list(p.lengths)),
                         "placements": json.dumps(list(p.placements))})
    return int(offset)


@contextlib.contextmanager
def _laid_out(tmp: Path, header: ShardHeader, keys: Sequence[str]) -> Iterator[h5py.File]:
    """The shard's HDF5 file at ``tmp``, open for its layout (closed, metadata flushed, on
    exit); datasets of at least :data:`SMALL_DATASET` bytes get aligned contiguous extents."""
    with h5py.File(tmp, "w", locking=False, libver="latest", alignment_threshold=SMALL_DATASET,
                   alignment_interval=ALIGN) as f:
        f.attrs.update({"format": SHARD_FORMAT, "schema_version": SHARD_SCHEMA_VERSION,
                        "keys": json.dumps(list(keys)),
                        **{k: getattr(header, k) for k in header.__slots__}})  # type: ignore[attr-defined]
        yield f


def _lay_out(f: h5py.File, buffer: StagingBuffer, staged: Sequence[StagedPiece], ready: Ready,
             offsets: list[int]) -> Iterator[Extent]:
    """Create each piece's dataset in ``f``, recording its file offset in ``offsets`` (-1: its
    bytes are stored inside the layout), and yield the extent of each large one as soon as it
    is placed, so its writes start while the rest of the file is laid out."""
    for k, sp in enumerate(staged):
        if inline(sp.piece.nbytes):
            ready(k)  # its bytes go into the layout (staging copies these first)
        raw = buffer.view(sp.offset, sp.piece.nbytes)
        offset = _create_dataset(f, sp, raw.view(stored_as(sp.piece.dtype)).reshape(
            sp.piece.shape))
        offsets.append(offset)
        if offset >= 0:
            yield Extent(file_offset=offset, buffer=raw.data)


def write_shard(path: Path, header: ShardHeader, buffer: StagingBuffer,
                staged: Sequence[StagedPiece], *, algorithm: str = "xxh3",
                fault: FaultHook = lambda stage: None,
                storage: Storage = LOCAL_STORAGE,
                progress: StageProgress | None = None) -> ShardRecord:
    """Write a rank's staged pieces as a durable shard at ``path`` and describe it.

    With ``progress`` the pieces may still be staging: each 16 MiB request is written once its
    bytes have landed; hashing starts, and the shard is sealed, only once staging is over. The
    file exists under ``path`` only once every byte is written and fsynced.

    Raises:
        StorageError: the tier failed (full, unwritable).
        CheckpointError: staging was abandoned.
    """
    ready: Ready = progress.wait if progress is not None else _landed
    storage.makedirs(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    with ThreadPoolExecutor(max_workers=1) as hashing:
        # the checksums (xxhash and hashlib release the GIL) are computed while the bytes are
        # written; they are set as attributes once both are done
        pending = hashing.submit(_digests_staged, algorithm, buffer, staged, progress)
        large = [k for k, sp in enumerate(staged) if not inline(sp.piece.nbytes)]
        offsets: list[int] = []
        try:
            with _laid_out(tmp, header, [sp.piece.key for sp in staged]) as f:
                write_extents(tmp, _lay_out(f, buffer, staged, ready, offsets), sync=False,
                              before=lambda i, end: _before_write(i, end, len(large) // 2, large,
                                                                  ready, fault),
                              # the large extents alone: the file holds them and more
                              allocate=sum(align_up(staged[k].piece.nbytes) for k in large))
        except OSError as exc:
            raise StorageError(f"creating shard {tmp} failed: {exc}; check the tier") from exc
        if not large:
            fault("shard_write")
        digests = pending.result()
    if progress is not None:
        progress.wait_sealed()
    _seal(tmp, staged, digests)
    storage.fsync_path(tmp)
    storage.rename(tmp, path)
    storage.fsync_path(path.parent)
    records = tuple(_record(sp, o, d) for sp, o, d in zip(staged, offsets, digests, strict=True))
    return ShardRecord(rank=header.rank, node=header.node,
                       path=shard_relpath(header.node, header.rank),
                       bytes=storage.size(path), datasets=records)


def _before_write(i: int, end: int, half: int, large: Sequence[int], ready: Ready,
                  fault: FaultHook) -> None:
    """Before a request of extent ``i`` up to byte ``end`` is queued: the mid-write fault stage
    (at the first request of the middle extent), then wait for those bytes to land."""
    if i == half and end <= CHUNK:
        fault("shard_write")
    ready(large[i], end)


_Digests = tuple[str, int, tuple[str, ...]]
"""A piece's checksum, rows per row block (0: none) and each block's checksum."""


def _digests_staged(algorithm: str, buffer: StagingBuffer, staged: Sequence[StagedPiece],
                    progress: StageProgress | None) -> list[_Digests]:
    """Every piece's digests, once staging is over: hashing during the staging copy would
    compete with it for the CPUs (a longer exposed pause); it overlaps the write backlog."""
    if progress is not None:
        progress.wait_sealed()
    return [_digest(algorithm, buffer.view(sp.offset, sp.piece.nbytes), sp.piece)
            for sp in staged]


def _landed(index: int, upto: int | None = None) -> None:
    """No staging in flight: every byte is in the buffer already."""


def _digest(algorithm: str, raw: np.ndarray, p: Any) -> _Digests:
    """The whole piece's checksum and, for a large DTensor box, its row blocks'
    (:mod:`~hpcrun.checkpoint.blocks`: what a resharding restore reads and verifies)."""
    whole = checksum(algorithm, raw)
    per = rows_per_block(p.lengths, p.nbytes) if p.placement is Placement.CHUNK else 0
    if not per:
        return whole, 0, ()
    row = p.nbytes // p.lengths[0]
    return whole, per, tuple(checksum(algorithm, raw[a * row:b * row])
                             for a, b in block_ranges(p.lengths[0], per))


def _seal(tmp: Path, staged: Sequence[StagedPiece], digests: Sequence[_Digests]) -> None:
    """Set each dataset's checksum attribute (the bytes are written; fsync follows)."""
    try:
        with h5py.File(tmp, "r+", locking=False) as f:
            for sp, (digest, _, _) in zip(staged, digests, strict=True):
                f[_h5path(sp.piece.key)].attrs["checksum"] = digest
    except OSError as exc:
        raise StorageError(f"finishing shard {tmp} failed: {exc}; check the tier") from exc


def _record(sp: StagedPiece, offset: int, digests: _Digests) -> DatasetRecord:
    p = sp.piece
    digest, per, blocks = digests
    return DatasetRecord(key=p.key, h5path=_h5path(p.key), placement=p.placement,
                         dtype=p.dtype, global_shape=p.global_shape, row_start=p.row_start,
                         row_stop=p.row_stop, offset=offset, nbytes=p.nbytes, checksum=digest,
                         offsets=p.offsets, lengths=p.lengths, placements=p.placements,
                         block_rows=per, blocks=blocks)


def _corrupt(path: Path | str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"shard {path} is corrupt: {what}; it will not be loaded "
                                  "(restore falls back to an older committed checkpoint)")


class ShardSource(Protocol):
    """Where a restore reads one shard file's bytes: a file on this node, or a peer's copy."""

    @property
    def name(self) -> str:
        """The copy, as error messages name it."""
        ...

    def size(self) -> int:
        """The copy's size in bytes (CorruptCheckpointError when it is missing)."""
        ...

    def open_h5(self) -> h5py.File:
        """The copy opened read-only with h5py (for its header and small datasets)."""
        ...

    def read_into(self, extents: Sequence[tuple[int, np.ndarray]]) -> None:
        """Fill each ``(file offset, uint8 buffer)`` from the copy (StorageError on failure)."""
        ...


@dataclass(frozen=True, slots=True)
class LocalShard:
    """A shard file on this node (tier 0, tier 1, or a copy held for a partner)."""

    path: Path
    """The file."""

    @property
    def name(self) -> str:
        """The file's path."""
        return str(self.path)

    def size(self) -> int:
        """Its size; CorruptCheckpointError when it is missing."""
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            raise _corrupt(self.path, "the file is missing") from None

    def open_h5(self) -> h5py.File:
        """Opened with HDF5 file locking off (parallel filesystems do not support it)."""
        return h5py.File(self.path, "r", locking=False)

    def read_into(self, extents: Sequence[tuple[int, np.ndarray]]) -> None:
        """Read past the page cache straight into the buffers."""
        read_extents(self.path, [Extent(file_offset=off, buffer=buf.data) for off, buf in extents])


def _check_dataset(f: h5py.File, d: DatasetRecord, dest: np.ndarray, path: str) -> None:
    """HDF5's own account of one dataset agrees with the manifest (shape, dtype, attributes,
    place); an inline dataset's bytes are copied into ``dest``."""
    ds = f.get(d.h5path)
    shape = d.shape
    storage = stored_as(d.dtype)
    if not isinstance(ds, h5py.Dataset) or ds.shape != shape or ds.dtype != storage:
        raise _corrupt(path, f"dataset {d.h5path!r} is missing or not {storage}{list(shape)}")
    if ds.attrs.get("checksum") != d.checksum or ds.attrs.get("key") != d.key:
        raise _corrupt(path, f"dataset {d.h5path!r} attributes disagree with the manifest")
    if d.offset < 0:
        dest[:] = np.frombuffer(np.ascontiguousarray(ds[()]).tobytes(), dtype=np.uint8)
    elif ds.id.get_offset() != d.offset:
        raise _corrupt(path, f"dataset {d.h5path!r} lies at {ds.id.get_offset()}, "
                             f"manifest says {d.offset}")


def read_shard(path: Path | ShardSource, rec: ShardRecord, dest: Sequence[np.ndarray], *,
               ckpt_id: str, algorithm: str) -> RestorePhases:
    """Read and verify every dataset of a shard into ``dest`` (one uint8 array per dataset),
    from the medium (a file's cached pages are not trusted: ``ckpt verify``, drains).

    Raises:
        CorruptCheckpointError: missing, truncated, mismatched or failing its checksums.
    """
    return read_datasets(path, rec, list(enumerate(dest)), ckpt_id=ckpt_id, algorithm=algorithm,
                         cold=True)


def read_datasets(path: Path | ShardSource, rec: ShardRecord,
                  wanted: Sequence[tuple[int, np.ndarray]], *, ckpt_id: str,
                  algorithm: str, cold: bool = False) -> RestorePhases:
    """Read and verify some datasets of a shard: ``(index in rec.datasets, uint8 destination)``.

    ``path`` is a local file or any :class:`ShardSource` (a peer's copy). Bulk bytes are read
    straight into the destinations; from a file through the pipeline of
    :mod:`~hpcrun.checkpoint.readpipe` (parallel chunk reads, O_DIRECT or buffered per chunk by
    page-cache residency, each chunk hashed as it lands). Nothing is returned unverified: each
    dataset's checksum is checked against the manifest's. ``cold``: every byte from the medium,
    none from the page cache (verification).

    Returns:
        Where the time went (read, checksum; the caller adds faults and copies).

    Raises:
        CorruptCheckpointError: missing, truncated, unreachable, mismatched or failing its
        checksums.
    """
    src = LocalShard(Path(path)) if isinstance(path, (str, os.PathLike)) else path
    pairs = [(rec.datasets[i], buf) for i, buf in wanted]
    t0 = time.perf_counter()  # the header check reads too: metadata and small datasets
    try:
        _check_header(src, rec, pairs, ckpt_id, thorough=cold)
        if isinstance(src, LocalShard):
            header_s = time.perf_counter() - t0
            return _read_pipelined(src, pairs, algorithm, cold).plus(read_s=header_s)
        src.read_into([(d.offset, buf) for d, buf in pairs if d.offset >= 0])
    except CorruptCheckpointError:
        raise
    except StorageError as exc:
        raise _corrupt(src.name, str(exc)) from exc
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        raise _corrupt(src.name, f"HDF5 could not read it ({exc})") from exc
    t1 = time.perf_counter()
    for d, buf in pairs:
        if any(checksum(algorithm, buf[a:a + n]) != digest for a, n, digest in digest_spans(d)):
            raise _corrupt(src.name, f"dataset {d.key!r} fails its {algorithm} checksum")
    hashed = time.perf_counter() - t1
    return RestorePhases(read_s=t1 - t0, checksum_s=hashed, hash_s=hashed,
                         buffered_bytes=sum(int(b.size) for _, b in pairs))


def _check_header(src: ShardSource, rec: ShardRecord,
                  pairs: Sequence[tuple[DatasetRecord, np.ndarray]], ckpt_id: str, *,
                  thorough: bool) -> None:
    """Size and header checked; small (inline) datasets' bytes copied out.

    A dataset read by its offset is proven by its checksum alone (the manifest's, which the
    commit entry's digest covers), so a restore does not open it in HDF5: on a cold file each
    object header and attribute is a random read of its own, which cost a 1 GiB FSDP restore
    a quarter of its time. ``thorough`` (verification) checks HDF5's account of every dataset
    too, so a file that plain h5py reads differently is refused."""
    if (size := src.size()) != rec.bytes:
        raise _corrupt(src.name, f"it is {size} bytes, the manifest says {rec.bytes} "
                                 "(truncated?)")
    for d, buf in pairs:
        if buf.size != d.nbytes:
            raise _corrupt(src.name, f"dataset {d.h5path!r} holds {buf.size} bytes, manifest "
                                     f"{d.nbytes}")
        if d.offset >= 0 and d.offset + d.nbytes > size:
            raise _corrupt(src.name, f"dataset {d.h5path!r} ends at {d.offset + d.nbytes}, "
                                     f"past the file's {size} bytes")
    with src.open_h5() as f:
        if (f.attrs.get("format"), f.attrs.get("ckpt_id"), f.attrs.get("rank")) != (
                SHARD_FORMAT, ckpt_id, rec.rank):
            raise _corrupt(src.name, "its header names another checkpoint or rank")
        for d, buf in pairs:
            if thorough or d.offset < 0:
                _check_dataset(f, d, buf, src.name)


def _read_pipelined(src: LocalShard, pairs: Sequence[tuple[DatasetRecord, np.ndarray]],
                    algorithm: str, cold: bool) -> RestorePhases:
    # one item per digest: a row-blocked box is verified block by block
    spans = [(k, Wanted(offset=d.offset + a if d.offset >= 0 else -1, dest=buf[a:a + n],
                        digest=digest))
             for k, (d, buf) in enumerate(pairs) for a, n, digest in digest_spans(d)]
    if algorithm not in CHECKSUMS:
        raise CheckpointError(f"unknown checksum {algorithm!r}; expected one of {CHECKSUMS}")
    bad_items, phases = read_verified(src.path, [w for _, w in spans], algorithm=algorithm,
                                      cold=cold)
    bad = sorted({spans[i][0] for i in bad_items})
    if bad:
        d = pairs[bad[0]][0]
        raise _corrupt(src.name, f"dataset {d.key!r} fails its {algorithm} checksum"
                       + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    # small datasets came through HDF5 (the page cache) while the header was checked
    return phases.plus(buffered_bytes=sum(int(b.size) for d, b in pairs if d.offset < 0))
