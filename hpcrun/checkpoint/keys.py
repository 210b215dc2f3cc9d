"""The names a checkpoint's shards, manifests and state trees share, and how a dtype is stored,
without torch: the drain, the manifest and the shard reader run in processes that never import
it (torch costs a drain seconds of CPU and 200 MB at each start)."""

from __future__ import annotations

from enum import StrEnum

import numpy as np

META_KEY = "__meta__"
"""Logical key of each rank's JSON meta tree inside its shard."""
RNG_FIELD = "__rng__"
"""Field of the meta tree that holds this rank's RNG streams."""
SMALL_DATASET = 64 << 10
"""Pieces below this many bytes are written through h5py, inside the shard's layout (not worth
an aligned extent); staging copies them first, so the writer lays the file out at once."""


def inline(nbytes: int) -> bool:
    """Whether a piece of ``nbytes`` is stored inside the shard's HDF5 layout (written by h5py,
    copied first by staging) rather than in an aligned extent the parallel writers fill."""
    return nbytes < SMALL_DATASET


class Placement(StrEnum):
    """Who holds a tensor leaf."""

    REPLICATED = "replicated"
    ROW = "row"
    LOCAL = "local"
    CHUNK = "chunk"
    """An N-D box of a DTensor (its offsets and lengths recorded per chunk)."""


NATIVE_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                           "uint8", "bool", "complex64", "complex128"})
"""Tensor dtypes numpy has: stored as themselves."""
UINT_OF_WIDTH = {1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}
"""The unsigned int a tensor dtype numpy lacks is stored as, by its width in bytes."""
_WIDTH = {"bfloat16": 2, "complex32": 4, "uint16": 2, "uint32": 4, "uint64": 8,
          "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
          "float8_e8m0fnu": 1}
"""Bytes per element of the tensor dtypes numpy lacks: stored as same-width unsigned ints."""


def stored_as(name: str) -> np.dtype:
    """The numpy dtype a tensor of dtype ``name`` (``"bfloat16"``) is stored as in a shard.

    Raises:
        CheckpointError: a dtype torch does not know, or cannot be stored.
    """
    if name in NATIVE_DTYPES:
        return np.dtype(name)
    if name in _WIDTH:
        return np.dtype(UINT_OF_WIDTH[_WIDTH[name]])
    from hpcrun.checkpoint.stage import storage_dtype, torch_dtype  # a dtype only torch knows

    return storage_dtype(torch_dtype(name))
