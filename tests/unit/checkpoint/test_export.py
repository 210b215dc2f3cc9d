"""Export and init_from: the pure parts (file planning, the index, headers, key and optimizer
shaping, key checks) and single-process round trips through real checkpoints, the real
``safetensors`` package and DCP."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as hst

from hpcrun.checkpoint import Checkpointer
from hpcrun.checkpoint import export_safetensors as st
from hpcrun.checkpoint.export import ExportRequest, export_checkpoint
from hpcrun.checkpoint.export_state import (
    flatten_optimizer,
    optimizer_by_name,
    select_checkpoint,
)
from hpcrun.checkpoint.initfrom import (
    check_keys,
    detect_source,
    load_init,
    param_names,
    source_digest,
)
from hpcrun.checkpoint.tiers import CommittedCheckpoint
from hpcrun.errors import CheckpointError
from hpcrun.vocab import CheckpointFormat, Tier
from tests.unit.checkpoint.conftest import trained


def test_one_file_when_small_and_numbered_shards_when_not() -> None:
    sizes = [("a", 10), ("b", 10), ("c", 25), ("d", 5)]
    assert [(p.name, p.keys) for p in st.plan_files(sizes, stem="model", max_bytes=100)] == [
        ("model.safetensors", ("a", "b", "c", "d"))]
    plans = st.plan_files(sizes, stem="model", max_bytes=20)
    assert [(p.name, p.keys, p.nbytes) for p in plans] == [
        ("model-00001-of-00003.safetensors", ("a", "b"), 20),
        ("model-00002-of-00003.safetensors", ("c",), 25),  # larger than a file: its own
        ("model-00003-of-00003.safetensors", ("d",), 5)]
    index = st.build_index(plans)
    assert index["metadata"] == {"total_size": 50}
    assert index["weight_map"] == {"a": plans[0].name, "b": plans[0].name, "c": plans[1].name,
                                   "d": plans[2].name}


@given(hst.lists(hst.integers(0, 50), max_size=30), hst.integers(1, 60))
def test_file_plans_keep_every_key_once_in_order_within_the_size(sizes: list[int],
                                                                 cap: int) -> None:
    pairs = [(f"k{i}", n) for i, n in enumerate(sizes)]
    plans = st.plan_files(pairs, stem="m", max_bytes=cap)
    assert [k for p in plans for k in p.keys] == [k for k, _ in pairs]
    assert all(p.nbytes <= cap or len(p.keys) == 1 for p in plans)
    assert sum(p.nbytes for p in plans) == sum(sizes)


def test_written_files_load_with_the_safetensors_package(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = [("emb", torch.randn(5, 3).to(torch.bfloat16)), ("scalar", torch.tensor(7)),
               ("empty", torch.zeros(0, 4)), ("mask", torch.tensor([True, False])),
               ("w", torch.randn(2, 3, dtype=torch.float64))]
    path = tmp_path / "model.safetensors"
    st.write_file(path, tensors, {"format": "pt", "note": "x"})
    loaded = load_file(path)
    assert sorted(loaded) == sorted(k for k, _ in tensors)
    for key, t in tensors:
        assert loaded[key].dtype == t.dtype and torch.equal(loaded[key], t), key
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}
    ours = st.read_file(path)
    assert all(torch.equal(ours[k], t) and ours[k].dtype == t.dtype for k, t in tensors)


def test_a_truncated_or_foreign_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    st.write_file(path, [("w", torch.ones(100))], {})
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        st.read_file(path)
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        st.read_file(path)


def _committed(step: int, tiers: set[str]) -> CommittedCheckpoint:
    return CommittedCheckpoint(ckpt_id=f"g000001-s{step:010d}-h", step=step, generation=1,
                               manifest="m", digest="", bytes=0, nodes=("n",), slot=step,
                               committed_at=0.0, tiers=frozenset(Tier(t) for t in tiers))


def test_a_step_without_a_commit_on_the_shared_tier_lists_those_there_are() -> None:
    found = [_committed(5, {"shared"}), _committed(10, {"node_local"}),
             _committed(15, {"node_local", "shared"})]
    assert select_checkpoint(found, run="r").step == 15
    assert select_checkpoint(found, run="r", step=5).step == 5
    with pytest.raises(CheckpointError, match=r"no committed checkpoint at step 10 .*"
                                              r"committed steps: 5, 15; pass one"):
        select_checkpoint(found, run="r", step=10)
    with pytest.raises(CheckpointError, match="no checkpoint committed on the shared tier"):
        select_checkpoint([_committed(3, {"node_local"})], run="r")


def test_optimizer_indices_become_names_and_mismatches_are_refused() -> None:
    model, opt = trained(1)
    sd = model.state_dict()
    names = param_names({"model": model, "optim": opt})["optim"]
    assert names == ["emb", "lin.weight", "lin.bias"]  # the optimizer's own order
    osd = optimizer_by_name(opt.state_dict(), sd, names)
    assert set(osd["state"]) == set(names) and osd["param_groups"][0]["params"] == names
    assert torch.equal(osd["state"]["emb"]["exp_avg"], opt.state[model.emb]["exp_avg"])
    with pytest.raises(CheckpointError, match="does not name the optimizer's 3 parameters"):
        optimizer_by_name(opt.state_dict(), sd, None)
    with pytest.raises(CheckpointError, match="the optimizer's parameter order is not"):
        optimizer_by_name(opt.state_dict(), sd, ["lin.weight", "emb", "lin.bias"])
    tensors, rest = flatten_optimizer(osd)
    assert set(tensors) == {f"state.{n}.{k}" for n in names
                            for k in ("step", "exp_avg", "exp_avg_sq")}
    assert json.loads(rest)["param_groups"][0]["params"] == names


def test_key_problems_name_the_first_few() -> None:
    wanted = {f"layer{i}.w": (4,) for i in range(6)}
    found = {**{f"layer{i}.w": (4,) for i in range(1, 6)}, "head.w": (2,)}
    found["layer5.w"] = (5,)
    with pytest.raises(CheckpointError) as err:
        check_keys(found, wanted, source="/x")
    text = str(err.value)
    assert "1 missing (layer0.w)" in text and "1 unexpected (head.w)" in text
    assert "layer5.w [5] vs [4]" in text and "\n" not in text
    many = {f"k{i}": (1,) for i in range(5)}
    with pytest.raises(CheckpointError, match=r"5 missing \(k0, k1, k2, …\)"):
        check_keys({}, many, source="/x")


def test_a_path_of_neither_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file or directory"):
        detect_source(tmp_path / "nope")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="neither a DCP directory"):
        detect_source(tmp_path / "weights.bin")
    with pytest.raises(CheckpointError, match="neither a DCP directory"):
        detect_source(tmp_path)


def _save(incarnation: Callable[..., Checkpointer], state: dict[str, Any], step: int) -> None:
    ck = incarnation()
    res = ck.save(step, state, extra={"param_names": param_names(state)}, blocking=True)
    assert res is not None and res.committed, res


def test_export_keys_are_the_state_dicts_own_keys(run_dir: Path, tmp_path: Path,
                                                  incarnation: Callable[..., Checkpointer]
                                                  ) -> None:
    """hpcrun escapes '/' and '%' in its logical keys; the export undoes it."""
    weights = {"enc/layer%1.w": torch.randn(3, 2), "dec.w": torch.arange(4.0), ".": torch.ones(1)}
    _save(incarnation, {"model": weights}, 4)
    out = tmp_path / "st"
    export_checkpoint(run_dir, ExportRequest(fmt=CheckpointFormat.SAFETENSORS, out=out))
    from safetensors.torch import load_file

    loaded = load_file(out / "model.safetensors")
    assert sorted(loaded) == sorted(weights)
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_dcp_round_trip_into_a_fresh_model_and_optimizer(run_dir: Path, tmp_path: Path,
                                                        incarnation: Callable[..., Checkpointer]
                                                        ) -> None:
    model, opt = trained(1)
    _save(incarnation, {"model": model, "optim": opt}, 3)
    out = tmp_path / "dcp"
    result = export_checkpoint(run_dir, ExportRequest(fmt=CheckpointFormat.DCP, out=out))
    assert (out / ".metadata").is_file() and result.tensors == 3 + 3 * 3
    fresh, fresh_opt = trained(2)
    loaded = load_init(out, {"model": fresh, "optim": fresh_opt, "data": {"pos": 1}})
    assert loaded.optimizer and loaded.source.fmt == CheckpointFormat.DCP
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg_sq"], fresh_opt.state[q]["exp_avg_sq"])
    record = json.loads((out / "hpcrun-export.json").read_text())
    assert (record["step"], record["optimizer"], record["run_id"]) == (3, True, "run1")
    assert source_digest(detect_source(out)) == source_digest(detect_source(out))


def test_model_only_dcp_and_a_split_safetensors_index_initialise_a_model(
        run_dir: Path, tmp_path: Path, incarnation: Callable[..., Checkpointer]) -> None:
    model, _ = trained(1)
    _save(incarnation, {"model": model}, 2)  # no optimizer registered: DCP holds the model
    for fmt, out in ((CheckpointFormat.DCP, tmp_path / "d"),
                     (CheckpointFormat.SAFETENSORS, tmp_path / "s")):
        export_checkpoint(run_dir, ExportRequest(fmt=fmt, out=out, max_file_bytes=20_000))
        fresh, fresh_opt = trained(2)
        source = out / "model.safetensors.index.json" if fmt == "safetensors" else out
        loaded = load_init(source, {"model": fresh, "optim": fresh_opt})
        assert not loaded.optimizer and loaded.tensors == 3
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     fresh.state_dict().values(), strict=True))
    assert len(list((tmp_path / "s").glob("model-*-of-*.safetensors"))) >= 2


def test_a_source_of_another_model_is_refused_naming_keys(run_dir: Path, tmp_path: Path,
                                                          incarnation: Callable[..., Checkpointer]
                                                          ) -> None:
    _save(incarnation, {"model": {"lin.weight": torch.zeros(80, 96), "other": torch.ones(2)}}, 1)
    out = tmp_path / "s"
    export_checkpoint(run_dir, ExportRequest(fmt=CheckpointFormat.SAFETENSORS, out=out))
    fresh, _ = trained(2)
    with pytest.raises(CheckpointError, match=r"2 missing \(emb, lin.bias\); 1 unexpected "
                                              r"\(other\)"):
        load_init(out, {"model": fresh})
