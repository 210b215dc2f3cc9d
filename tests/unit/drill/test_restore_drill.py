"""The restore drill and the offline checkpoint reader, on real checkpoints in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.control.log import RunLog, new_holder
from hpcrun.drill.restore import layouts, restore_drill
from hpcrun.drill.states import diff_states, find_committed, load_state
from hpcrun.errors import CheckpointError


class Cursor:
    """A stand-in data cursor: its position is what the next step consumes."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def state_dict(self) -> dict[str, object]:
        return {"state": {"position": {"batch": self.batch}}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.batch = state["state"]["position"]["batch"]  # type: ignore[index]


def _commit(run_dir: Path, steps: list[int], seed: int = 0) -> None:
    (run_dir / "log").mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir)
    fence = log.claim(new_holder("test."))
    ckpt = Checkpointer(identity=CheckpointIdentity(run_id=run_dir.name, spec_id="s",
                                                    generation=fence.generation,
                                                    holder=fence.holder),
                        tiers=TierLayout(run_dir=run_dir), log=log,
                        layout=Layout(rank=0, world_size=1, node_rank=0, local_rank=0,
                                      num_nodes=1, node="n0"),
                        fence_slot=fence.slot, keep_last=3)
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    for step in steps:
        with torch.no_grad():
            model.weight.add_(1.0)
        result = ckpt.save(step, {"model": model, "data": Cursor(step)}, blocking=True)
        assert result is not None and result.committed
    ckpt.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "drill-run"
    _commit(path, [5, 10])
    return path


def test_layouts_are_same_half_and_double() -> None:
    assert layouts(4) == [4, 2, 8] and layouts(1) == [1, 2] and layouts(3) == [3, 6]


def test_restore_drill_restores_latest_and_older_and_rejects_damage(run_dir: Path) -> None:
    checks = {c.name: c for c in restore_drill(run_dir)}
    for name in ("committed checkpoints", "latest verify", "latest → 1 ranks",
                 "latest → 2 ranks", "older verify", "older → 2 ranks",
                 "reject truncated manifest", "reject bit-flipped manifest",
                 "reject bit-flipped shard", "reject missing shard"):
        assert checks[name].ok is True, (name, checks[name].detail)
    assert "next batch 10" in checks["latest → 2 ranks"].detail
    assert "next batch 5" in checks["older → 2 ranks"].detail
    for name in ("reject truncated manifest", "reject bit-flipped shard"):
        assert "\n" not in checks[name].detail and checks[name].detail
    assert (run_dir / "ckpt").is_dir() and load_state(run_dir, find_committed(run_dir))


def test_run_without_commits_is_one_failed_check(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (check,) = restore_drill(tmp_path)
    assert check.ok is False and "none" in check.detail
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        find_committed(tmp_path)


def test_same_training_gives_no_diff_and_different_weights_are_named(tmp_path: Path) -> None:
    _commit(tmp_path / "a", [5], seed=1)
    _commit(tmp_path / "b", [5], seed=1)
    _commit(tmp_path / "c", [5], seed=2)
    a, b, c = (load_state(tmp_path / n, find_committed(tmp_path / n)) for n in "abc")
    assert diff_states(a, b) == []
    diffs = diff_states(a, c)
    assert diffs and all("rank 0" in d for d in diffs)
    assert any("model" in d and "differs" in d for d in diffs)
