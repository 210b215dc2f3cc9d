"""Fixtures: a run directory with a log, incarnations (fences) and single-rank checkpointers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.control.log import RunLog, new_holder

SINGLE = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="node0")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    (d / "log").mkdir(parents=True)
    return d


@pytest.fixture
def log(run_dir: Path) -> RunLog:
    return RunLog(run_dir)


@pytest.fixture
def incarnation(run_dir: Path, log: RunLog) -> Callable[..., Checkpointer]:
    """Claim a new generation and return a single-rank Checkpointer for it."""
    made: list[Checkpointer] = []

    def make(**kw: Any) -> Checkpointer:
        holder = new_holder()
        fence = log.claim(holder)
        tiers = TierLayout(run_dir=run_dir, node_local_root=kw.pop("node_local_root", None))
        ident = CheckpointIdentity(run_id="run1", spec_id="spec1", dataset_id="ds1",
                                   generation=fence.generation, holder=holder)
        ck = Checkpointer(identity=ident, tiers=tiers, layout=kw.pop("layout", SINGLE), log=log,
                          fence_slot=fence.slot, **kw)
        made.append(ck)
        return ck

    yield make
    for ck in made:
        ck.close()


class Model(torch.nn.Module):
    """A tiny model with fp32 and bf16 parameters."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = torch.nn.Linear(96, 80)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(80, 96, generator=g))
            self.lin.bias.copy_(torch.randn(80, generator=g))
        self.emb = torch.nn.Parameter(torch.randn(300, 64, generator=g).to(torch.bfloat16))


def trained(seed: int) -> tuple[Model, torch.optim.Optimizer]:
    """A model and an optimizer that has taken one step (so it has state)."""
    model = Model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    (model.lin(torch.ones(2, 96)).sum() + model.emb.float().sum()).backward()
    opt.step()
    return model, opt


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Deep equality of state dicts holding tensors (dtype and bits)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
