"""Property and unit tests of the pure core: planning, manifests, GC selection, flattening."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.manifest import (
    DatasetRecord,
    Manifest,
    ShardRecord,
    check_coverage,
    decode_manifest,
    encode_manifest,
    node_manifest_refs,
    parse_json,
    safe_relpath,
)
from hpcrun.checkpoint.restore import plan_gather
from hpcrun.checkpoint.retention import select_debris, select_local_victims, select_shared_victims
from hpcrun.checkpoint.stage import plan_replicated
from hpcrun.checkpoint.state import RowShard, decode_tree, flatten_state
from hpcrun.checkpoint.tiers import CommittedCheckpoint, Tier
from hpcrun.errors import CheckpointError, CorruptCheckpointError

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


@settings(max_examples=200, deadline=None)
@given(specs=st.lists(st.tuples(shapes, st.sampled_from([1, 2, 4, 8])), max_size=8),
       world=st.integers(1, 7))
def test_replicated_rows_covered_exactly_once_and_balanced(specs, world) -> None:
    named = [(f"t{i}", shape, size) for i, (shape, size) in enumerate(specs)]
    plan = plan_replicated(named, world)
    total = 0
    for key, shape, size in named:
        rows = shape[0] if shape else 1
        spans = sorted((a, b) for r in plan for k, a, b in plan[r] if k == key)
        pos = 0
        for a, b in spans:
            assert a == pos
            pos = b
        assert pos == rows and spans  # every tensor has at least one piece
        total += rows * (math.prod(shape[1:]) if shape else 1) * size
    widest = max((math.prod(s[1:]) if s else 1) * z for _, s, z in named) if named else 0
    for r in plan:
        got = sum((b - a) * ((math.prod(s[1:]) if s else 1) * z)
                  for k, a, b in plan[r] for kk, s, z in named if kk == k)
        assert abs(got - total / world) <= widest + 1e-9


def _manifest(nodes: tuple[str, ...], *, drop_row: bool = False) -> Manifest:
    shards = []
    for rank, node in enumerate(nodes):
        ds = [DatasetRecord(key="__meta__", h5path="/__meta__", placement="local", dtype="uint8",
                            global_shape=(3,), row_start=0, row_stop=3, offset=-1, nbytes=3,
                            checksum="xxh3:0")]
        if not (drop_row and rank == 0):
            ds.append(DatasetRecord(key="w", h5path="/w", placement="replicated",
                                    dtype="float32", global_shape=(len(nodes), 2),
                                    row_start=rank, row_stop=rank + 1, offset=4096,
                                    nbytes=8, checksum="xxh3:1"))
        shards.append(ShardRecord(rank=rank, node=node, path=f"{node}/rank-{rank:05d}.h5",
                                  bytes=9000, datasets=tuple(ds)))
    return Manifest(ckpt_id="g1-s1", run_id="r", spec_id="s", dataset_id="d", contract="c",
                    generation=1, step=1, parent=None, world_size=len(nodes), nodes=nodes,
                    checksum="xxh3", created=1.0, shards=tuple(shards), extra={"a": [1]})


@pytest.mark.parametrize("threshold", [0, 10_000])
def test_manifest_round_trips_flat_and_hierarchical(threshold: int) -> None:
    m = _manifest(("a", "a", "b"))
    top, subs = encode_manifest(m, threshold=threshold)
    assert bool(subs) == (threshold == 0)
    raw = parse_json(top, "m")
    sub_shards = [s for path, _ in node_manifest_refs(raw)
                  for s in parse_json(subs[path.split("/")[1][:-5]], "sub")["shards"]]
    assert decode_manifest(raw, sub_shards) == m
    assert encode_manifest(m, threshold=threshold)[0] == top  # canonical


def test_coverage_reports_missing_rows_and_shards() -> None:
    assert check_coverage(_manifest(("a", "b"))) == []
    assert any("rows" in p for p in check_coverage(_manifest(("a", "b"), drop_row=True)))


@pytest.mark.parametrize("bad", ["../x.h5", "/etc/passwd", "a/../../x", ""])
def test_manifest_paths_that_escape_are_refused(bad: str) -> None:
    with pytest.raises(CorruptCheckpointError):
        safe_relpath(bad)


def _ckpts(n: int, shared_upto: int) -> list[CommittedCheckpoint]:
    return [CommittedCheckpoint(ckpt_id=f"c{i}", step=i, generation=1, manifest="m",
                                digest="", bytes=1, nodes=("a",), slot=i, committed_at=float(i),
                                tiers=_tiers(i < shared_upto))
            for i in range(n)]


def _tiers(shared: bool) -> frozenset[str]:
    return frozenset({Tier.NODE_LOCAL, Tier.SHARED} if shared else {Tier.NODE_LOCAL})


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 8), k=st.integers(2, 4), shared=st.integers(0, 8),
       in_flight=st.booleans())
def test_gc_never_deletes_newest_kept_or_in_flight(n, k, shared, in_flight) -> None:
    committed = _ckpts(n, shared)
    flight = ["c_new"] if in_flight else []
    victims = select_shared_victims(committed, keep_last=k, in_flight=flight)
    survivors = [c for c in committed if c.ckpt_id not in victims]
    assert len(survivors) >= min(n, k) and "c_new" not in victims
    if committed:
        assert committed[-1].ckpt_id not in victims
    durable = [c.ckpt_id for c in committed if Tier.SHARED in c.tiers]
    if durable:
        assert durable[-1] not in victims
    local = select_local_victims(committed, {c.ckpt_id for c in committed}, keep_last=k)
    newest_durable = max((i for i, c in enumerate(committed) if Tier.SHARED in c.tiers),
                         default=-1)
    assert all(int(v[1:]) <= newest_durable for v in local)


def test_debris_is_uncommitted_old_and_not_in_flight() -> None:
    present = {"c1": 0.0, "junk": 0.0, "fresh": 990.0, "flight": 0.0}
    assert select_debris(present, {"c1"}, now=1000.0, older_than=60.0,
                         in_flight=["flight"]) == ["junk"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=5)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(value=json_values, key=st.sampled_from(["a", "a/b", "..", "__x", ""]))
def test_flatten_then_decode_is_identity(value, key) -> None:
    tree = {"x": value, "t": {key: torch.arange(6).view(2, 3)}, "tup": (1, {3: 2.5})}
    flat = flatten_state({"s": tree})
    back = decode_tree(flat.meta["s"], {k: leaf.tensor for k, leaf in flat.leaves.items()})
    assert back["x"] == value and back["tup"] == (1, {3: 2.5})
    assert torch.equal(back["t"][key], tree["t"][key])


def test_non_json_values_are_refused_with_their_path() -> None:
    with pytest.raises(CheckpointError, match="s/obj"):
        flatten_state({"s": {"obj": object()}})


def test_row_shard_must_fit() -> None:
    with pytest.raises(CheckpointError):
        RowShard(tensor=torch.zeros(5, 2), row_start=8, global_rows=10)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (2, 4), (3, 3), (5, 1)])
def test_gather_plan_reads_each_old_shard_once(old: int, new: int) -> None:
    plan = plan_gather(_manifest(tuple("n" for _ in range(old))), new)
    read = sorted(j for files in plan.files.values() for j in files)
    assert read == list(range(old)) and len(plan.sizes) == new
