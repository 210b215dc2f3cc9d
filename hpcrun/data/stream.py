"""Iterable mode for sources without random access: shard order + a bounded shuffle buffer.

**This is not a uniform permutation.** A record can only leave the buffer after it entered it,
so records stay near their position in the shard stream (displacement is bounded by the shard
size and the buffer size) and the first output can only be one of the first ``buffer_size``
records. It gives the ``distributional`` resume contract at best; use
:class:`~hpcrun.data.pipeline.DataPipeline` (random access, a true keyed permutation) whenever
the source allows it.

Resume is still exact: the cursor holds the next shard position, the records already taken from
the current shard, the IDs ``(shard, record)`` of the buffered records and the emission count;
the choice of which buffered record leaves at emission ``i`` is a hash of ``(seed, epoch, i)``.
Restoring re-streams the shards that buffered records came from (skipping forward) to refill it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from hpcrun.data.permutation import Permutation
from hpcrun.errors import ArgumentError, DataError

__all__ = ["ShuffleBufferStream"]

T = TypeVar("T")


class ShuffleBufferStream(Generic[T], Iterator[T]):
    """Records of ``num_shards`` sequential shards, in permuted shard order, buffer-shuffled.

    Args:
        open_shard: ``open_shard(i)`` iterates the records of shard ``i`` from the start.
        num_shards: Number of shards.
        buffer_size: Records held at once (the memory bound and the shuffle's reach).
        seed: Seed of the shard order and the buffer draws.
        epoch: Epoch (each epoch has its own shard order and draws).
    """

    def __init__(self, open_shard: Callable[[int], Iterator[T]], num_shards: int, *,
                 buffer_size: int, seed: int, epoch: int = 0) -> None:
        if num_shards < 1 or buffer_size < 1:
            raise ArgumentError(f"need num_shards >= 1 and buffer_size >= 1, found "
                                f"num_shards {num_shards}, buffer_size {buffer_size}")
        self._open, self.buffer_size, self.seed, self.epoch = (open_shard, buffer_size, seed,
                                                                epoch)
        self._order = Permutation(num_shards, seed=seed, epoch=epoch, salt="shuffle-buffer")
        self._pos, self._record, self._emitted = 0, 0, 0
        self._buffer: list[tuple[int, int, T]] = []
        self._incoming: Iterator[tuple[int, int, T]] | None = None

    def __next__(self) -> T:
        incoming = self._incoming or self._stream()
        self._incoming = incoming
        while len(self._buffer) < self.buffer_size:
            item = next(incoming, None)
            if item is None:
                break
            self._buffer.append(item)
        if not self._buffer:
            raise StopIteration
        j = self._pick(len(self._buffer))
        self._buffer[j], self._buffer[-1] = self._buffer[-1], self._buffer[j]
        self._emitted += 1
        return self._buffer.pop()[2]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position (buffer IDs, not values)."""
        return {"kind": "hpcrun.data.stream", "seed": self.seed, "epoch": self.epoch,
                "position": self._pos, "record": self._record, "emitted": self._emitted,
                "buffer": [[s, r] for s, r, _ in self._buffer]}

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        """Resume; buffered records are re-read by streaming their shards.

        Raises:
            DataError: another seed/epoch, or a buffered record its shard no longer has.
        """
        if (state.get("seed"), state.get("epoch")) != (self.seed, self.epoch):
            raise DataError(f"stream cursor is for seed/epoch {state.get('seed')}/"
                            f"{state.get('epoch')}, this stream is {self.seed}/{self.epoch}")
        ids = [(int(s), int(r)) for s, r in state["buffer"]]
        self._pos, self._record = int(state["position"]), int(state["record"])
        self._emitted = int(state["emitted"])
        self._buffer = self._refill(ids)
        self._incoming = None

    def _pick(self, size: int) -> int:
        material = f"{self.seed}/{self.epoch}/{self._emitted}".encode()
        digest = hashlib.blake2b(material, digest_size=8, person=b"shufbuf").digest()
        return int.from_bytes(digest, "little") % size

    def _stream(self) -> Iterator[tuple[int, int, T]]:
        while self._pos < len(self._order):
            shard = self._order[self._pos]
            for r, value in enumerate(self._open(shard)):
                if r >= self._record:
                    self._record = r + 1
                    yield shard, r, value
            self._pos, self._record = self._pos + 1, 0

    def _refill(self, ids: list[tuple[int, int]]) -> list[tuple[int, int, T]]:
        wanted: dict[int, set[int]] = {}
        for s, r in ids:
            wanted.setdefault(s, set()).add(r)
        found: dict[tuple[int, int], T] = {}
        for s, records in wanted.items():
            for r, value in enumerate(self._open(s)):
                if r in records:
                    found[(s, r)] = value
        missing = [i for i in ids if i not in found]
        if missing:
            raise DataError(f"stream cursor buffers records {missing[:5]} that their shards no "
                            "longer have; the data changed since the checkpoint")
        return [(s, r, found[(s, r)]) for s, r in ids]
