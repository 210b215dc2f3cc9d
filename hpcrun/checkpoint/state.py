"""What a checkpoint holds, as values: flattening state into tensors plus a JSON tree, and back.

Every state family that changes future updates is saved: the user's registered objects (model,
optimizer, LR scheduler, grad scaler, data cursor, anything with ``state_dict`` /
``load_state_dict``), the RNG streams (python, numpy, torch CPU, CUDA when present), and the
checkpoint's identity (spec ID, dataset ID, layout, contract, parent, generation) in the manifest.

A state tree is flattened into *tensor leaves* (written as HDF5 datasets under a logical key) and
a *meta tree* (canonical JSON, one per rank) in which each tensor is replaced by a reference.
Nothing is pickled: a value that is neither a tensor nor JSON is refused with its path.

Placement of a tensor leaf says who holds it:

- replicated (the default, e.g. DDP): every rank has the same value; written once in total.
- :class:`RowShard`: this rank holds rows ``[row_start, row_start + len)`` of a tensor whose
  global first dimension is ``global_rows`` (dim-0 sharding); may be resharded.
- :class:`RankLocal`: a value private to this rank; restored only onto the same world size.
- a DTensor (FSDP2, tensor parallel, HSDP): this rank's local chunk, an N-D box of the global
  tensor at the offsets DTensor itself computes (:mod:`hpcrun.checkpoint.chunks`); replicas
  along ``Replicate`` mesh dims write one copy. Any other tensor subclass is refused.
"""

from __future__ import annotations

import base64
import math
import random
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hpcrun.checkpoint.keys import Placement
from hpcrun.errors import CheckpointError
from hpcrun.vocab import Tier


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class RowShard:
    """Marks a tensor as this rank's rows of a tensor sharded along dim 0."""

    tensor: torch.Tensor
    """This rank's rows."""
    row_start: int
    """Global index of this rank's first row."""
    global_rows: int
    """Rows of the whole tensor."""

    def __post_init__(self) -> None:
        rows = self.tensor.shape[0] if self.tensor.dim() else -1
        if rows < 0 or not 0 <= self.row_start <= self.row_start + rows <= self.global_rows:
            raise CheckpointError(
                f"RowShard rows [{self.row_start}, {self.row_start + rows}) do not fit a tensor "
                f"of {self.global_rows} rows; pass a tensor with a first dimension and the "
                "global row offset of this rank's slice")


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class RankLocal:
    """Marks a tensor as private to this rank (restored only onto the same world size)."""

    tensor: torch.Tensor
    """The rank's value."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TensorLeaf:
    """One tensor of a flattened state, with where it belongs."""

    key: str
    """Logical key: ``<state name>/<path in its state dict>``."""
    tensor: torch.Tensor
    """This rank's value (all of it, or its rows for ROW)."""
    placement: Placement
    """Who holds it."""
    global_shape: tuple[int, ...]
    """Shape of the whole tensor."""
    row_start: int = 0
    """Global index of this rank's first row (ROW only)."""
    offsets: tuple[int, ...] = ()
    """CHUNK: global offset of this rank's box in every dimension."""
    placements: tuple[str, ...] = ()
    """CHUNK: the DTensor's placements on its mesh, as text (``Shard(dim=0)``)."""
    writer: bool = True
    """CHUNK: whether this rank writes the box (one replica of each unique box does)."""
    source: Any = None
    """CHUNK: the DTensor itself (handed back to ``load_state_dict`` on restore)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FlatState:
    """A flattened state: tensor leaves by key and the JSON meta tree that references them."""

    leaves: dict[str, TensorLeaf]
    """Tensor leaves by logical key."""
    meta: dict[str, Any]
    """JSON tree; each tensor replaced by ``{"__t__": key, ...}``."""


def _escape(part: str) -> str:
    part = part.replace("%", "%25").replace("/", "%2F")
    return "%2E" if part == "." else "%2E%2E" if part == ".." else part or "%00"


class _Flattener:
    def __init__(self) -> None:
        self.leaves: dict[str, TensorLeaf] = {}

    def add(self, key: str, tensor: torch.Tensor, placement: Placement,
            global_shape: tuple[int, ...], row_start: int = 0) -> None:
        if key in self.leaves:
            raise CheckpointError(f"two state entries map to the logical key {key!r}; rename one "
                                  "(an int key and a str key with the same text collide)")
        self.leaves[key] = TensorLeaf(key=key, tensor=tensor.detach(), placement=placement,
                                      global_shape=global_shape, row_start=row_start)

    def encode(self, value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                return self.encode_subclass(value, path)
            self.add(path, value, Placement.REPLICATED, tuple(value.shape))
            return {"__t__": path}
        if isinstance(value, np.ndarray):
            self.add(path, torch.from_numpy(np.ascontiguousarray(value)), Placement.REPLICATED,
                     tuple(value.shape))
            return {"__t__": path, "np": True}
        if isinstance(value, RowShard):
            shape = (value.global_rows, *value.tensor.shape[1:])
            self.add(path, value.tensor, Placement.ROW, shape, value.row_start)
            return {"__t__": path}
        if isinstance(value, RankLocal):
            self.add(path, value.tensor, Placement.LOCAL, tuple(value.tensor.shape))
            return {"__t__": path}
        return self.encode_plain(value, path)

    def encode_subclass(self, value: torch.Tensor, path: str) -> Any:
        from hpcrun.checkpoint.chunks import local_box

        box = local_box(value, path)  # CheckpointError for a subclass that is not a DTensor
        if path in self.leaves:
            raise CheckpointError(f"two state entries map to the logical key {path!r}; "
                                  "rename one")
        self.leaves[path] = TensorLeaf(
            key=path, tensor=box.local.detach(), placement=Placement.CHUNK,
            global_shape=box.global_shape, offsets=box.offsets, placements=box.placements,
            writer=box.writer, source=value)
        return {"__t__": path}

    def encode_plain(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, np.generic):
            return {"__np__": value.dtype.str, "v": self.encode_plain(value.item(), path)}
        if isinstance(value, tuple | list):
            items = [self.encode(v, f"{path}/{i}") for i, v in enumerate(value)]
            return items if isinstance(value, list) else {"__tuple__": items}
        if isinstance(value, Mapping):
            return self.encode_mapping(value, path)
        if type(value).__name__ == "ShardedTensor":  # torch's older sharding, not a Tensor
            raise CheckpointError(
                f"cannot checkpoint {path!r}: a ShardedTensor is not supported; shard the "
                "model with FSDP2 fully_shard or tensor parallel (DTensor) instead")
        raise CheckpointError(
            f"cannot checkpoint {path!r}: a {type(value).__name__} is neither a tensor nor a JSON "
            "value; convert it in state_dict() (hpcrun never pickles)")

    def encode_mapping(self, value: Mapping[Any, Any], path: str) -> Any:
        if all(isinstance(k, str) for k in value) and not any(k.startswith("__") for k in value):
            return {k: self.encode(v, f"{path}/{_escape(k)}") for k, v in value.items()}
        pairs = []
        for k, v in value.items():
            if not isinstance(k, str | int | bool) and k is not None:
                raise CheckpointError(f"cannot checkpoint {path!r}: dict key {k!r} is a "
                                      f"{type(k).__name__}; use str or int keys")
            pairs.append([k, self.encode(v, f"{path}/{_escape(str(k))}")])
        return {"__dict__": pairs}


def flatten_state(state: Mapping[str, Any]) -> FlatState:
    """Flatten ``{name: Stateful | state dict}`` into tensor leaves and a JSON meta tree.

    Raises:
        CheckpointError: a value is neither a tensor nor JSON, or two keys collide.
    """
    flat = _Flattener()
    meta: dict[str, Any] = {}
    for name, obj in state.items():
        if name.startswith("__") or "/" in name:
            raise CheckpointError(f"state name {name!r} is reserved or contains '/'; "
                                  "use a plain identifier such as 'model'")
        sd = obj.state_dict() if hasattr(obj, "state_dict") else obj
        meta[name] = flat.encode(sd, _escape(name))
    return FlatState(leaves=flat.leaves, meta=meta)


def prepare_restore(state: Mapping[str, Any]) -> bool:
    """Let each object that has ``prepare_restore()`` make its restore targets (a sharded
    optimizer creates its DTensor state), once a checkpoint is known to be restored; whether
    any did."""
    prepared = False
    for obj in state.values():
        if callable(prep := getattr(obj, "prepare_restore", None)):
            prep()
            prepared = True
    return prepared


def decode_tree(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild a value from its meta tree, taking tensors by key from ``tensors``.

    Raises:
        CheckpointError: a referenced tensor is missing (the checkpoint is incomplete).
    """
    if isinstance(node, list):
        return [decode_tree(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "__t__" in node:
        key = node["__t__"]
        if key not in tensors:
            raise CheckpointError(f"checkpoint references tensor {key!r} but holds no such data")
        t = tensors[key]
        return t.numpy() if node.get("np") else t
    if "__float__" in node:
        return float(node["__float__"])
    if "__np__" in node:
        return np.dtype(node["__np__"]).type(node["v"])
    if "__tuple__" in node:
        return tuple(decode_tree(v, tensors) for v in node["__tuple__"])
    if "__dict__" in node:
        return {k: decode_tree(v, tensors) for k, v in node["__dict__"]}
    return {k: decode_tree(v, tensors) for k, v in node.items()}


def load_into(state: Mapping[str, Any], restored: Mapping[str, Any]) -> None:
    """Hand each restored state dict to its object (``load_state_dict`` or in-place update).

    Raises:
        CheckpointError: an object registered now is absent from the checkpoint.
    """
    for name, target in state.items():
        if name not in restored:
            raise CheckpointError(
                f"state {name!r} is registered but the checkpoint has only "
                f"{sorted(k for k in restored if not k.startswith('__'))}; register the same "
                "names that were saved")
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(restored[name])
        elif isinstance(target, MutableMapping):
            target.clear()
            target.update(restored[name])
        else:
            raise CheckpointError(f"cannot restore {name!r}: a {type(target).__name__} has no "
                                  "load_state_dict and is not a mutable mapping")


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().contiguous().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """This process's RNG streams as JSON: python, numpy, torch CPU and every CUDA device."""
    version, internal, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    out: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), *(x for x in np_state[2:])],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(rng: Mapping[str, Any]) -> None:
    """Set this process's RNG streams from :func:`capture_rng` output."""
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(rng["torch"]))
    cuda = rng.get("cuda")
    if cuda and torch.cuda.is_available():
        states = [_unb64(s) for s in cuda][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Where this rank sits in the gang."""

    rank: int
    """Rank in the checkpoint's process group."""
    world_size: int
    """Ranks in the group."""
    node_rank: int
    """Index of this rank's node."""
    local_rank: int
    """Rank within its node."""
    num_nodes: int
    """Nodes in the gang."""
    node: str
    """Hostname of this rank's node (names its shard subdirectory)."""

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size and 0 <= self.node_rank < self.num_nodes
                and self.local_rank >= 0 and self.node):
            raise CheckpointError(
                f"invalid layout: rank {self.rank} of {self.world_size}, node {self.node_rank} of "
                f"{self.num_nodes}, local_rank {self.local_rank}, node name {self.node!r}")
        if "/" in self.node or self.node in (".", ".."):
            raise CheckpointError(f"node name {self.node!r} cannot name a directory; "
                                  "pass the hostname")


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveResult:
    """Outcome of one checkpoint save, once it is finalized."""

    ckpt_id: str
    """Checkpoint ID."""
    step: int
    """Step it captures."""
    committed: bool
    """Whether its commit entry counts in the run log."""
    pause_s: float
    """Exposed pause: seconds the training thread spent staging (the cost C)."""
    write_s: float
    """Seconds the slowest rank spent writing its shard in the background."""
    bytes: int
    """Bytes of all shards together."""
    staging_bytes: int = 0
    """Host memory this rank holds for staging."""
    error: str = ""
    """Why it did not commit (empty when committed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreResult:
    """What a restore loaded."""

    ckpt_id: str
    """Checkpoint restored."""
    step: int
    """Its step."""
    tier: Tier
    """``shared`` when some rank read tier 1, else ``peer`` when this rank read from another
    node (the peer tier), else ``node_local`` (this node's disk only)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The ``extra`` mapping given to the save."""
    skipped: tuple[str, ...] = ()
    """Newer committed checkpoints that failed verification and were passed over."""
    bytes_read: int = 0
    """Data bytes this rank read from shard files (measured by the reads it made)."""
    files_read: int = 0
    """Shard files this rank opened."""
    peer_bytes: int = 0
    """Of ``bytes_read``, the bytes read from other nodes (the peer tier)."""
    phases: Mapping[str, float | int] = field(default_factory=dict)
    """Where this rank's restore time went: ``fault_s``, ``read_s``, ``checksum_s`` (exposed,
    after the last byte), ``hash_s`` (all hashing), ``copy_s``, ``direct_bytes``,
    ``buffered_bytes`` (:class:`~hpcrun.checkpoint.readpipe.RestorePhases`); also in the
    rank's ``restored`` event."""
