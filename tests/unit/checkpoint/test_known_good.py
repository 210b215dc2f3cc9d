"""Known-good checkpoints: retention never deletes the newest one (whatever K, under async saves
and drains), and after an ``sdc`` fault a restore may only use checkpoints that were known-good
by then or committed later."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.retention import (
    distrusted,
    known_good,
    newest_known_good,
    restorable,
    select_local_victims,
    select_shared_victims,
)
from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.control.entries import (
    CommitPayload,
    EntryPayload,
    FaultPayload,
    FencePayload,
    KnownGoodNote,
    LogEntry,
)
from hpcrun.vocab import FaultClass, Tier


class _Run:
    """A run's log as the runtime writes it: fences, commits on tier 0 then tier 1, known-good
    notes after passed replica checks, sdc faults."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.gen = 0
        self.saves = 0
        self.in_flight: str | None = None
        self.fence()

    def add(self, payload: EntryPayload) -> None:
        self.entries.append(LogEntry(slot=len(self.entries), kind=payload.entry_kind,
                                     generation=self.gen, holder=f"h{self.gen}",
                                     ts=float(len(self.entries)), writer="t",
                                     payload=payload.to_payload()))

    def fence(self) -> None:
        self.gen += 1
        self.in_flight = None  # the new incarnation abandons the old one's save
        self.add(FencePayload())

    def commit(self, ckpt_id: str, tier: Tier) -> None:
        step = int(ckpt_id.rsplit("s", 1)[1])
        self.add(CommitPayload(ckpt_id=ckpt_id, tier=tier, step=step, manifest="m"))

    def apply(self, op: str) -> None:
        committed = fold_checkpoints(self.entries)
        if op == "save" and self.in_flight is None:
            self.saves += 1
            self.in_flight = f"g{self.gen}s{self.saves}"
        elif op == "commit" and self.in_flight is not None:
            self.commit(self.in_flight, Tier.NODE_LOCAL)
            self.in_flight = None
        elif op == "drain":
            local = [c for c in committed if Tier.SHARED not in c.tiers]
            if local:
                self.commit(local[0].ckpt_id, Tier.SHARED)
        elif op == "check" and committed and committed[-1].ckpt_id not in known_good(
                self.entries):
            c = committed[-1]
            self.add(KnownGoodNote(ckpt_id=c.ckpt_id, step=c.step, checked_step=c.step))
        elif op == "sdc":
            self.add(FaultPayload(fault=FaultClass.SDC, node="n1", signature="sdc:n1"))
            self.fence()


OPS = st.lists(st.sampled_from(["save", "commit", "drain", "check", "sdc", "save", "commit"]),
               max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, keep=st.integers(2, 4))
def test_retention_never_deletes_the_newest_known_good(ops: list[str], keep: int) -> None:
    run = _Run()
    shared: set[str] = set()
    local: set[str] = set()
    for op in ops:
        run.apply(op)
        committed = fold_checkpoints(run.entries)
        shared |= {c.ckpt_id for c in committed if Tier.SHARED in c.tiers}
        local |= {c.ckpt_id for c in committed if Tier.NODE_LOCAL in c.tiers}
        good = known_good(run.entries)
        flight = [run.in_flight] if run.in_flight else []
        gone_shared = select_shared_victims(committed, keep_last=keep, in_flight=flight,
                                            known_good=good)
        gone_local = select_local_victims(committed, local, keep_last=keep, in_flight=flight,
                                          known_good=good)
        newest = newest_known_good(committed, good)
        assert newest not in gone_shared and newest not in gone_local
        assert not set(flight) & (set(gone_shared) | set(gone_local))
        if committed:
            assert committed[-1].ckpt_id not in gone_shared
        shared -= set(gone_shared)
        local -= set(gone_local)
        if newest is not None:  # it stays on every tier it reached
            assert newest in local | shared


def test_the_newest_known_good_outlives_k_newer_commits() -> None:
    run = _Run()
    for op in ["save", "commit", "check", "drain"] + ["save", "commit", "drain"] * 4:
        run.apply(op)
    committed = fold_checkpoints(run.entries)
    victims = select_shared_victims(committed, keep_last=2, known_good=known_good(run.entries))
    assert [c.ckpt_id for c in committed if c.ckpt_id not in victims] == [
        "g1s1", "g1s4", "g1s5"]


def _ids(cs: list[Any]) -> list[str]:
    return [c.ckpt_id for c in cs]


def test_after_an_sdc_fault_only_known_good_or_later_checkpoints_restore() -> None:
    run = _Run()
    for op in ["save", "commit", "check", "save", "commit", "save", "commit"]:
        run.apply(op)
    assert _ids(restorable(run.entries)) == ["g1s1", "g1s2", "g1s3"]  # no fault: all
    run.apply("sdc")
    assert distrusted(run.entries) == {"g1s2", "g1s3"}
    assert _ids(restorable(run.entries)) == ["g1s1"]  # the rollback point
    for op in ["save", "commit"]:
        run.apply(op)
    assert _ids(restorable(run.entries)) == ["g1s1", "g2s4"]


def test_an_sdc_fault_before_any_known_good_checkpoint_means_a_fresh_start() -> None:
    run = _Run()
    for op in ["save", "commit", "sdc"]:
        run.apply(op)
    assert restorable(run.entries) == []


def test_a_background_incident_is_not_an_sdc_fault() -> None:
    run = _Run()
    for op in ["save", "commit"]:
        run.apply(op)
    run.add(FaultPayload(fault=FaultClass.SDC, node="n1", background=True))
    assert _ids(restorable(run.entries)) == ["g1s1"]
