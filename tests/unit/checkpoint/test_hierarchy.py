"""Hierarchical commit: node agents summarise, the coordinator verifies and publishes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint import hierarchy
from hpcrun.checkpoint.commit import CheckpointInfo, Outcome
from hpcrun.checkpoint.identity import CheckpointIdentity
from hpcrun.checkpoint.manifest import (
    DatasetRecord,
    Manifest,
    ShardRecord,
    encode_manifest,
)
from hpcrun.checkpoint.tiers import Tier, fold_checkpoints
from hpcrun.control.log import RunLog
from hpcrun.control.payload import canonical_json


def _shard(rank: int, node: str, spans: dict[str, tuple[int, int, int]]) -> ShardRecord:
    """A shard holding rows [a, b) of each key (of ``total`` rows) plus its meta dataset."""
    ds = [DatasetRecord(key=k, h5path="/" + k, placement="row", dtype="float32",
                        global_shape=(total, 2), row_start=a, row_stop=b, offset=-1,
                        nbytes=(b - a) * 8, checksum=f"xxh3:{rank:016x}")
          for k, (a, b, total) in spans.items()]
    ds.append(DatasetRecord(key="__meta__", h5path="/__meta__", placement="local",
                            dtype="uint8", global_shape=(2,), row_start=0, row_stop=2, offset=-1,
                            nbytes=2, checksum="xxh3:0"))
    return ShardRecord(rank=rank, node=node, path=f"{node}/rank-{rank:05d}.h5", bytes=4096,
                       datasets=tuple(ds))


def _gang(ranks: int, per_node: int, keys: int = 3) -> tuple[tuple[str, ...], list[ShardRecord]]:
    nodes = tuple(f"n{r // per_node}" for r in range(ranks))
    shards = [_shard(r, nodes[r], {f"model/t{i}": (r, r + 1, ranks) for i in range(keys)})
              for r in range(ranks)]
    return nodes, shards


def _info(nodes: tuple[str, ...], holder: str = "h", generation: int = 1) -> CheckpointInfo:
    ident = CheckpointIdentity(run_id="r", spec_id="s", dataset_id="d", contract="exact-order",
                               generation=generation, holder=holder)
    return CheckpointInfo(ckpt_id="g000001-s0000000007-h", identity=ident, step=7, parent=None,
                          nodes=nodes, checksum="xxh3", created=1.0)


def _flat(info: CheckpointInfo, shards: list[ShardRecord]) -> Manifest:
    """The same checkpoint as one flat manifest, the reference the hierarchy must match."""
    ident = info.identity
    return Manifest(ckpt_id=info.ckpt_id, run_id=ident.run_id, spec_id=ident.spec_id,
                    dataset_id=ident.dataset_id, contract=ident.contract,
                    generation=ident.generation, step=info.step, parent=info.parent,
                    world_size=len(info.nodes), nodes=info.nodes, checksum=info.checksum,
                    created=info.created, shards=tuple(sorted(shards, key=lambda s: s.rank)),
                    extra=dict(info.extra))


def _summaries(nodes: tuple[str, ...], shards: list[ShardRecord],
               ) -> tuple[dict[str, bytes], list[hierarchy.NodeSummary]]:
    subs, out = {}, []
    for node in sorted(set(nodes)):
        data, s = hierarchy.summarize_node("g000001-s0000000007-h", node,
                                           [x for x in shards if x.node == node])
        subs[node] = data
        out.append(s)
    return subs, out


def test_files_match_the_flat_encoding_and_read_back_as_the_same_manifest(tmp_path: Path) -> None:
    nodes, shards = _gang(12, 4)
    subs, summaries = _summaries(nodes, shards)
    flat = _flat(_info(nodes), shards)
    top, flat_subs = encode_manifest(flat, threshold=0)
    assert subs == flat_subs  # node agents write exactly what the flat path writes
    hier_top = json.loads(hierarchy.encode_top_manifest(_info(nodes), summaries))
    # the top manifest also lists every tensor's rows, for restore planning by node
    assert hier_top.pop("tensors") == {f"model/t{i}": 12 for i in range(3)}
    assert canonical_json(hier_top) == top

    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    fence = log.claim("h")
    info = _info(nodes, generation=fence.generation)
    for node, data in subs.items():
        hierarchy.write_node_manifest(tmp_path, info.ckpt_id, node, data)
    verdict = hierarchy.commit_nodes(tmp_path, log, info, summaries, tier=Tier.SHARED)
    assert verdict.outcome is Outcome.COMMITTED
    ckpt = fold_checkpoints(log.read())[-1]
    from hpcrun.checkpoint.commit import read_manifest

    assert read_manifest(tmp_path, ckpt).shards == tuple(shards)
    top_raw = hierarchy.read_top_manifest(tmp_path, ckpt)
    assert hierarchy.read_node_shards(tmp_path, ckpt.ckpt_id, top_raw, "n1") == tuple(shards[4:8])


def test_a_missing_rank_or_row_gap_is_refused_and_nothing_is_committed(tmp_path: Path) -> None:
    nodes, shards = _gang(8, 4)
    _, summaries = _summaries(nodes, [s for s in shards if s.rank != 5])
    problems = hierarchy.check_nodes(nodes, summaries)
    assert any("ranks [5]" in p for p in problems)
    assert any("not covered exactly once" in p for p in problems)
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    fence = log.claim("h")
    verdict = hierarchy.commit_nodes(tmp_path, log, _info(nodes, generation=fence.generation),
                                     summaries, tier=Tier.SHARED)
    assert verdict.outcome is Outcome.FAILED and "incomplete" in verdict.message
    assert fold_checkpoints(log.read()) == []


def test_overlap_wrong_node_and_stale_generation_are_refused(tmp_path: Path) -> None:
    nodes, shards = _gang(4, 2)
    twice = [*shards, _shard(1, "n0", {"model/t0": (0, 2, 4)})]
    _, summaries = _summaries(nodes, twice)
    assert hierarchy.check_nodes(nodes, summaries)
    _, good = _summaries(nodes, shards)
    assert hierarchy.check_nodes(("n1",) * 4, good)  # layout says every rank is on n1
    (tmp_path / "log").mkdir()
    log = RunLog(tmp_path)
    old = log.claim("old")
    log.claim("new")
    verdict = hierarchy.commit_nodes(tmp_path, log, _info(nodes, "old", old.generation), good,
                                     tier=Tier.SHARED)
    assert verdict.outcome is Outcome.STALE
    assert fold_checkpoints(log.read()) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.integers(1, 4),
       st.data())
def test_coverage_check_agrees_with_the_flat_check(widths: list[int], per_node: int,
                                                   data: st.DataObject) -> None:
    """Random row splits, with one piece maybe dropped or shifted: same verdict as flat."""
    total, bounds = sum(widths), [0]
    for w in widths:
        bounds.append(bounds[-1] + w)
    spans = [(bounds[i], bounds[i + 1]) for i in range(len(widths))]
    damage = data.draw(st.sampled_from(["none", "drop", "shift"]))
    victim = data.draw(st.integers(0, len(spans) - 1))
    if damage == "shift":
        spans[victim] = (spans[victim][0] + 1, spans[victim][1] + 1)
    ranks = len(spans)
    nodes = tuple(f"n{r // per_node}" for r in range(ranks))
    shards = [_shard(r, nodes[r], {"model/w": (*spans[r], total)}) for r in range(ranks)
              if not (damage == "drop" and r == victim)]
    _, summaries = _summaries(nodes, shards)
    from hpcrun.checkpoint.manifest import _row_problems

    flat = _flat(_info(nodes), shards)
    assert bool(hierarchy.coverage_problems(summaries)) == bool(_row_problems(flat))


def test_summary_arrays_must_agree() -> None:
    with pytest.raises(ValueError, match="mismatched"):
        hierarchy.NodeSummary(node="n0", path="manifests/n0.json", digest="x", ranks=(0,),
                              bytes=1, datasets=1, keys=("a",))


def test_elided_key_tables_and_nodes_holding_different_tensors(tmp_path: Path) -> None:
    """Replicated tensors split by bytes leave some nodes without some keys; tables merge."""
    nodes = ("n0", "n0", "n1", "n1")
    shards = [_shard(0, "n0", {"model/a": (0, 4, 4), "model/b": (0, 1, 2)}),
              _shard(1, "n0", {"model/b": (1, 2, 2)}),
              _shard(2, "n1", {"model/c": (0, 3, 6)}),
              _shard(3, "n1", {"model/c": (3, 6, 6)})]
    _, summaries = _summaries(nodes, shards)
    assert hierarchy.check_nodes(nodes, summaries) == []
    assert hierarchy.check_nodes(nodes, summaries[::-1]) == []  # any arrival order

    gang_nodes, gang = _gang(32, 4, keys=5)
    first, known = None, ""
    summaries = []
    for node in sorted(set(gang_nodes), reverse=True):  # arrival order is not row order
        _, s = hierarchy.summarize_node("c", node, [x for x in gang if x.node == node],
                                        known_keys=known)
        known = known or s.keys_digest
        first = first or s
        summaries.append(s)
    assert all(not s.keys and s.key_index.size == 0 for s in summaries[1:])  # elided, implicit
    assert hierarchy.check_nodes(gang_nodes, summaries) == []
    assert "no node sent" in " ".join(hierarchy.check_nodes(gang_nodes, summaries[1:]))
