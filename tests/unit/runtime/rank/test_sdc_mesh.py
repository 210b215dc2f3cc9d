"""The SDC check on sharded models: fingerprints by slices, shard signatures, the note."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import torch

from hpcrun.control.notes import ReplicaCheckOffNote, decode_note
from hpcrun.runtime.rank.sdc_guard import fingerprint, shard_signature
from hpcrun.testing.net import free_port

ROOT = Path(__file__).resolve().parents[4]


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


def test_hsdp_replicas_are_compared_along_the_replicate_dim_and_a_flip_names_its_rank(
        tmp_path: Path) -> None:
    """A real 4-rank gloo gang, HSDP on a (2, 2) mesh: ranks 0 and 2 hold one shard, 1 and 3
    the other; a bit flipped on rank 3 is found by comparing it with rank 1 only, and rank 0
    logs one FAULT sdc naming rank 3 on its node."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.unit.runtime.rank.sdc_hsdp_worker",
                               str(r), str(port), str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(logs)[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert all(sorted(r["groups"]) == [[0, 2], [1, 3]] for r in ranks), ranks
    assert all(r["ended"][0] == "SdcEchoError" for r in ranks), ranks
    assert ranks[0]["faults"] == [{"fault": "sdc", "rank": 3, "node": "n1", "step": 4}], ranks[0]
