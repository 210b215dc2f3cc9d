"""The commit path: node leaders verify their node, the coordinator (rank 0) the nodes.

At 16,384 ranks with 800 dim-0 sharded tensors a checkpoint has 13 M datasets; one process cannot
gather, check and encode all of them within a second. So the work splits by node:

1. each node's leader (its lowest rank) takes its ranks' shard records, checks them (every rank
   on this node, each with its meta dataset, rows of each tensor merged without overlap),
   writes the node's sub-manifest ``manifests/<node>.json`` and hands the coordinator a compact
   :class:`NodeSummary`: the sub-manifest's digest, the node's ranks and bytes, and per tensor
   the merged row intervals the node covers (one interval per tensor when a node's ranks hold
   adjacent rows);
2. the coordinator (:func:`commit_nodes`) checks that every rank is covered once, by its own
   node, and that the nodes' intervals tile every tensor (vectorised, O(intervals log
   intervals)), writes the top manifest listing the sub-manifests with their digests, and
   publishes the COMMIT entry.

The :class:`~hpcrun.checkpoint.Checkpointer` commits only through here, whatever the gang size
(one node is the same path). The sub-manifests have the format
:func:`hpcrun.checkpoint.manifest.encode_manifest` writes, so
:func:`hpcrun.checkpoint.commit.read_manifest` (audit, drain) reads them unchanged. On restore a
node needs only the top manifest (read once and broadcast) and its own sub-manifest
(:func:`read_top_manifest`, :func:`read_node_shards`); the top manifest's ``tensors`` (rows of
every tensor) tells a node whether that is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcrun.checkpoint.commit import (
    CheckpointInfo,
    CommitOutcome,
    Outcome,
    abandon_on_timeout,
    commit_entry,
    read_committed_json,
    record_fault,
)
from hpcrun.checkpoint.keys import META_KEY, Placement
from hpcrun.checkpoint.manifest import (
    MANIFEST_SCHEMA_VERSION,
    ShardRecord,
    decode_manifest,
    digest_bytes,
    node_manifest_refs,
    parse_json,
    shard_dict,
    submanifest_path,
)
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier, manifest_relpath
from hpcrun.control.entries import CursorPayload, ProgressPayload
from hpcrun.control.log import RunLog
from hpcrun.control.payload import canonical_json
from hpcrun.errors import (
    CorruptCheckpointError,
    FormatError,
    StaleGenerationError,
    StorageTimeoutError,
)
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import FaultClass

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class NodeSummary:
    """What a node agent tells the coordinator about its node's shards (compact, no datasets)."""

    node: str
    """Node name (its shard subdirectory)."""
    path: str
    """Sub-manifest path relative to the checkpoint directory."""
    digest: str
    """Digest of the sub-manifest bytes."""
    ranks: tuple[int, ...]
    """Ranks whose shards the node holds, ascending."""
    bytes: int
    """Bytes of the node's shard files."""
    datasets: int
    """Datasets in the node's shards."""
    keys: tuple[str, ...]
    """Key table: logical keys of replicated and row-sharded tensors, sorted; empty when
    elided because it equals the table another node sent (see ``keys_digest``)."""
    keys_digest: str = ""
    """:func:`key_table_digest` of the key table and its row counts (sent or elided)."""
    totals: np.ndarray = field(default_factory=lambda: _EMPTY)
    """Global rows of each key of ``keys`` (elided with the keys)."""
    key_index: np.ndarray = field(default_factory=lambda: _EMPTY)
    """Key (index into the table) of each merged row interval; empty when there is exactly
    one interval per key, in table order (the usual case)."""
    starts: np.ndarray = field(default_factory=lambda: _EMPTY)
    """First row of each interval."""
    stops: np.ndarray = field(default_factory=lambda: _EMPTY)
    """One past the last row of each interval."""
    problems: tuple[str, ...] = ()
    """What the node agent found wrong (empty when its shards are complete)."""
    nonfinite: bool = False
    """Whether a rank of the node refused its shard for NaN/Inf."""
    timed_out: bool = False
    """Whether every problem of the node is a shared-tier operation past its deadline (the
    coordinator abandons the checkpoint instead of calling it a fault of the gang)."""

    def __post_init__(self) -> None:
        n = len(self.starts)
        if len(self.totals) != len(self.keys) or len(self.stops) != n or \
                len(self.key_index) not in (0, n):
            raise FormatError(f"node summary of {self.node!r} has mismatched arrays: "
                              f"{len(self.keys)} keys, {len(self.totals)} totals, "
                              f"{len(self.key_index)} key indices, {n} intervals; expected "
                              "one total per key, one stop per start and no key indices or "
                              "one per interval; rewrite the node's sub-manifest")

    def interval_keys(self, table_size: int) -> np.ndarray:
        """Key index of each interval (``key_index``, or one per key in table order)."""
        if self.key_index.size or not self.starts.size:
            return self.key_index
        if self.starts.size != table_size:
            raise FormatError(f"node {self.node} sent {self.starts.size} intervals without "
                              f"key indices for a table of {table_size} keys; expected one "
                              "interval per key, or key indices; rewrite the node's "
                              "sub-manifest")
        return np.arange(table_size, dtype=np.int64)


def encode_node_manifest(ckpt_id: str, node: str, shards: Sequence[ShardRecord]) -> bytes:
    """Canonical bytes of a node's sub-manifest (the format ``encode_manifest`` writes)."""
    return canonical_json({"schema_version": MANIFEST_SCHEMA_VERSION, "ckpt_id": ckpt_id,
                           "node": node, "shards": [shard_dict(s) for s in shards]})


def _node_problems(node: str, shards: Sequence[ShardRecord]) -> list[str]:
    out = []
    for s in shards:
        if s.node != node:
            out.append(f"rank {s.rank} shard is on node {s.node}, summarised by node {node}")
        if not any(d.key == META_KEY for d in s.datasets):
            out.append(f"rank {s.rank} shard lacks its {META_KEY} dataset")
    return out


def merge_rows(shards: Sequence[ShardRecord],
               ) -> tuple[dict[str, int], dict[str, list[tuple[int, int]]], list[str]]:
    """Per key: global rows and merged row intervals of replicated and row pieces (pure).

    Returns:
        ``(totals, intervals, problems)``; a problem names a key whose pieces overlap or whose
        global shape differs between pieces.
    """
    spans: dict[str, list[tuple[int, int]]] = {}
    totals: dict[str, int] = {}
    problems: list[str] = []
    for s in shards:
        for d in s.datasets:
            if d.placement not in (Placement.REPLICATED, Placement.ROW):
                continue
            total = d.global_shape[0] if d.global_shape else 1
            if totals.setdefault(d.key, total) != total:
                problems.append(f"tensor {d.key!r} has {total} rows in rank {s.rank}'s shard "
                                f"but {totals[d.key]} elsewhere")
            spans.setdefault(d.key, []).append((d.row_start, d.row_stop))
    merged = {}
    for key, parts in spans.items():
        merged[key], bad = _merge(parts)
        if bad:
            problems.append(f"tensor {key!r} rows overlap within the node")
    return totals, merged, problems


def _merge(parts: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], bool]:
    out: list[tuple[int, int]] = []
    overlap = False
    for a, b in sorted(parts):
        if a == b:
            continue
        if out and a < out[-1][1]:
            overlap = True
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out, overlap


def key_table_digest(keys: Sequence[str], totals: np.ndarray) -> str:
    """Digest of a key table and its row counts (a gang's nodes share one; one node sends it)."""
    return digest_bytes(canonical_json([list(keys), np.asarray(totals).tolist()]))


def summarize_node(ckpt_id: str, node: str, shards: Sequence[ShardRecord], *,
                   refused: str = "", nonfinite: bool = False, timed_out: bool = False,
                   known_keys: str = "") -> tuple[bytes, NodeSummary]:
    """Node agent: check the node's shards and encode its sub-manifest and summary (pure).

    Args:
        refused: why the node's ranks did not all write (from ``commit.refusal``), if so.
        nonfinite: whether that refusal is for non-finite values.
        timed_out: whether that refusal is only shared-tier operations past their deadline.
        known_keys: digest of the key table the coordinator already has (rank 0's, sent with
            the save); a node whose table has this digest leaves it out of its summary, which
            keeps what the coordinator receives small at thousands of nodes.

    Returns:
        The sub-manifest bytes (to write with :func:`write_node_manifest`) and the summary.
    """
    ordered = sorted(shards, key=lambda s: s.rank)
    data = encode_node_manifest(ckpt_id, node, ordered)
    totals, merged, problems = merge_rows(ordered)
    keys = tuple(sorted(totals))
    rows = np.array([totals[k] for k in keys], dtype=np.int64)
    digest = key_table_digest(keys, rows)
    index = [i for i, k in enumerate(keys) for _ in merged[k]]
    flat = [span for k in keys for span in merged[k]]
    elide = digest == known_keys
    implicit = len(index) == len(keys) and all(len(merged[k]) == 1 for k in keys)
    return data, NodeSummary(
        node=node, path=submanifest_path(node), digest=digest_bytes(data),
        ranks=tuple(s.rank for s in ordered), bytes=sum(s.bytes for s in ordered),
        datasets=sum(len(s.datasets) for s in ordered),
        keys=() if elide else keys, keys_digest=digest, totals=_EMPTY if elide else rows,
        key_index=_EMPTY if implicit else np.array(index, dtype=np.int64),
        starts=np.array([a for a, _ in flat], dtype=np.int64),
        stops=np.array([b for _, b in flat], dtype=np.int64),
        problems=tuple(([refused] if refused else []) + _node_problems(node, ordered) + problems),
        nonfinite=nonfinite, timed_out=timed_out)


def write_node_manifest(run_dir: Path, ckpt_id: str, node: str, data: bytes, *,
                        storage: Storage = LOCAL_STORAGE) -> None:
    """Node agent: durably write its sub-manifest into the shared checkpoint directory."""
    path = Path(run_dir) / manifest_relpath(ckpt_id)
    storage.makedirs(path.parent / "manifests")
    storage.write_atomic(path.parent / submanifest_path(node), data)


def _rank_problems(nodes: Sequence[str], summaries: Sequence[NodeSummary]) -> list[str]:
    seen = np.zeros(len(nodes), dtype=np.int64)
    out = []
    for s in summaries:
        ranks = np.asarray(s.ranks, dtype=np.int64)
        if ranks.size and (ranks.min() < 0 or ranks.max() >= len(nodes)):
            out.append(f"node {s.node} reports ranks outside 0..{len(nodes) - 1}")
            continue
        np.add.at(seen, ranks, 1)
        wrong = [int(r) for r in ranks if nodes[r] != s.node]
        if wrong:
            out.append(f"node {s.node} reports ranks {wrong[:4]} that the layout puts elsewhere")
    if (missing := np.flatnonzero(seen == 0)).size:
        out.append(f"no shard from ranks {missing[:8].tolist()} ({missing.size} missing)")
    if (twice := np.flatnonzero(seen > 1)).size:
        out.append(f"ranks {twice[:8].tolist()} reported by more than one node")
    return out


Table = tuple[tuple[str, ...], np.ndarray]


def _key_tables(summaries: Sequence[NodeSummary]) -> tuple[dict[str, Table], list[str]]:
    """Each key table sent, by digest; problems for tables that do not match their digest."""
    tables: dict[str, Table] = {key_table_digest((), _EMPTY): ((), _EMPTY)}
    problems = []
    for s in summaries:
        if s.keys and s.keys_digest not in tables:
            if key_table_digest(s.keys, s.totals) != s.keys_digest:
                problems.append(f"node {s.node} sent a key table that fails its digest")
            tables[s.keys_digest] = (s.keys, s.totals)
    return tables, problems


def _tiles(starts: np.ndarray, stops: np.ndarray, totals: np.ndarray) -> np.ndarray | None:
    """Fast path: one interval per key per node, nodes in row order. Bad-key mask, or None.

    ``starts``/``stops`` are (nodes, keys); None when the intervals are not in row order (the
    general path sorts them).
    """
    if starts.shape[0] > 1 and bool((starts[1:] < starts[:-1]).any()):
        return None
    bad = (starts[0] != 0) | (stops[-1] != totals)
    return bad | (starts[1:] != stops[:-1]).any(axis=0)


def _sorted_tiles(key: np.ndarray, start: np.ndarray, stop: np.ndarray,
                  totals: np.ndarray) -> np.ndarray:
    """General path: sort every interval by (key, start), check each key is tiled once."""
    order = np.lexsort((start, key))
    key, start, stop = key[order], start[order], stop[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    last = np.ones(key.size, dtype=bool)
    last[:-1] = first[1:]
    prev_stop = np.concatenate([[0], stop[:-1]]).astype(np.int64)
    wrong = np.where(first, start != 0, start != prev_stop) | (last & (stop != totals[key]))
    bad = np.zeros(totals.size, dtype=bool)
    bad[key[wrong]] = True
    present = np.zeros(totals.size, dtype=bool)
    present[key] = True
    return bad | ((totals > 0) & ~present)


def _one_table(summaries: Sequence[NodeSummary], table: Table) -> np.ndarray | None:
    """Bad-key mask when every node has ``table`` with one interval per key, else None."""
    if any(s.key_index.size or s.starts.size != len(table[0]) for s in summaries):
        return None
    return _tiles(np.stack([s.starts for s in summaries]),
                  np.stack([s.stops for s in summaries]), table[1])


def _union(summaries: Sequence[NodeSummary], tables: Mapping[str, Table],
           ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every interval over the union of the key tables: ``keys, totals, key, start, stop``.

    ``totals[k]`` is -2 where tables disagree on the rows of key ``k``.
    """
    index: dict[str, int] = {}
    mapped = {d: np.array([index.setdefault(k, len(index)) for k in tables[d][0]],
                          dtype=np.int64) for d in dict.fromkeys(s.keys_digest for s in summaries)}
    hi = np.full(len(index), -1, dtype=np.int64)
    lo = np.full(len(index), np.iinfo(np.int64).max, dtype=np.int64)
    for d, idx in mapped.items():
        np.maximum.at(hi, idx, tables[d][1])
        np.minimum.at(lo, idx, tables[d][1])
    key = [mapped[s.keys_digest][s.interval_keys(len(tables[s.keys_digest][0]))]
           for s in summaries]
    cat = [np.concatenate(a) if a else _EMPTY
           for a in (key, [s.starts for s in summaries], [s.stops for s in summaries])]
    return list(index), np.where(lo == hi, hi, -2), cat[0], cat[1], cat[2]


def coverage_problems(summaries: Sequence[NodeSummary]) -> list[str]:
    """Tensors whose rows the nodes' intervals do not tile exactly once (pure, vectorised).

    Usually every node holds every tensor (one key table, sent once): then the check is a few
    array comparisons over (nodes × tensors), no sort. Otherwise the key tables are merged and
    the intervals sorted.
    """
    tables, out = _key_tables(summaries)
    if any(s.keys_digest not in tables for s in summaries):
        return [*out, "a node left out a key table that no node sent"]
    digests = {s.keys_digest for s in summaries}
    bad_mask = _one_table(summaries, tables[digests.pop()]) if len(digests) == 1 else None
    if bad_mask is not None:
        keys: list[str] = list(tables[summaries[0].keys_digest][0])
    else:
        keys, totals, key, start, stop = _union(summaries, tables)
        out += [f"tensor {keys[k]!r} has different row counts on different nodes"
                for k in np.flatnonzero(totals == -2)[:4].tolist()]
        bad_mask = _sorted_tiles(key, start, stop, totals)
    bad = np.flatnonzero(bad_mask).tolist()
    out += [f"tensor {keys[k]!r} rows are not covered exactly once across nodes"
            for k in bad[:4]]
    if len(bad) > 4:
        out.append(f"... and {len(bad) - 4} more tensors")
    return out


def check_nodes(nodes: Sequence[str], summaries: Sequence[NodeSummary]) -> list[str]:
    """Coordinator: problems that make the checkpoint incomplete (pure); empty when complete.

    Args:
        nodes: the node of each rank, indexed by rank (the checkpoint's layout).
    """
    problems = [f"node {s.node}: {p}" for s in summaries for p in s.problems]
    names = [s.node for s in summaries]
    if len(set(names)) != len(names):
        problems.append("a node reported twice")
    return problems + _rank_problems(nodes, summaries) + coverage_problems(summaries)


def encode_top_manifest(info: CheckpointInfo, summaries: Sequence[NodeSummary]) -> bytes:
    """Canonical bytes of the top manifest: the checkpoint's identity and its sub-manifests."""
    return canonical_json({
        "ckpt_id": info.ckpt_id, "run_id": info.identity.run_id,
        "spec_id": info.identity.spec_id, "dataset_id": info.identity.dataset_id,
        "contract": info.identity.contract, "generation": info.identity.generation,
        "step": info.step, "parent": info.parent,
        "world_size": len(info.nodes), "nodes": list(info.nodes), "checksum": info.checksum,
        "created": info.created, "extra": dict(info.extra),
        "schema_version": MANIFEST_SCHEMA_VERSION, "tensors": tensor_rows(summaries),
        "node_manifests": [{"node": s.node, "path": s.path, "digest": s.digest}
                           for s in sorted(summaries, key=lambda s: s.node)]})


def tensor_rows(summaries: Sequence[NodeSummary]) -> dict[str, int]:
    """Global rows of every replicated and dim-0 sharded tensor, from the key tables sent.

    The top manifest lists them so that a restoring node learns, from the top manifest alone,
    which tensors exist and whether its own sub-manifest covers what its ranks need.
    """
    out: dict[str, int] = {}
    for s in summaries:
        out.update(zip(s.keys, np.asarray(s.totals).tolist(), strict=True))
    return out


def commit_nodes(run_dir: Path, log: RunLog, info: CheckpointInfo,
                 summaries: Sequence[NodeSummary], *, tier: Tier,
                 fault: Callable[[str], None] = lambda stage: None,
                 storage: Storage = LOCAL_STORAGE) -> CommitOutcome:
    """Coordinator: verify the node summaries, write the top manifest, publish the COMMIT.

    The node agents have already written their sub-manifests. Refusals are recorded as FAULT
    entries; this never raises for a refused or stale commit: the verdict goes back to every
    rank, which raise together.
    """
    if any(s.nonfinite for s in summaries):
        detail = "; ".join(p for s in summaries if s.nonfinite for p in s.problems[:1])
        record_fault(log, info, kind=FaultClass.NONFINITE, detail=detail)
        return CommitOutcome(outcome=Outcome.NONFINITE, message=detail)
    hung = [s for s in summaries if s.problems]
    if hung and all(s.timed_out for s in hung):
        return abandon_on_timeout(log, info, "; ".join(s.problems[0] for s in hung[:4]))
    if problems := check_nodes(info.nodes, summaries):
        detail = f"checkpoint {info.ckpt_id} is incomplete: {'; '.join(problems[:4])}"
        record_fault(log, info, kind=FaultClass.STORAGE_ERROR, detail=detail)
        return CommitOutcome(outcome=Outcome.FAILED, message=detail)
    fault("before_manifest")
    top = encode_top_manifest(info, summaries)
    path = Path(run_dir) / manifest_relpath(info.ckpt_id)
    try:
        storage.makedirs(path.parent)
        storage.write_atomic(path, top)
    except StorageTimeoutError as exc:
        return abandon_on_timeout(log, info, f"manifest of {info.ckpt_id} not written: {exc}")
    fault("before_commit")
    total = sum(s.bytes for s in summaries)
    payload = commit_entry(run_id=info.identity.run_id, ckpt_id=info.ckpt_id,
                           generation=info.identity.generation, step=info.step, tier=tier,
                           digest=digest_bytes(top), total_bytes=total,
                           nodes=sorted(set(info.nodes)))
    try:
        entry = log.publish_entry(payload, generation=info.identity.generation,
                                  holder=info.identity.holder)
        publish_progress(log, info)
    except StaleGenerationError as exc:
        return CommitOutcome(outcome=Outcome.STALE, message=str(exc))
    fault("after_commit")
    return CommitOutcome(outcome=Outcome.COMMITTED, bytes=total, slot=entry.slot)


def publish_progress(log: RunLog, info: CheckpointInfo) -> None:
    """The rest of a commit: PROGRESS (the step and the gang's tokens) and the data CURSOR at
    the step, under the writer's fence (nothing when the save carries no progress)."""
    progress = info.progress
    if progress is None:
        return
    gen, holder = info.identity.generation, info.identity.holder
    log.publish_entry(ProgressPayload(step=info.step, tokens=progress.tokens), generation=gen,
                      holder=holder)
    if progress.cursor is not None:
        log.publish_entry(CursorPayload(step=info.step, cursor=progress.cursor), generation=gen,
                          holder=holder)


def read_top_manifest(run_dir: Path, ckpt: CommittedCheckpoint, *,
                      storage: Storage = LOCAL_STORAGE) -> dict[str, Any]:
    """The parsed top manifest of a committed checkpoint, checked against its commit digest.

    Read once (rank 0) and broadcast: every node then opens only its own sub-manifest.

    Raises:
        CorruptCheckpointError: missing, altered since commit or of another schema.
    """
    top = read_committed_json(run_dir, ckpt, storage=storage)
    if not isinstance(top, dict):
        raise CorruptCheckpointError(f"manifest of {ckpt.ckpt_id} is not a JSON object; it will "
                                     "not be restored (restore falls back to an older checkpoint)")
    return top


def read_node_shards(run_dir: Path, ckpt_id: str, top: Mapping[str, Any], node: str, *,
                     storage: Storage = LOCAL_STORAGE) -> tuple[ShardRecord, ...]:
    """The shard records of one node, from its sub-manifest only (digest-checked).

    Raises:
        CorruptCheckpointError: the top manifest lists no such node, or its file fails.
    """
    refs = dict(node_manifest_refs(top))
    rel = submanifest_path(node)
    if rel not in refs:
        raise CorruptCheckpointError(f"manifest of {ckpt_id} lists no sub-manifest for node "
                                     f"{node!r}; it holds {len(refs)} nodes")
    data = storage.read_bytes(Path(run_dir) / manifest_relpath(ckpt_id).rsplit("/", 1)[0] / rel)
    if digest_bytes(data) != refs[rel]:
        raise CorruptCheckpointError(f"sub-manifest {rel} of {ckpt_id} fails its digest")
    shards = parse_json(data, f"sub-manifest {rel}").get("shards", [])
    return decode_manifest({**top, "node_manifests": []}, shards).shards
