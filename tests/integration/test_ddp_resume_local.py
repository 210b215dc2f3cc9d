"""Offline A/B on 4 gloo ranks: a model restored at step k into a fresh DDP trains to the same
bits as the DDP that kept going, when wrapped with hpcrun's ``bitwise`` DDP arguments.

Run A trains N steps and snapshots its state at step k; run B builds a fresh model and a fresh
DDP, loads A's step-k snapshot and trains to N on the same batches. With torch's default DDP
arguments B's first step reduces with the constructor's bucket layout where A, past its first
step, uses the rebuilt one, and with 4 ranks the sums differ; ``ddp_kwargs(BITWISE, ...)`` keeps
one layout for the whole run, so every parameter and optimizer tensor is equal byte for byte.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from examples.tiny_lm.model import GPTConfig, TinyGPT
from hpcrun.integrations.ddp import ddp_kwargs
from hpcrun.testing.net import free_port
from hpcrun.vocab import ResumeContract

WORLD, STEPS, RESTORE_AT = 4, 4, 2


def _batch(step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, 64, (4, 17), generator=generator)


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab=64, seq_len=16, d_model=32, n_layers=2, n_heads=2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(net: torch.nn.Module, optim: torch.optim.Optimizer, start: int, stop: int) -> None:
    for step in range(start, stop):
        tokens = _batch(step, dist.get_rank())
        logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()


def _state_bytes(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, bytes]:
    out = {f"model/{k}": v.numpy().tobytes() for k, v in model.state_dict().items()}
    for i, s in optim.state_dict()["state"].items():
        out |= {f"optim/{i}/{k}": v.numpy().tobytes() for k, v in s.items()}
    return out


def _differing(kwargs: dict[str, Any]) -> list[str]:
    """Run A and B with DDP(**kwargs); the state keys whose bytes differ at step STEPS."""
    model, optim = _fresh()
    net = DistributedDataParallel(model, **kwargs)
    _train(net, optim, 0, RESTORE_AT)
    snap = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, snap)
    _train(net, optim, RESTORE_AT, STEPS)
    snap.seek(0)
    saved = torch.load(snap, weights_only=True)
    model_b, optim_b = _fresh()
    model_b.load_state_dict(saved["model"])
    optim_b.load_state_dict(saved["optim"])
    _train(DistributedDataParallel(model_b, **kwargs), optim_b, RESTORE_AT, STEPS)
    a, b = _state_bytes(model, optim), _state_bytes(model_b, optim_b)
    assert a.keys() == b.keys()
    return sorted(k for k in a if a[k] != b[k])


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    cpu = torch.device("cpu")
    result = {"default": _differing(ddp_kwargs(ResumeContract.EXACT_ORDER, cpu)),
              "bitwise": _differing(ddp_kwargs(ResumeContract.BITWISE, cpu))}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_a_ddp_restored_on_4_ranks_trains_to_the_same_bits(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=WORLD)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    # the control: torch's default layout parts the two runs (else this A/B proves nothing)
    assert all(r["default"] for r in results), results
    assert [r["bitwise"] for r in results] == [[]] * WORLD, results


def test_a_bitwise_run_with_a_hand_built_ddp_is_told_in_status(tmp_path: Path) -> None:
    from tests.integration.local_helpers import cli, local_spec, submit

    spec = local_spec(entrypoint="tests.integration.plain_ddp:main", steps=4, every_steps=2,
                      data={"contract": "bitwise"}, tasks_per_node=2)
    run = submit(tmp_path / "runs", spec)
    status = cli(tmp_path / "runs", "status", run.name, "--no-reconcile")
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stderr[-2000:]
    assert ("DistributedDataParallel in model rebuilds its gradient buckets"
            in status.stdout), status.stdout
