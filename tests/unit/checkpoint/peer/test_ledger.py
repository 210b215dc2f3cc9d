"""Partner copies, the pure parts: ring choice, path checks, which copies exist and are whole,
what to push and what to retire."""

from __future__ import annotations

import pytest

from hpcrun.checkpoint.peer.ledger import (
    PartnerCopy,
    check_relpath,
    complete_copy,
    fold_partner_copies,
    pending_push,
    retired_copies,
    ring_partner,
)
from hpcrun.checkpoint.tiers import CommittedCheckpoint
from hpcrun.control.entries import FencePayload, LogEntry, PartnerCopyNote
from hpcrun.errors import CheckpointError
from hpcrun.vocab import Tier


def _ckpt(step: int, *, tiers: set[Tier], nodes: tuple[str, ...] = ("n1", "n2"),
          slot: int = 0) -> CommittedCheckpoint:
    return CommittedCheckpoint(
        ckpt_id=f"g000001-s{step:010d}-abc", step=step, generation=1, manifest="m", digest="d",
        bytes=10, nodes=nodes, slot=slot or step, committed_at=0.0, tiers=frozenset(tiers))


def test_ring_partner_is_the_next_gang_node_and_wraps() -> None:
    gang = ("n1", "n2", "n3")
    assert [ring_partner(gang, n) for n in gang] == ["n2", "n3", "n1"]
    assert ring_partner(("n1",), "n1") is None  # nobody to hold a copy
    assert ring_partner(gang, "spare") is None  # a spare holds and pushes nothing


@pytest.mark.parametrize("rel", [
    "../etc/rank-00001.h5", "g000001-s0000000010-abc/../rank-00001.h5",
    "g000001-s0000000010-abc/n1/../../x.h5", "/abs/n1/rank-00001.h5",
    "g000001-s0000000010-abc/n1/rank-00001.h5/x", "g000001-s0000000010-abc/n1/secret",
    "g000001-s0000000010-abc/.hidden/rank-00001.h5", "..x/n1/rank-00001.h5",
])
def test_paths_that_could_escape_the_copy_directory_are_refused(rel: str) -> None:
    with pytest.raises(CheckpointError, match=r"partner copy path|not a plain name"):
        check_relpath(rel)


def test_a_plain_shard_path_splits_into_checkpoint_owner_and_file() -> None:
    assert check_relpath("g000001-s0000000010-abc/node2/rank-00003.h5") == (
        "g000001-s0000000010-abc", "node2", "rank-00003.h5")


def _entries(*notes: tuple[int, int, PartnerCopyNote]) -> list[LogEntry]:
    fences = {g: LogEntry(slot=g * 100, kind="fence", generation=g, holder=f"h{g}", ts=0.0,
                          writer="t", payload=FencePayload().to_payload()) for g, _, _ in notes}
    out = list(fences.values())
    out += [LogEntry(slot=g * 100 + s, kind="note", generation=g, holder=f"h{g}", ts=0.0,
                     writer="t", payload=n.to_payload()) for g, s, n in notes]
    return sorted(out, key=lambda e: e.slot)


def _note(ckpt: str, owner: str, held: str, complete: bool) -> PartnerCopyNote:
    return PartnerCopyNote(ckpt_id=ckpt, owner=owner, held_by=held, bytes=10, complete=complete)


def test_the_newest_note_on_a_copy_decides_and_only_complete_ones_are_used() -> None:
    copies = fold_partner_copies(_entries(
        (1, 1, _note("c1", "n2", "n1", True)),
        (1, 2, _note("c2", "n2", "n1", False)),
        (1, 3, _note("c3", "n2", "n1", True)),
        (1, 4, _note("c3", "n2", "n1", False)),  # a later failed retry: no longer trusted
    ))
    assert complete_copy(copies, "c1", "n2", holders=["n1"]) is not None
    assert complete_copy(copies, "c2", "n2", holders=["n1"]) is None
    assert complete_copy(copies, "c3", "n2", holders=["n1"]) is None
    assert complete_copy(copies, "c1", "n2", holders=["n3"]) is None  # the holder is gone


def test_notes_of_a_fenced_out_generation_do_not_count() -> None:
    entries = _entries((1, 1, _note("c1", "n2", "n1", True)), (2, 1, _note("c0", "n1", "n2",
                                                                           True)))
    # a note of generation 1 written after generation 2's fence is void
    late = LogEntry(slot=205, kind="note", generation=1, holder="h1", ts=0.0, writer="t",
                    payload=_note("c9", "n2", "n1", True).to_payload())
    copies = fold_partner_copies([*entries, late])
    assert ("c1", "n2", "n1") in copies and ("c9", "n2", "n1") not in copies


def test_push_the_newest_tier0_checkpoint_unless_the_partner_holds_it() -> None:
    old, new = _ckpt(10, tiers={Tier.NODE_LOCAL}), _ckpt(20, tiers={Tier.NODE_LOCAL})
    held = {(new.ckpt_id, "n1", "n2"): PartnerCopy(ckpt_id=new.ckpt_id, owner="n1",
                                                   held_by="n2", bytes=1, complete=True, slot=1)}
    assert pending_push([old, new], {}, node="n1", partner="n2") == new
    assert pending_push([old, new], held, node="n1", partner="n2") is None  # never the older
    assert pending_push([old, new], held, node="n1", partner="n3") == new   # a new partner
    assert pending_push([old, new], {}, node="n9", partner="n2") is None    # no shards there
    shared_only = _ckpt(30, tiers={Tier.SHARED})
    assert pending_push([old, shared_only], {}, node="n1", partner="n2") == old


def test_a_holder_keeps_the_newest_copies_per_partner() -> None:
    held = ["g000002-s0000000010-x", "g000001-s0000000090-x", "g000002-s0000000020-x"]
    assert retired_copies(held, keep=2) == ["g000001-s0000000090-x"]
    assert retired_copies(held[:2], keep=2) == []
