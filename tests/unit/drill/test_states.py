"""Comparing two checkpoints with state families left out (`hpcrun ckpt diff --ignore`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.cli.main import main
from hpcrun.control.log import RunLog, new_holder
from hpcrun.drill.states import (
    CheckpointState,
    RankState,
    check_families,
    diff_states,
    state_families,
)
from hpcrun.errors import ArgumentError


def _state(*, rng: int, optim: bytes, ckpt_id: str = "c") -> CheckpointState:
    rank = RankState(rank=0, tensors={"model/w": b"\x01\x02", "optim/state/0/exp_avg": optim},
                     shapes={"model/w": "uint8[2]", "optim/state/0/exp_avg": "uint8[1]"},
                     meta={"__rng__": {"torch": [rng]}, "data": {"batch": 3},
                           "model": {"w": {"__t__": "model/w"}}})
    return CheckpointState(ckpt_id=ckpt_id, step=3, saved_world_size=1, world_size=1,
                           ranks=(rank,))


def test_families_are_the_top_level_keys_and_rng() -> None:
    assert state_families([_state(rng=1, optim=b"\x00")]) == ["data", "model", "optim", "rng"]


def test_an_ignored_family_leaves_out_its_tensors_and_its_meta() -> None:
    a, b = _state(rng=1, optim=b"\x00", ckpt_id="a"), _state(rng=2, optim=b"\x09", ckpt_id="b")
    every = diff_states(a, b)
    assert any("meta 'rng' differs" in d for d in every)
    assert any("tensor 'optim/state/0/exp_avg' differs" in d for d in every)
    assert diff_states(a, b, ignore={"rng"}) == [
        "rank 0: tensor 'optim/state/0/exp_avg' differs (uint8[1] vs uint8[1])"]
    assert diff_states(a, b, ignore={"rng", "optim"}) == []


def test_an_unknown_family_is_refused_naming_the_ones_held() -> None:
    a = _state(rng=1, optim=b"\x00")
    check_families(["rng", "optim"], a, a)
    with pytest.raises(ArgumentError, match=r"--ignore cursor: no such state family.*"
                                            r"they hold data, model, optim, rng"):
        check_families(["cursor", "rng"], a, a)


def _commit(run_dir: Path, *, rng_seed: int) -> None:
    """One committed checkpoint at step 5: the same model, the RNG streams seeded apart."""
    (run_dir / "log").mkdir(parents=True)
    log = RunLog(run_dir)
    fence = log.claim(new_holder("test."))
    ckpt = Checkpointer(identity=CheckpointIdentity(run_id=run_dir.name, spec_id="s",
                                                    generation=fence.generation,
                                                    holder=fence.holder),
                        tiers=TierLayout(run_dir=run_dir), log=log,
                        layout=Layout(rank=0, world_size=1, node_rank=0, local_rank=0,
                                      num_nodes=1, node="n0"), fence_slot=fence.slot)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    torch.manual_seed(rng_seed)  # a script that never seeds: only the RNG streams differ
    assert ckpt.save(5, {"model": model}, blocking=True).committed
    ckpt.close()


def test_ckpt_diff_ignore_rng_by_run_id_says_identical_and_what_was_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    _commit(runs / "seedless-20261201-101500-aa11", rng_seed=1)
    _commit(runs / "seedless-20261201-101500-bb22", rng_seed=2)
    monkeypatch.setenv("HPCRUN_RUNS", str(runs))
    with pytest.raises(SystemExit) as differ:
        main(["ckpt", "diff", "seedless-20261201-101500-a",
              str(runs / "seedless-20261201-101500-bb22")])  # an id prefix and a path
    out = capsys.readouterr().out
    assert differ.value.code == 1 and "rank 0: meta 'rng' differs" in out
    assert "tensor" not in out and out.strip().endswith("1 differences")
    with pytest.raises(SystemExit) as same:
        main(["ckpt", "diff", "seedless-20261201-101500-a", "seedless-20261201-101500-b",
              "--ignore", "rng"])
    out = capsys.readouterr().out
    assert same.value.code == 0 and out.strip().endswith("identical (ignored: rng)")
    with pytest.raises(SystemExit) as typo:
        main(["ckpt", "diff", "seedless-20261201-101500-a", "seedless-20261201-101500-b",
              "--ignore", "rgn"])
    assert typo.value.code == 2
    assert "--ignore rgn: no such state family" in capsys.readouterr().err
