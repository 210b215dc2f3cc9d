"""Export and init_from with DTensor state: an FSDP2 checkpoint written by a real gloo gang is
exported whole (global tensors assembled from its chunks) to safetensors and DCP, bit-equal to
the gang's ``full_tensor()``; gangs on other meshes (FSDP2 over 3 ranks, uneven; TP x FSDP2)
start from those exports and hold the same global tensors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrun.checkpoint.export import ExportRequest, export_checkpoint
from hpcrun.testing.net import free_port
from hpcrun.vocab import CheckpointFormat

ROOT = Path(__file__).resolve().parents[3]


def _gang(module: str, args: list[str], world: int) -> None:
    """``args`` with ``{rank}`` and ``{port}`` filled per rank."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", module, *(a.format(rank=r, port=port) for a in args)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(logs)[-4000:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An FSDP2 checkpoint of 2 ranks (step 2) and the gang's global tensors (saved.npz)."""
    base = tmp_path_factory.mktemp("dtensor-export")
    run, out = base / "run", base / "out"
    (run / "log").mkdir(parents=True)
    out.mkdir()
    _gang("tests.unit.checkpoint.dtensor_worker",
          ["save", "fsdp", "{rank}", "2", "{port}", str(run), str(out)], 2)
    return run, out


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_an_fsdp2_checkpoint_exports_whole_to_both_formats(saved: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    run, out = saved
    want = np.load(out / "saved.npz")
    st_out, dcp_out = tmp_path / "st", tmp_path / "dcp"
    export_checkpoint(run, ExportRequest(fmt=CheckpointFormat.SAFETENSORS, out=st_out,
                                         include_optim=True))
    model = load_file(st_out / "model.safetensors")
    optim = load_file(st_out / "optimizer.safetensors")
    assert sorted(model) == ["down.bias", "down.weight", "up.bias", "up.weight"]
    for key, t in model.items():
        assert _bits(t) == want[f"model/{key}"].tobytes(), key
    for key in ("up.weight", "down.bias"):
        for name in ("exp_avg", "exp_avg_sq"):
            assert _bits(optim[f"state.{key}.{name}"]) == \
                want[f"optim/state/{key}/{name}"].tobytes()
    export_checkpoint(run, ExportRequest(fmt=CheckpointFormat.DCP, out=dcp_out))
    zeros = {f: torch.zeros(want[f].shape, dtype=torch.float32) for f in want.files
             if not f.endswith("/step")}
    state = {"model": {k.split("/", 1)[1]: v for k, v in zeros.items()
                       if k.startswith("model/")},
             "optim": {"state": {}}}
    for key, v in zeros.items():
        if key.startswith("optim/state/"):
            fqn, name = key.removeprefix("optim/state/").rsplit("/", 1)
            state["optim"]["state"].setdefault(fqn, {})[name] = v
    dcp.load(state, checkpoint_id=str(dcp_out), no_dist=True)
    for key, v in zeros.items():
        assert _bits(v) == want[key].tobytes(), key
    assert len(zeros) == 12


@pytest.mark.parametrize(("fmt", "layout", "world"), [
    ("safetensors", "fsdp", 3),  # uneven: 14 rows over 3 ranks
    ("dcp", "tp", 4),            # (2, 2) mesh: TP over tp, FSDP2 over dp
])
def test_sharded_gangs_start_from_an_export(saved: tuple[Path, Path], tmp_path: Path,
                                            fmt: str, layout: str, world: int) -> None:
    run, out = saved
    dest = tmp_path / fmt
    export_checkpoint(run, ExportRequest(fmt=CheckpointFormat(fmt), out=dest))
    source = dest / "model.safetensors" if fmt == "safetensors" else dest
    _gang("tests.unit.checkpoint.initfrom_worker",
          [layout, "{rank}", str(world), "{port}", str(source), str(tmp_path), "init"], world)
    want, got = np.load(out / "saved.npz"), np.load(tmp_path / "init.npz")
    families = ("model/", "optim/") if fmt == "dcp" else ("model/",)
    keys = sorted(k for k in want.files if k.startswith(families))
    assert sorted(got.files) == keys and len(keys) == (16 if fmt == "dcp" else 4)
    for key in keys:
        assert got[key].tobytes() == want[key].tobytes(), key
