"""The culprit of a collective hang: the rank(s) that did not arrive, and their node.

When one rank stops, every other rank of the gang blocks in the next collective, so "no
progress" names them all. Collective sequence numbers tell them apart: a rank counts every
collective it issues on a group, so the ranks that entered the collective are one (or more)
ahead of the ranks that never did. Two sources give those numbers:

- **gloo and NCCL, live:** each rank's heartbeat carries its group's sequence number
  (:class:`~hpcrun.observe.heartbeat.RankBeat`'s ``seq``), refreshed by a background ticker while
  the main thread is blocked (:class:`~hpcrun.observe.heartbeat.SeqTicker`);
- **NCCL, after a watchdog timeout:** the flight recorder's per-rank dump
  (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), a pickle of plain containers, read here with an
  unpickler that builds nothing but containers and numbers (:func:`parse_flight_dump`); a dump
  that asks for any class or callable is refused, never executed. The JSON form is read too.

The core (:func:`lagging_ranks`, :func:`name_culprit`) is pure: the lowest sequence number while
some rank is ahead is "did not arrive"; all equal (or one rank) names nobody.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpcrun.observe.heartbeat import NodeHeartbeat

MAX_DUMP_BYTES = 64 << 20
"""A flight recorder dump larger than this is not read (the default buffer is far smaller)."""
WORLD_PG = "0"
"""The flight recorder's id of the default (world) process group."""
SETTLE_S = 3.0
"""A beat's sequence number is evidence once its node saw it this long after the rank's last
progress: the ticker (every second, after a second of quiet) has written it by then."""


class Evidence(StrEnum):
    """Where the sequence numbers that named the culprit came from."""

    SEQUENCE = "collective_seq"      # the ranks' heartbeats (gloo or NCCL)
    FLIGHT_RECORDER = "flight_recorder"  # NCCL's flight recorder dumps


@dataclass(frozen=True, kw_only=True, slots=True)
class Culprit:
    """The ranks that did not arrive at a collective the others entered."""

    ranks: tuple[int, ...]
    """Global ranks that did not arrive, ascending."""
    nodes: tuple[str, ...]
    """Their nodes (those known), in rank order without repeats."""
    seq: int
    """The sequence number they stopped at."""
    ahead: int
    """The highest sequence number another rank reached."""
    evidence: Evidence
    """Where the numbers came from."""

    def describe(self) -> str:
        """One line for people."""
        where = f" on {', '.join(self.nodes)}" if self.nodes else ""
        ranks = ", ".join(str(r) for r in self.ranks)
        return (f"rank {ranks}{where} did not arrive: collective #{self.seq} issued, others "
                f"reached #{self.ahead} ({self.evidence})")


def lagging_ranks(seqs: Mapping[int, int]) -> tuple[int, ...]:
    """Ranks at the lowest sequence number while another rank is ahead; () when all are equal
    or fewer than two ranks reported (pure)."""
    if len(seqs) < 2:
        return ()
    low = min(seqs.values())
    if low == max(seqs.values()):
        return ()
    return tuple(sorted(r for r, s in seqs.items() if s == low))


def name_culprit(seqs: Mapping[int, int], rank_nodes: Mapping[int, str], *,
                 evidence: Evidence) -> Culprit | None:
    """The culprit among ``seqs`` (rank → sequence number), with the nodes of
    ``rank_nodes``; None when the numbers name nobody (pure)."""
    ranks = lagging_ranks(seqs)
    if not ranks:
        return None
    nodes = tuple(dict.fromkeys(rank_nodes[r] for r in ranks if r in rank_nodes))
    return Culprit(ranks=ranks, nodes=nodes, seq=seqs[ranks[0]], ahead=max(seqs.values()),
                   evidence=evidence)


@dataclass(frozen=True, kw_only=True, slots=True)
class SeqEvidence:
    """The sequence numbers the gang's heartbeats hold, as far as they can be trusted."""

    seqs: Mapping[int, int]
    """Settled sequence number of each rank that has one."""
    rank_nodes: Mapping[int, str]
    """Node of every rank seen."""
    complete: bool
    """Every node of the gang published, and every rank seen is settled."""


def settled_evidence(heartbeats: Mapping[str, NodeHeartbeat], gang: tuple[str, ...], *,
                     settle_s: float = SETTLE_S) -> SeqEvidence:
    """The settled sequence numbers of ``heartbeats`` (pure): a rank's number counts once its
    node's beat was taken ``settle_s`` after the rank's last progress (an earlier one may not
    show the collective it entered since)."""
    seqs: dict[int, int] = {}
    rank_nodes: dict[int, str] = {}
    complete = set(gang) <= set(heartbeats)
    for node, hb in heartbeats.items():
        for rank, beat in hb.ranks.items():
            rank_nodes[rank] = node
            if beat.seq is not None and hb.ts - beat.ts >= settle_s:
                seqs[rank] = beat.seq
            else:
                complete = False
    return SeqEvidence(seqs=seqs, rank_nodes=rank_nodes, complete=complete)


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes and numbers only: any class, function or
    persistent id in the stream is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the dump names {module}.{name}; a flight "
                                     "recorder dump holds plain containers only")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: the dump holds a persistent id")


def load_plain_pickle(raw: bytes) -> Any:
    """``raw`` unpickled into plain containers; ``pickle.UnpicklingError`` when it names any
    class or callable (nothing is executed)."""
    return _PlainUnpickler(io.BytesIO(raw)).load()


def _decode(raw: bytes) -> Any:
    if raw[:1] in (b"{", b"["):
        return json.loads(raw)
    return load_plain_pickle(raw)


def _pg_seqs(dump: Mapping[str, Any]) -> dict[str, int]:
    """Per process group id, the last collective this rank enqueued."""
    out: dict[str, int] = {}
    status = dump.get("pg_status")
    if isinstance(status, Mapping):
        for pg, st in status.items():
            seq = st.get("last_enqueued_collective") if isinstance(st, Mapping) else None
            if isinstance(seq, int) and not isinstance(seq, bool):
                out[str(pg)] = seq
    entries = dump.get("entries")
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, Mapping) or e.get("is_p2p"):
            continue
        pg, seq = e.get("process_group"), e.get("collective_seq_id")
        pg_id = str(pg[0]) if isinstance(pg, list | tuple) and pg else str(e.get("pg_id"))
        if isinstance(seq, int) and not isinstance(seq, bool):
            out[pg_id] = max(out.get(pg_id, seq), seq)
    return out


def parse_flight_dump(raw: bytes) -> dict[str, int] | None:
    """Per process group id, the last collective sequence number of one rank's flight
    recorder dump (pickle or JSON); None when the dump is malformed, too large or refused."""
    if len(raw) > MAX_DUMP_BYTES:
        return None
    try:
        dump = _decode(raw)
    except Exception:
        return None
    if not isinstance(dump, Mapping):
        return None
    return _pg_seqs(dump) or None


def read_flight_dumps(directory: Path, prefix: str) -> dict[int, dict[str, int]]:
    """Every rank's parsed dump in ``directory`` (files ``<prefix><rank>``), by rank."""
    out: dict[int, dict[str, int]] = {}
    try:
        names = sorted(p.name for p in Path(directory).iterdir())
    except OSError:
        return out
    for name in names:
        tail = name[len(prefix):]
        if not name.startswith(prefix) or not tail.isdigit():
            continue
        try:
            parsed = parse_flight_dump((Path(directory) / name).read_bytes())
        except OSError:
            continue
        if parsed is not None:
            out[int(tail)] = parsed
    return out


def flight_culprit(dumps: Mapping[int, Mapping[str, int]], rank_nodes: Mapping[int, str],
                   ) -> Culprit | None:
    """The culprit the flight recorder dumps name (pure): the world group first, then any
    group whose ranks disagree."""
    groups = sorted({pg for d in dumps.values() for pg in d}, key=lambda g: (g != WORLD_PG, g))
    for pg in groups:
        seqs = {r: d[pg] for r, d in dumps.items() if pg in d}
        found = name_culprit(seqs, rank_nodes, evidence=Evidence.FLIGHT_RECORDER)
        if found is not None:
            return found
    return None
