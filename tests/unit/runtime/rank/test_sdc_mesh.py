"""The SDC check on sharded models: fingerprints by slices, shard signatures, the note."""

from __future__ import annotations

import hashlib
import struct

import torch

from hpcrun.control.notes import ReplicaCheckOffNote, decode_note
from hpcrun.runtime.rank.sdc_guard import fingerprint, shard_signature


def _one_shot(tensors: list[torch.Tensor]) -> str:
    """The fingerprint computed the direct way (every word widened at once)."""
    values = []
    for t in tensors:
        wide = t.contiguous().view(-1).view(torch.int32).to(torch.int64)
        values += [int(wide.sum()), int((wide * wide).sum())]
    return hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=16).hexdigest()


def test_sliced_fingerprint_equals_the_one_shot_sum_and_sees_one_bit() -> None:
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(300_000, generator=g), torch.randn(7, 5, generator=g)]
    assert fingerprint(tensors) == _one_shot(tensors)
    flipped = tensors[0].clone()
    flipped.view(torch.int32)[12345] ^= 1
    assert fingerprint([flipped, tensors[1]]) != fingerprint(tensors)


def test_plain_replicas_share_a_signature_and_other_shapes_do_not() -> None:
    a = [torch.zeros(4, 3), torch.zeros(2)]
    assert shard_signature(a) == shard_signature([torch.ones(4, 3), torch.ones(2)])
    assert shard_signature(a) != shard_signature([torch.zeros(3, 3), torch.zeros(2)])


def test_replica_check_off_note_round_trips() -> None:
    note = ReplicaCheckOffNote(detail="no replicas to compare: replica check off")
    back = decode_note(note.to_payload())
    assert isinstance(back, ReplicaCheckOffNote) and back.detail == note.detail
