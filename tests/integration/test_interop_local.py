"""Checkpoints leave and enter hpcrun, on real runs of the local backend.

Run A (examples/tiny_lm, 2 nodes x 1 rank, DDP over gloo) is exported with ``hpcrun ckpt
export`` to safetensors and DCP; a Python that cannot import hpcrun (no site processing, the
project off ``sys.path``, cwd outside the repository) loads both with ``safetensors.torch`` and
``torch.distributed.checkpoint`` alone, bit-equal to A's checkpoint as hpcrun's offline reader
restores it; ``sha256sum -c`` passes. Runs B start from those exports (``checkpoint.init_from``):
B's step-0 checkpoint holds A's tensors; a preempted and requeued B restores its own commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcrun.checkpoint.tiers import fold_checkpoints
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from hpcrun.drill.states import CheckpointState, find_committed, load_state
from tests.integration.local_helpers import cli, local_spec, outcome, submit, valid_entries

SITE_PACKAGES = str(Path(torch.__file__).resolve().parents[1])

NO_HPCRUN = f"""
import sys
sys.path.append({SITE_PACKAGES!r})
try:
    import hpcrun
except ImportError:
    pass
else:
    raise SystemExit("hpcrun is importable here: " + hpcrun.__file__)
import json, torch
def entry(t):
    return [str(t.dtype), list(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes().hex()]
"""

LOAD_SAFETENSORS = NO_HPCRUN + """
from safetensors.torch import load_file
import os
out = sys.argv[1]
if os.path.exists(out + "/model.safetensors.index.json"):
    index = json.load(open(out + "/model.safetensors.index.json"))
else:  # small enough for one file: no index
    from safetensors import safe_open
    with safe_open(out + "/model.safetensors", "pt") as f:
        index = {"weight_map": {k: "model.safetensors" for k in f.keys()}}
got = {}
for name in sorted(set(index["weight_map"].values())):
    for key, t in load_file(out + "/" + name).items():
        assert index["weight_map"][key] == name, key
        got[key] = entry(t)
assert sorted(got) == sorted(index["weight_map"]), "index and files disagree"
json.dump(got, sys.stdout)
"""

LOAD_DCP = NO_HPCRUN + """
import torch.distributed.checkpoint as dcp
out, shapes = sys.argv[1], json.loads(sys.argv[2])
dtype = {"torch.float32": torch.float32}
def zeros(spec):
    return torch.zeros(spec[1], dtype=dtype[spec[0]])
state = {"model": {k: zeros(v) for k, v in shapes["model"].items()},
         "optim": {"state": {fqn: {k: zeros(v) for k, v in entry.items()}
                             for fqn, entry in shapes["optim"].items()}}}
dcp.load(state, checkpoint_id=out, no_dist=True)
flat = {"model." + k: t for k, t in state["model"].items()}
flat.update({f"optim.state.{fqn}.{k}": t for fqn, e in state["optim"]["state"].items()
             for k, t in e.items()})
json.dump({k: entry(t) for k, t in flat.items()}, sys.stdout)
"""


def _outside_python(script: str, *args: str, cwd: Path) -> Any:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _reference(state: CheckpointState) -> dict[str, list[Any]]:
    """A's tensors as hpcrun's offline reader restores them: logical key → [dtype, shape, hex]."""
    r0 = state.ranks[0]
    out = {}
    for key, raw in r0.tensors.items():
        dtype, shape = r0.shapes[key].split("[", 1)
        out[key] = [dtype, json.loads("[" + shape), raw.hex()]
    return out


def _param_order() -> list[str]:
    """The tiny model's parameter names in the optimizer's order (built here, independently)."""
    from examples.tiny_lm.model import GPTConfig, TinyGPT

    cfg = local_spec()["config"]
    model = TinyGPT(GPTConfig(vocab=cfg["vocab"], seq_len=cfg["seq_len"],
                              d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                              n_heads=cfg["n_heads"]))
    return [n for n, _ in model.named_parameters()]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("interop") / "runs"
    run = submit(root, local_spec(steps=12, every_steps=5))
    assert str(read_record(run).state) == "SUCCEEDED", outcome(run)
    return run


def test_safetensors_export_loads_without_hpcrun_bit_equal(run_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    done = cli(run_a.parent, "ckpt", "export", run_a.name, "--format", "safetensors", "-o",
               str(out), "--max-file-size", "40KiB", "--include", "optim")
    assert done.returncode == 0, done.stderr
    a = load_state(run_a, find_committed(run_a))
    got = _outside_python(LOAD_SAFETENSORS, str(out), cwd=tmp_path)
    want = {k.removeprefix("model/"): v for k, v in _reference(a).items()
            if k.startswith("model/")}
    assert len(want) == 16 and got == want
    files = sorted(p.name for p in out.iterdir())
    assert "model-00001-of-00003.safetensors" in files and "optimizer.safetensors.index.json" \
        in files, files
    record = json.loads((out / "hpcrun-export.json").read_text())
    assert (record["run_id"], record["step"], record["format"], record["schema_version"]) == \
        (run_a.name, 12, "safetensors", 1)
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0 and check.stdout.count(": OK") == len(files) - 1, check.stdout


def test_dcp_export_loads_without_hpcrun_bit_equal(run_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.dcp"
    done = cli(run_a.parent, "ckpt", "export", run_a.name[:-2], "--format", "dcp", "-o", str(out))
    assert done.returncode == 0, done.stderr
    want = _reference(load_state(run_a, find_committed(run_a)))
    names = _param_order()
    shapes: dict[str, Any] = {"model": {}, "optim": {}}
    expect = {}
    for key, (dtype, shape, data) in want.items():
        parts = key.split("/")
        if parts[0] == "model":
            shapes["model"][parts[1]] = [dtype, shape]
            expect[f"model.{parts[1]}"] = [dtype, shape, data]
        elif parts[:2] == ["optim", "state"]:
            fqn = names[int(parts[2])]
            shapes["optim"].setdefault(fqn, {})[parts[3]] = [dtype, shape]
            expect[f"optim.state.{fqn}.{parts[3]}"] = [dtype, shape, data]
    got = _outside_python(LOAD_DCP, str(out), json.dumps(shapes), cwd=tmp_path)
    assert len(expect) == 16 * 4 and got == expect
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0 and ".metadata: OK" in check.stdout, check.stdout


def test_export_refuses_what_it_should(run_a: Path, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    runs = run_a.parent
    taken = cli(runs, "ckpt", "export", run_a.name, "--format", "dcp", "-o", str(busy))
    assert taken.returncode != 0 and "exists and is not empty" in taken.stderr
    assert "--force" in taken.stderr and (busy / "keep.txt").read_text() == "mine"
    steps = [c.step for c in fold_checkpoints(RunLog(run_a).read()) if "shared" in c.tiers]
    nostep = cli(runs, "ckpt", "export", run_a.name, "--format", "dcp", "--step", "7")
    assert nostep.returncode != 0 and "no committed checkpoint at step 7" in nostep.stderr
    assert f"committed steps: {', '.join(map(str, steps))}" in nostep.stderr
    inside = cli(runs, "ckpt", "export", run_a.name, "--format", "dcp", "-o",
                 str(run_a / "ckpt" / "x"))
    assert inside.returncode != 0 and "inside the run's checkpoints" in inside.stderr
    forced = cli(runs, "ckpt", "export", run_a.name, "--format", "safetensors", "-o",
                 str(busy), "--force", "--step", "12")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in busy.iterdir()) == ["SHA256SUMS", "hpcrun-export.json",
                                                      "model.safetensors"]
    assert len(forced.stderr.strip().splitlines()) <= 1


def _init_notes(run: Path) -> list[Any]:
    return [e for e in valid_entries(run, "note") if e.payload.get("event") == "init_from"]


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_a_run_starts_from_an_export(run_a: Path, tmp_path: Path, fmt: str) -> None:
    """B (steps: 0) commits its initial state at step 0: A's model (and from DCP optimizer)."""
    out = tmp_path / f"a.{fmt}"
    assert cli(run_a.parent, "ckpt", "export", run_a.name, "--format", fmt, "-o",
               str(out)).returncode == 0
    source = out if fmt == "dcp" else out / "model.safetensors"
    run_b = submit(tmp_path / "runs", local_spec(steps=0, checkpoint={"init_from": str(source)},
                                                 config={"seed": 7}))
    assert str(read_record(run_b).state) == "SUCCEEDED", outcome(run_b)
    a = _reference(load_state(run_a, find_committed(run_a)))
    b = _reference(load_state(run_b, find_committed(run_b)))
    assert find_committed(run_b).step == 0
    family = ("model/", "optim/state/") if fmt == "dcp" else ("model/",)
    shared = [k for k in a if k.startswith(family)]
    assert len(shared) == (64 if fmt == "dcp" else 16)
    assert {k: b[k] for k in shared} == {k: a[k] for k in shared}
    notes = _init_notes(run_b)
    assert len(notes) == 1 and notes[0].payload["format"] == fmt
    assert notes[0].payload["digest"].startswith("sha256:")


def test_a_requeued_run_restores_its_own_checkpoint_not_the_init_source(
        run_a: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.dcp"
    assert cli(run_a.parent, "ckpt", "export", run_a.name, "--format", "dcp", "-o",
               str(out)).returncode == 0
    run_b = submit(tmp_path / "runs", local_spec(steps=16, every_steps=5,
                                                 checkpoint={"init_from": str(out)}),
                   inject="preempt@step=8")
    record = read_record(run_b)
    assert str(record.state) == "SUCCEEDED" and record.generation >= 2, outcome(run_b)
    notes = _init_notes(run_b)
    assert [n.generation for n in notes] == [1]
    running = [e for e in valid_entries(run_b, "state") if e.payload.get("state") == "RUNNING"]
    assert running[0].payload.get("restored_step") in (0, None)
    assert running[-1].generation >= 2 and running[-1].payload["restored_step"] >= 5
    assert find_committed(run_b).step == 16


def _fsdp_spec(parallel: str, ranks: int, steps: int, **overrides: Any) -> dict[str, Any]:
    return local_spec(entrypoint="examples.fsdp_lm.train:main", nodes=1, tasks_per_node=ranks,
                      steps=steps, every_steps=4, config={"parallel": parallel, **overrides.pop(
                          "config", {})}, **overrides)


def test_an_fsdp2_run_exports_whole_and_a_tp_run_starts_from_it(tmp_path: Path) -> None:
    """examples/fsdp_lm: FSDP2 over 2 ranks is exported (global tensors from its chunks) and
    loads outside hpcrun bit-equal; a TP x FSDP2 run on 4 ranks starts from its DCP export."""
    run_a = submit(tmp_path / "a", _fsdp_spec("fsdp", 2, 8))
    assert str(read_record(run_a).state) == "SUCCEEDED"
    st_out, dcp_out = tmp_path / "a.safetensors", tmp_path / "a.dcp"
    for fmt, out in (("safetensors", st_out), ("dcp", dcp_out)):
        done = cli(run_a.parent, "ckpt", "export", run_a.name, "--format", fmt, "-o", str(out))
        assert done.returncode == 0, done.stderr
    a = _reference(load_state(run_a, find_committed(run_a)))
    model = {k.removeprefix("model/"): v for k, v in a.items() if k.startswith("model/")}
    assert not (st_out / "model.safetensors.index.json").exists()
    assert _outside_python(LOAD_SAFETENSORS, str(st_out), cwd=tmp_path) == model
    run_b = submit(tmp_path / "b", _fsdp_spec("tp", 4, 0, config={"seed": 5},
                                              checkpoint={"init_from": str(dcp_out)}))
    assert str(read_record(run_b).state) == "SUCCEEDED"
    b = _reference(load_state(run_b, find_committed(run_b)))
    shared = [k for k in a if k.startswith(("model/", "optim/state/"))]
    assert len(shared) > len(model) and {k: b[k] for k in shared} == {k: a[k] for k in shared}
    assert [n.payload["format"] for n in _init_notes(run_b)] == ["dcp"]
