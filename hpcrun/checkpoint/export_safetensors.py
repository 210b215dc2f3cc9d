"""The Hugging Face safetensors layout, written and read without the ``safetensors`` package.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and ``data_offsets`` into the byte buffer that follows, plus ``__metadata__``,
string to string), padded with spaces to 8 bytes, then the tensors' bytes back to back. A
model larger than one file is split into ``<stem>-00001-of-0000N.safetensors`` files and a
``<stem>.safetensors.index.json`` (``metadata.total_size``, ``weight_map``: key → file), the
layout ``transformers`` and ``safetensors.torch.load_file`` over the index expect.

Pure: :func:`plan_files` (which keys go into which file, by size), :func:`build_index`,
:func:`encode_header`, :func:`decode_header`. Effectful: :func:`write_file`, :func:`read_file`,
:func:`read_any` (a file, an index, or a directory holding either).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcrun.errors import CheckpointError

DTYPES: Mapping[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32",
    torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
"""torch dtype → safetensors dtype name."""
TORCH_DTYPES: Mapping[str, torch.dtype] = {v: k for k, v in DTYPES.items()}
DEFAULT_MAX_FILE_BYTES = 5 << 30
"""Largest file before a model is split (the size ``transformers`` uses by default)."""
MAX_HEADER_BYTES = 100 << 20
"""A header larger than this is refused (the safetensors reader's own bound)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FilePlan:
    """One file of a safetensors export: its name and the keys it holds, in order."""

    name: str
    """File name inside the export directory."""
    keys: tuple[str, ...]
    """Tensor keys it holds."""
    nbytes: int
    """Data bytes of those tensors."""


def tensor_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_files(sizes: Sequence[tuple[str, int]], *, stem: str, max_bytes: int
               ) -> list[FilePlan]:
    """Split ``(key, nbytes)`` pairs, in order, into files of at most ``max_bytes`` (pure).

    A tensor larger than ``max_bytes`` gets a file of its own. One file is named
    ``<stem>.safetensors``; several ``<stem>-0000K-of-0000N.safetensors``.
    """
    if max_bytes < 1:
        raise CheckpointError(f"max file size must be >= 1 byte, got {max_bytes}")
    groups: list[list[tuple[str, int]]] = [[]]
    for key, n in sizes:
        if groups[-1] and sum(b for _, b in groups[-1]) + n > max_bytes:
            groups.append([])
        groups[-1].append((key, n))
    count = len(groups)
    names = ([f"{stem}.safetensors"] if count == 1 else
             [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)])
    return [FilePlan(name=name, keys=tuple(k for k, _ in g), nbytes=sum(b for _, b in g))
            for name, g in zip(names, groups, strict=True)]


def build_index(files: Sequence[FilePlan], *, metadata: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """The ``model.safetensors.index.json`` document of a split export (pure)."""
    weight_map = {key: f.name for f in files for key in f.keys}
    total = sum(f.nbytes for f in files)
    return {"metadata": {**(metadata or {}), "total_size": total},
            "weight_map": dict(sorted(weight_map.items()))}


def index_name(stem: str) -> str:
    return f"{stem}.safetensors.index.json"


def encode_header(tensors: Sequence[tuple[str, torch.Tensor]],
                  metadata: Mapping[str, str]) -> bytes:
    """The length prefix and JSON header of a file holding ``tensors`` in order (pure)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for key, t in tensors:
        if t.dtype not in DTYPES:
            raise CheckpointError(f"tensor {key!r} has dtype {t.dtype}, which safetensors "
                                  f"cannot hold; export it as dcp instead")
        n = tensor_nbytes(t)
        header[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                       "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def decode_header(prefix: bytes, path: Path) -> tuple[dict[str, Any], int]:
    """The header mapping and the data start of a safetensors file from its first bytes."""
    if len(prefix) < 8:
        raise CheckpointError(f"{path} is not a safetensors file (shorter than its header "
                              "length); pass a .safetensors file, its index or a DCP directory")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES or len(prefix) < 8 + n:
        raise CheckpointError(f"{path} is not a safetensors file (header of {n} bytes, file "
                              f"of {len(prefix)}); pass a .safetensors file or its index")
    try:
        header = json.loads(prefix[8:8 + n])
    except ValueError as exc:
        raise CheckpointError(f"{path} has a safetensors header that is not JSON") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a safetensors header that is not a mapping")
    return header, 8 + n


def _as_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy().data) if flat.numel() else memoryview(b"")


def write_file(path: Path, tensors: Sequence[tuple[str, torch.Tensor]],
               metadata: Mapping[str, str]) -> None:
    """Write one safetensors file (header, then each tensor's bytes), fsynced."""
    with open(path, "wb") as f:
        f.write(encode_header(tensors, metadata))
        for _, t in tensors:
            f.write(_as_bytes(t))
        f.flush()
        os.fsync(f.fileno())


def read_file(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file, by key, mapped from the file (copy-on-write pages:
    nothing is read twice into memory, and the tensors stay valid after the file closes).

    Raises:
        CheckpointError: the file is not safetensors or a tensor's bytes are out of bounds.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            decode_header(b"", path)
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    header, start = decode_header(data[:8 + _header_len(data)], path)
    return {key: _tensor_of(key, info, data, start, path)
            for key, info in header.items() if key != "__metadata__"}


def _header_len(data: mmap.mmap) -> int:
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
    return min(int(n), MAX_HEADER_BYTES + 1)


def _tensor_of(key: str, info: Any, data: mmap.mmap, start: int, path: Path) -> torch.Tensor:
    try:
        dtype = TORCH_DTYPES[info["dtype"]]
        shape = [int(s) for s in info["shape"]]
        a, b = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: tensor {key!r} has a malformed header entry "
                              f"{info!r}") from exc
    size = torch.empty((), dtype=dtype).element_size()
    if not 0 <= a <= b <= len(data) - start or b - a != math.prod(shape) * size:
        raise CheckpointError(f"{path}: tensor {key!r} has offsets [{a}, {b}) that do not fit "
                              f"its shape {shape} or the file; the file is truncated or corrupt")
    if a == b:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(data, dtype=torch.uint8, count=b - a, offset=start + a)
    return raw.view(dtype).reshape(shape)


def read_index(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a split export, through its index (files named relative to it)."""
    try:
        index = json.loads(path.read_text())
        files = sorted(set(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a safetensors index (expected JSON with a "
                              "weight_map); pass the index.json a split export wrote") from exc
    out: dict[str, torch.Tensor] = {}
    for name in files:
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(f"{path} names the file {name!r}, which is not a file next "
                                  "to the index; the index is corrupt or forged")
        out.update(read_file(path.parent / name))
    missing = sorted(set(index["weight_map"]) - set(out))
    if missing:
        raise CheckpointError(f"{path} maps {missing[:3]} to files that do not hold them; "
                              "the export is incomplete")
    return out


def find_in_dir(path: Path, stem: str = "model") -> Path | None:
    """The index or the single file of ``stem`` in directory ``path``, if it holds one."""
    for name in (index_name(stem), f"{stem}.safetensors"):
        if (path / name).is_file():
            return path / name
    return None


def read_any(path: Path) -> dict[str, torch.Tensor]:
    """Tensors from a ``.safetensors`` file, an ``.index.json``, or a directory holding one."""
    if path.is_dir():
        found = find_in_dir(path)
        if found is None:
            raise CheckpointError(f"{path} holds neither model.safetensors nor "
                                  f"{index_name('model')}; pass the file or the index itself")
        path = found
    return read_index(path) if path.name.endswith(".json") else read_file(path)
