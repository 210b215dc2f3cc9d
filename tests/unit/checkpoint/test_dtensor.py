"""DTensor checkpoints: the box planner (pure, property-tested) and real gloo gangs that save
FSDP2, FSDP2 + TP and HSDP state and restore it resharded onto other meshes, bitwise."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.checkpoint.chunks import covered, intersect, is_writer
from hpcrun.checkpoint.keys import META_KEY, Placement
from hpcrun.checkpoint.manifest import (
    DatasetRecord,
    ShardRecord,
    decode_manifest,
    parse_json,
)
from hpcrun.checkpoint.readplan import Need, plan_node
from hpcrun.checkpoint.restore import build_tensors
from hpcrun.checkpoint.state import TensorLeaf
from hpcrun.control.payload import canonical_json
from hpcrun.drill.restore import restore_drill
from hpcrun.drill.states import find_committed, load_state
from hpcrun.errors import CheckpointError
from hpcrun.testing.net import free_port

ROOT = Path(__file__).resolve().parents[3]


# -- the planner (pure) -------------------------------------------------------------------------

def _cuts(draw: st.DrawFn, n: int) -> list[tuple[int, int]]:
    """A split of ``range(n)`` into consecutive (possibly empty) spans."""
    k = draw(st.integers(1, 4))
    points = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *points, n]
    return [(a, b - a) for a, b in itertools.pairwise(bounds)]


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], list, list]:
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))

    def grid() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        per_dim = [_cuts(draw, n) for n in shape]
        boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((), ())]
        for spans in per_dim:
            boxes = [((*o, a), (*n, ln)) for o, n in boxes for a, ln in spans]
        return boxes

    return shape, grid(), grid()


def _record(key: str, shape: tuple[int, ...], box, index: int, per: int = 0) -> DatasetRecord:
    offs, lens = box
    blocks = tuple(f"b{k}" for k in range(-(-lens[0] // per))) if per else ()
    return DatasetRecord(key=key, h5path=f"/{key}/{index}", placement="chunk", dtype="int64",
                         global_shape=shape, row_start=offs[0], row_stop=offs[0] + lens[0],
                         offset=-1, nbytes=math.prod(lens) * 8, checksum="x", offsets=offs,
                         lengths=lens, placements=("Shard(dim=0)",), block_rows=per,
                         blocks=blocks)


@settings(max_examples=150, deadline=None)
@given(_layouts(), st.integers(0, 3))
def test_any_two_layouts_restore_every_element_exactly_once(layouts, per: int) -> None:
    """Whatever the old and new boxes, and whether the old boxes are checksummed per row
    block (``per`` rows each; 0: whole), every element lands once; a rank reads only the
    blocks that hold rows it needs."""
    shape, old, new = layouts
    whole = torch.arange(math.prod(shape), dtype=torch.int64).view(shape)
    written = [b for b in old if math.prod(b[1])]  # empty boxes are never written
    meta = DatasetRecord(key=META_KEY, h5path="/m", placement="local", dtype="uint8",
                         global_shape=(2,), row_start=0, row_stop=2, offset=-1, nbytes=2,
                         checksum="x")
    records = {j: ShardRecord(rank=j, node="n", path=f"n/rank-{j:05d}.h5", bytes=0,
                              datasets=(_record("w", shape, b, j, per), meta))
               for j, b in enumerate(written)}
    needs = [Need(rank=r, chunks={"w": (b[0], b[1], shape)}) for r, b in enumerate(new)]
    plans = plan_node(records, needs, ckpt_id="c", checksum="xxh3", old_world=len(written),
                      new_world=len(new))
    for plan, box in zip(plans, new, strict=True):
        assert not plan.error
        [(target, pieces)] = plan.targets
        assert target.box == box
        boxes = [(p.record.offsets, p.record.lengths) for p in pieces]
        assert covered(box, boxes) == math.prod(box[1])  # every element, once: disjoint boxes
        for p in pieces:  # a part read holds rows of the box in its first and last block
            d = p.record
            if d.checksum == "":
                first, last = d.offsets[0], d.offsets[0] + d.lengths[0]
                assert first < box[0][0] + box[1][0] and first + per > box[0][0]
                assert last > box[0][0] and last - per < box[0][0] + box[1][0]
        own = np.zeros(plan.size, dtype=np.uint8)
        for r in plan.reads:  # what the shard files would hand over
            d = plan.files[r.shard].datasets[r.index]
            if d.key == META_KEY:
                own[r.offset:r.offset + 2] = np.frombuffer(b"{}", dtype=np.uint8)
            elif d.key == "w":
                sl = tuple(slice(o, o + n) for o, n in zip(d.offsets, d.lengths, strict=True))
                own[r.offset:r.offset + d.nbytes] = whole[sl].contiguous().view(-1).view(
                    torch.uint8).numpy()
        dest = torch.full(box[1], -1, dtype=torch.int64)
        leaf = TensorLeaf(key="w", tensor=dest, placement=Placement.CHUNK, global_shape=shape,
                          offsets=box[0])
        tensors, _ = build_tensors(plan, own, [], {"w": leaf})
        sl = tuple(slice(o, o + n) for o, n in zip(*box, strict=True))
        if math.prod(box[1]):
            assert tensors["w"] is dest and torch.equal(dest, whole[sl])


def test_intersect_and_cover() -> None:
    assert intersect(((0, 0), (4, 5)), ((2, 3), (4, 4))) == ((2, 3), (2, 2))
    assert intersect(((0,), (2,)), ((2,), (2,))) is None
    assert covered(((0,), (10,)), [((0,), (4,)), ((4,), (3,))]) == 7


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_each_box_has_exactly_one_writer_among_its_replicas(mesh, data) -> None:
    rep = data.draw(st.sets(st.integers(0, len(mesh) - 1)))
    coords = np.stack(np.meshgrid(*[range(n) for n in mesh], indexing="ij"), -1)
    coords = coords.reshape(-1, len(mesh))
    writers: dict[tuple[int, ...], int] = {}
    for c in coords:
        box = tuple(int(x) for i, x in enumerate(c) if i not in rep)
        writers[box] = writers.get(box, 0) + is_writer(list(c), mesh, sorted(rep), "model/w")
    assert set(writers.values()) == {1}


def test_version_1_manifests_still_read() -> None:
    raw = {"schema_version": 1, "ckpt_id": "c", "run_id": "r", "spec_id": "s",
           "dataset_id": "", "contract": "exact-order", "generation": 1, "step": 3,
           "parent": None, "world_size": 1, "nodes": ["n"], "checksum": "xxh3",
           "created": 0.0, "extra": {}, "shards": []}
    assert decode_manifest(parse_json(canonical_json(raw), "manifest")).step == 3


class _Odd(torch.Tensor):
    """A tensor subclass the checkpointer does not know."""


def test_unknown_tensor_subclass_is_refused_at_registration(incarnation) -> None:
    odd = torch.zeros(3).as_subclass(_Odd)
    with pytest.raises(CheckpointError, match=r"'model/w'.*tensor subclass.*DTensor"):
        incarnation().restore({"model": {"w": odd}})  # a fresh run: nothing to restore yet


class ShardedTensor:
    """Named as torch's older sharded tensor (not a torch.Tensor), which hpcrun refuses."""


def test_a_sharded_tensor_is_refused_at_registration_with_the_way_out(incarnation) -> None:
    with pytest.raises(CheckpointError, match=r"'model/w'.*ShardedTensor.*fully_shard"):
        incarnation().restore({"model": {"w": ShardedTensor()}})


_PARTIAL = """
import os, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, init_device_mesh
from hpcrun.checkpoint.chunks import local_box
from hpcrun.errors import CheckpointError
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
try:
    local_box(DTensor.from_local(torch.ones(4), mesh, [Partial()]), "model/w")
except CheckpointError as e:
    print(e)
dist.destroy_process_group()
"""


def test_a_dtensor_with_a_pending_reduction_is_refused() -> None:
    out = subprocess.run([sys.executable, "-c", _PARTIAL], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "PORT": str(free_port()), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'model/w'" in out.stdout and "Partial placement" in out.stdout, out.stdout
    assert "redistribute it to Shard or Replicate" in out.stdout


# -- real gangs (gloo, one process per rank) -----------------------------------------------------

def _gang(mode: str, layout: str, world: int, run: Path, out: Path) -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.unit.checkpoint.dtensor_worker", mode, layout, str(r),
         str(world), str(port), str(run), str(out)], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(logs)[-4000:]


def _same(out: Path, name: str, tensors: int = 16) -> None:
    saved, got = np.load(out / "saved.npz"), np.load(out / f"{name}.npz")
    assert sorted(saved.files) == sorted(got.files) and len(saved.files) == tensors
    for key in saved.files:
        assert saved[key].tobytes() == got[key].tobytes(), key


@pytest.fixture
def gang_dirs(tmp_path: Path) -> tuple[Path, Path]:
    run, out = tmp_path / "run", tmp_path / "out"
    (run / "log").mkdir(parents=True)
    out.mkdir()
    return run, out


def test_fsdp2_reshards_2_to_4_and_3_uneven(gang_dirs) -> None:
    run, out = gang_dirs
    _gang("save", "fsdp", 2, run, out)
    # the offline reader (ckpt diff, drill --restore, export) sees the global tensors
    saved = np.load(out / "saved.npz")
    for size in (1, 3):
        got = load_state(run, find_committed(run), world_size=size)
        assert all(r.tensors[k] == saved[k].tobytes() for r in got.ranks for k in saved.files)
    # hpcrun drill --restore: every layout, and the damaged copies refused
    checks = restore_drill(run)
    assert [c for c in checks if c.ok is False] == [], checks
    assert {"latest → 2 ranks", "latest → 1 ranks", "latest → 4 ranks",
            "reject bit-flipped shard"} <= {c.name for c in checks}, checks
    _gang("restore", "fsdp", 4, run, out)
    _same(out, "restored-4")
    _gang("restore", "fsdp", 3, run, out)
    _same(out, "restored-3")


def test_tp_by_fsdp_restores_onto_fsdp_2_and_4(gang_dirs) -> None:
    run, out = gang_dirs
    _gang("save", "tp", 4, run, out)
    _gang("restore", "fsdp", 2, run, out)
    _same(out, "restored-2")
    _gang("restore", "fsdp", 4, run, out)
    _same(out, "restored-4")


def test_fsdp_4_restores_onto_tp_by_fsdp_and_onto_fsdp_2(gang_dirs) -> None:
    run, out = gang_dirs
    _gang("save", "fsdp", 4, run, out)
    _gang("restore", "tp", 4, run, out)
    _same(out, "restored-4")
    _gang("restore", "fsdp", 2, run, out)
    _same(out, "restored-2")


def test_hsdp_writes_each_box_once_and_restores_onto_fsdp(gang_dirs) -> None:
    run, out = gang_dirs
    _gang("save", "hsdp", 4, run, out)
    subs = sorted((run / "ckpt").glob("*/manifests/*.json"))  # one per node
    chunks = [d for sub in subs for s in json.loads(sub.read_text())["shards"]
              for d in s["datasets"] if d["placement"] == "chunk"]
    assert len(subs) == 2 and chunks
    per_key: dict[str, int] = {}
    for d in chunks:
        per_key[d["key"]] = per_key.get(d["key"], 0) + math.prod(d["lengths"])
    # each global element stored once although two replicas hold every box
    assert all(per_key[d["key"]] == math.prod(d["global_shape"]) for d in chunks)
    _gang("restore", "fsdp", 2, run, out)
    _same(out, "restored-2")


def test_a_rank_reads_only_the_row_blocks_of_old_boxes_it_needs(gang_dirs) -> None:
    """FSDP2 2 -> 4 ranks: each new box is half an old one; the old boxes (2 MiB) were
    checksummed in row blocks, so each rank reads and verifies only its half."""
    run, out = gang_dirs
    _gang("save", "wide", 2, run, out)
    wide = [d for sub in sorted((run / "ckpt").glob("*/manifests/*.json"))
            for s in json.loads(sub.read_text())["shards"] for d in s["datasets"]
            if "wide.weight" in d["key"] and d["placement"] == "chunk"]
    assert len(wide) == 6 and all(len(d["blocks"]) == 2 for d in wide)  # param + 2 moments
    old_box = wide[0]["nbytes"]
    _gang("restore", "wide", 4, run, out)
    _same(out, "restored-4", tensors=8)
    for rank in range(4):
        read = json.loads((out / f"read-{rank}.json").read_text())["bytes_read"]
        # three half boxes (weight, exp_avg, exp_avg_sq), plus the small layer and the meta
        assert 3 * old_box // 2 <= read < 3 * old_box * 0.6, (rank, read, old_box)
