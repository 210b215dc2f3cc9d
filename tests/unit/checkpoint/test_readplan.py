"""Restore planning by node: which sub-manifests a node reads, which bytes each rank reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.manifest import DatasetRecord, ShardRecord
from hpcrun.checkpoint.readplan import Need, guess_nodes, plan_node, uncovered, wanted_nodes

COLS = 4


def _split(rows: int, n: int) -> list[tuple[int, int]]:
    base, extra = divmod(rows, n)
    out, a = [], 0
    for r in range(n):
        b = a + base + (r < extra)
        out.append((a, b))
        a = b
    return out


def _ds(key: str, placement: str, rows: int, a: int, b: int) -> DatasetRecord:
    return DatasetRecord(key=key, h5path="/" + key, placement=placement, dtype="float32",
                         global_shape=(rows, COLS), row_start=a, row_stop=b, offset=-1,
                         nbytes=(b - a) * COLS * 4, checksum="xxh3:0")


def _shards(n: int, per_node: int, rows: int, replicated: int = 0) -> dict[int, ShardRecord]:
    rep = _split(replicated, n) if replicated else []
    out = {}
    for r, (a, b) in enumerate(_split(rows, n)):
        ds = [_ds("table", "row", rows, a, b)]
        if rep and rep[r][1] > rep[r][0]:
            ds.append(_ds("model", "replicated", replicated, *rep[r]))
        ds.append(DatasetRecord(key="__meta__", h5path="/__meta__", placement="local",
                                dtype="uint8", global_shape=(3,), row_start=0, row_stop=3,
                                offset=-1, nbytes=3, checksum="xxh3:0"))
        node = f"n{r // per_node}"
        out[r] = ShardRecord(rank=r, node=node, path=f"{node}/rank-{r:05d}.h5", bytes=1,
                             datasets=tuple(ds))
    return out


def _read_as_a_node_leader(shards: dict[int, ShardRecord], needs: list[Need],
                           tensors: dict[str, int]) -> tuple[dict[int, ShardRecord], set[str]]:
    """What RestoreShell._plan_node does, over in-memory sub-manifests."""
    old_nodes = [s.node for _, s in sorted(shards.items())]
    records: dict[int, ShardRecord] = {}
    loaded: set[str] = set()
    todo = wanted_nodes(old_nodes, [n.rank for n in needs])
    while todo:
        for node in todo:
            records.update((j, s) for j, s in shards.items() if s.node == node)
            loaded.add(node)
        gaps = uncovered(records, tensors, needs, len(old_nodes))
        if not gaps:
            break
        todo = [n for n in guess_nodes(gaps, tensors, old_nodes) if n not in loaded] or \
            [n for n in dict.fromkeys(old_nodes) if n not in loaded]
    return records, loaded


@settings(max_examples=60, deadline=None)
@given(old=st.integers(1, 24), new=st.integers(1, 24), per_node=st.integers(1, 4),
       per_rank=st.integers(1, 40), extra=st.integers(0, 23))
def test_resharding_reads_only_intersecting_rows_from_covering_sub_manifests(
        old: int, new: int, per_node: int, per_rank: int, extra: int) -> None:
    rows = max(old, new) * per_rank + extra
    shards = _shards(old, per_node, rows)
    bounds = _split(rows, new)
    for first in range(0, new, per_node):
        ranks = range(first, min(new, first + per_node))
        needs = [Need(rank=r, rows={"table": (*bounds[r], (rows, COLS))}) for r in ranks]
        records, loaded = _read_as_a_node_leader(shards, needs, {"table": rows})
        plans = plan_node(records, needs, ckpt_id="c", checksum="xxh3", old_world=old,
                          new_world=new)
        # a node reads sub-manifests of at most the old nodes covering its rows, plus one
        covering = {shards[j].node for j in range(old) for r in ranks
                    if max(shards[j].datasets[0].row_start, bounds[r][0])
                    < min(shards[j].datasets[0].row_stop, bounds[r][1])}
        covering |= {shards[r % old].node for r in ranks}
        if per_rank >= 4:  # rows well above ranks: the even-split guess is within one rank
            assert loaded <= covering | set(guess_nodes(
                {"table": [bounds[r] for r in ranks]}, {"table": rows},
                [s.node for s in shards.values()]))
        for r, plan in zip(ranks, plans, strict=True):
            [(target, pieces)] = plan.targets
            assert (target.start, target.stop) == bounds[r]
            got = sorted((p.record.row_start, p.record.row_stop) for p in pieces)
            # the pieces tile the rank's rows, and only pieces that intersect them are read
            assert got[0][0] <= bounds[r][0] and got[-1][1] >= bounds[r][1]
            assert all(a < bounds[r][1] and b > bounds[r][0] for a, b in got)
            assert plan.meta is not None and plan.meta.record.key == "__meta__"


def test_same_layout_reads_own_shard_only_and_replicated_once_per_node() -> None:
    shards = _shards(8, 4, 64, replicated=40)
    needs = [Need(rank=r, rows={"table": (r * 8, r * 8 + 8, (64, COLS))}) for r in range(4)]
    records, loaded = _read_as_a_node_leader(shards, needs, {"table": 64, "model": 40})
    assert loaded == {"n0", "n1"}  # the replicated tensor's pieces are on every old node
    plans = plan_node(records, needs, ckpt_id="c", checksum="xxh3", old_world=8, new_world=4)
    for r, plan in enumerate(plans):
        own = {(x.shard, shards[x.shard].datasets[x.index].key) for x in plan.reads}
        assert (r, "table") in own and (r, "__meta__") in own
    replicated = [(x.shard, x.index) for p in plans for x in p.reads
                  if shards[x.shard].datasets[x.index].key == "model"]
    assert sorted(replicated) == sorted(set(replicated))  # each piece read once on the node
    assert len(replicated) == 8
    assert max(p.shared[0] for p in plans) > 0 and len(set(plans[0].shared)) <= 2  # balanced


def test_pure_sharded_same_layout_touches_one_sub_manifest_per_node() -> None:
    shards = _shards(16, 4, 64)
    needs = [Need(rank=r, rows={"table": (r * 4, r * 4 + 4, (64, COLS))}) for r in range(4, 8)]
    records, loaded = _read_as_a_node_leader(shards, needs, {"table": 64})
    assert loaded == {"n1"}
    plans = plan_node(records, needs, ckpt_id="c", checksum="xxh3", old_world=16, new_world=16)
    assert [sorted(p.files) for p in plans] == [[4], [5], [6], [7]]
    assert [p.bytes_read for p in plans] == [4 * COLS * 4 + 3] * 4
