"""The device check: ``make gpu-check`` (``python -m benchmarks.gpu``) on a machine with a GPU.

Within about 8 minutes on one GPU it measures and writes down (``<out>/gpu-<date>.json`` and
``.md``, each target marked met or not):

1. **NCCL init** with ``device_id`` (eager communicator creation) and one all-reduce;
2. **the tiny example and the FSDP2 example on the GPU** (``examples/tiny_lm``,
   ``examples/fsdp_lm``: local backend, one rank on ``cuda:0``, deterministic algorithms on)
   for ``--steps`` steps each, once uninterrupted and once preempted and resumed: the final
   parameters (for FSDP2, the DTensor model and optimizer state) must be bitwise-identical;
3. **staging**: a ``--ckpt-gib`` checkpoint of CUDA bf16 tensors staged by hpcrun
   (:func:`hpcrun.checkpoint.stage.copy_staged`: pinned reused buffer, side stream, one
   event) against a plain pinned device-to-host copy of the same bytes (target: exposed pause
   <= 1.2x);
4. **restore to the device**: the same bytes landed in place by
   :class:`hpcrun.checkpoint.device.HostLanding` from pageable host memory, against a plain
   host-to-device copy from pinned memory (GB/s), and the peak extra GPU memory while landing
   (target: <= largest tensor + 1%).

Without CUDA it prints ``skipped: no CUDA`` and exits 0. The pure parts (arguments, the tensor
plan, the figures' Markdown) run in the unit tests.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

GIB = 1 << 30
MIB = 1 << 20
PAUSE_TARGET = 1.2
"""Most the hpcrun staging pause may take relative to a plain pinned device-to-host copy."""
PEAK_SLACK = 0.01
"""Peak extra GPU memory while restoring: at most the largest tensor plus this fraction."""
REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The check's options; ``--quick`` shrinks everything for a smoke run."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="tiny example steps per run")
    ap.add_argument("--preempt-at", type=int, default=80, help="step of the preemption")
    ap.add_argument("--ckpt-gib", type=float, default=4.0, help="checkpoint size in GiB")
    ap.add_argument("--tensor-mib", type=float, default=256.0,
                    help="size of each bf16 tensor in the checkpoint (the last is smaller)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.quick:
        args.steps, args.preempt_at = 20, 8
        args.ckpt_gib, args.tensor_mib, args.repeats = 0.0625, 16.0, 1
    if not 0 < args.preempt_at < args.steps:
        ap.error(f"--preempt-at must be inside 1..{args.steps - 1}, got {args.preempt_at}")
    return args


def plan_tensors(total_bytes: int, tensor_bytes: int, *, itemsize: int = 2,
                 row_elems: int = 4096) -> list[tuple[int, int]]:
    """Shapes ``(rows, row_elems)`` of bf16 tensors holding ``total_bytes`` in pieces of at
    most ``tensor_bytes`` (the last one smaller); every tensor at least one row."""
    row_bytes = row_elems * itemsize
    rows_total = max(1, math.ceil(total_bytes / row_bytes))
    rows_each = max(1, tensor_bytes // row_bytes)
    shapes = []
    while rows_total > 0:
        take = min(rows_each, rows_total)
        shapes.append((take, row_elems))
        rows_total -= take
    return shapes


def figures_markdown(results: Mapping[str, Any]) -> str:
    """The figures as Markdown, each target marked met / NOT met / n/a."""
    lines = [f"# GPU device check ({results.get('device', 'unknown device')})", ""]
    init = results.get("nccl_init", {})
    lines += [f"- NCCL init with device_id: {harness.fmt(init.get('init_s'))} s, all-reduce "
              f"{'correct' if init.get('allreduce_ok') else 'NOT correct'}"
              + (f" ({init['error']})" if "error" in init else "")]
    for example in EXAMPLES:
        run = results.get(example.replace("_lm", "_example"), {})
        same = run.get("bitwise_identical")
        lines += [f"- {example} on the GPU, {run.get('steps', '-')} steps, preempted at step "
                  f"{run.get('preempt_at', '-')} and resumed: final state "
                  + ("bitwise-identical (met)" if same else
                     f"differs (NOT met): {run.get('differences', run.get('error', '-'))}"
                     if same is False or "error" in run else "not measured (n/a)")]
    st, rs = results.get("staging", {}), results.get("restore", {})
    lines += ["", *harness.table(["figure", "hpcrun", "baseline", "ratio", "target", "verdict"], [
        ["exposed pause (s)", st.get("hpcrun_s"), st.get("pinned_copy_s"), st.get("ratio"),
         f"<= {PAUSE_TARGET}x", harness.verdict(st.get("ratio"), PAUSE_TARGET, at_least=False)],
        ["restore to device (GB/s)", rs.get("hpcrun_gbs"), rs.get("pinned_h2d_gbs"),
         harness.ratio(rs.get("hpcrun_gbs"), rs.get("pinned_h2d_gbs")), "reported", "-"],
        ["peak extra GPU memory (MiB)", _mib(rs.get("peak_extra_bytes")),
         _mib(rs.get("largest_tensor_bytes")), rs.get("peak_ratio"),
         f"<= largest tensor + {PEAK_SLACK:.0%}",
         harness.verdict(rs.get("peak_ratio"), 1 + PEAK_SLACK, at_least=False)],
    ])]
    for name in ("staging", "restore"):
        if "error" in results.get(name, {}):
            lines.append(f"- {name} failed: {results[name]['error']}")
    return "\n".join(lines)


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


# -- measurements (device-agnostic where they can be) -------------------------------------------

def make_state(shapes: Sequence[tuple[int, int]], device: Any) -> dict[str, Any]:
    """bf16 tensors of ``shapes`` on ``device``, filled deterministically."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    return {f"t{i:04d}": torch.randn(*s, device=device, generator=gen).to(torch.bfloat16)
            for i, s in enumerate(shapes)}


def measure_staging(state: Mapping[str, Any], repeats: int) -> dict[str, Any]:
    """hpcrun's staging pause against a plain pinned copy of the same bytes (medians)."""
    import torch

    from hpcrun.checkpoint.stage import (
        StageProgress,
        StagingBuffer,
        copy_staged,
        has_device,
        plan_pieces,
        prepare,
    )
    from hpcrun.checkpoint.state import flatten_state

    flat = flatten_state(dict(state))
    pieces = plan_pieces(flat, rank=0, world_size=1)
    buffer = StagingBuffer()
    cuda = any(t.is_cuda for t in state.values())
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in state.values()]
    samples = harness.Samples()

    def stage() -> None:  # what a save's staging does (its writer aside)
        staged = prepare(pieces, b"{}", buffer, device=has_device(flat, pieces))
        copy_staged(flat, staged, b"{}", buffer, StageProgress([sp.piece.nbytes for sp in staged]))

    stage()  # first save allocates and pins the buffer
    for _ in range(repeats):
        _sync(cuda)
        samples.add("hpcrun_s", harness.timed(stage))
        _sync(cuda)
        samples.add("pinned_copy_s", harness.timed(lambda: _plain_copy(pinned, state, cuda)))
    out = samples.medians()
    out["ratio"] = harness.ratio(out.get("hpcrun_s"), out.get("pinned_copy_s"))
    out["bytes"] = sum(t.numel() * t.element_size() for t in state.values())
    out["buffer_pinned"] = buffer.pinned
    return out


def _plain_copy(dst: Sequence[Any], state: Mapping[str, Any], cuda: bool) -> None:
    for d, s in zip(dst, state.values(), strict=True):
        d.copy_(s, non_blocking=cuda)
    _sync(cuda)


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def measure_restore(state: Mapping[str, Any], repeats: int) -> dict[str, Any]:
    """Landing host bytes into the tensors in place vs plain pinned H2D; peak extra memory."""
    import torch

    from hpcrun.checkpoint.device import HostLanding

    cuda = any(t.is_cuda for t in state.values())
    host = [t.cpu() for t in state.values()]  # pageable, as read from a shard
    pinned = [h.pin_memory() if cuda else h for h in host]
    landing = HostLanding()
    nbytes = sum(h.numel() * h.element_size() for h in host)
    samples = harness.Samples()
    peak = 0
    for _ in range(repeats):
        _sync(cuda)
        base = _reset_peak(cuda)
        dt = harness.timed(lambda: [landing.copy_into(t, h)
                                    for t, h in zip(state.values(), host, strict=True)])
        peak = max(peak, _peak(cuda) - base)
        samples.add("hpcrun_gbs", nbytes / dt / 1e9)
        samples.add("pinned_h2d_gbs", nbytes / harness.timed(
            lambda: _plain_copy(list(state.values()), dict(enumerate(pinned)), cuda)) / 1e9)
    same = all(torch.equal(t.cpu(), h) for t, h in zip(state.values(), host, strict=True))
    largest = max(h.numel() * h.element_size() for h in host)
    out: dict[str, Any] = samples.medians()
    out.update(bytes=nbytes, bitwise_identical=same, peak_extra_bytes=peak,
               largest_tensor_bytes=largest, peak_ratio=(peak / largest) if cuda else None)
    return out


def _reset_peak(cuda: bool) -> int:
    if not cuda:
        return 0
    import torch

    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _peak(cuda: bool) -> int:
    if not cuda:
        return 0
    import torch

    return int(torch.cuda.max_memory_allocated())


def measure_nccl_init() -> dict[str, Any]:
    """One-rank NCCL group formed with device_id, one all-reduce checked."""
    import torch
    import torch.distributed as dist

    from hpcrun.launch.dist import destroy_process_group, form_groups
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.gpu import GpuSettings
    from hpcrun.vocab import DistBackend

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the gloo groups beside NCCL: one host
    env = DistEnv.single(job_id=f"gpu-check-{os.getpid()}")
    t0 = time.perf_counter()
    groups = form_groups(env, GpuSettings(backend=DistBackend.NCCL))
    init_s = time.perf_counter() - t0
    try:
        t = torch.ones(1024, device=groups.device)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        return {"init_s": init_s, "allreduce_ok": bool(t.eq(1).all().item()),
                "device": str(groups.device), "backend": groups.backend}
    finally:
        destroy_process_group()


# -- the tiny example, twice --------------------------------------------------------------------

EXAMPLES = ("tiny_lm", "fsdp_lm")
"""The examples run on the GPU: the DDP-style tiny GPT, and the same under FSDP2 (DTensor
state saved, restored and compared through ``ctx`` with NCCL)."""


def _tiny_spec(manifest: Path, steps: int, example: str = "tiny_lm") -> dict[str, Any]:
    from hpcrun.testing.runs import tiny_spec

    spec = tiny_spec(manifest=manifest, site="gpu-check", nodes=1, tasks_per_node=1,
                     steps=steps, every_steps=25, data={"contract": "bitwise"},
                     config={"deterministic": True})
    spec["entrypoint"] = f"examples.{example}.train:main"
    if example == "fsdp_lm":
        spec["config"] = {**spec["config"], "parallel": "fsdp"}
    spec["resources"] = {**spec["resources"], "gpus_per_node": 1}
    spec["dist"] = {"backend": "nccl"}
    return spec


def _site_dir(root: Path) -> Path:
    import yaml

    sites = root / "sites"
    sites.mkdir(parents=True, exist_ok=True)
    site = yaml.safe_load((REPO / "site_configs" / "local.yaml").read_text())
    site.update(name="gpu-check", gpus_per_node=1, node_local_path=str(root / "node-local"))
    (sites / "gpu-check.yaml").write_text(yaml.safe_dump(site))
    return sites


def measure_tiny_example(steps: int, preempt_at: int, root: Path,
                         example: str = "tiny_lm") -> dict[str, Any]:
    """Uninterrupted vs preempted-and-resumed GPU runs of an example: same final state?"""
    from hpcrun.control.record import read_record
    from hpcrun.drill.states import diff_states, find_committed, load_state
    from hpcrun.testing.runs import hpcrun, run_dir_of, write_spec

    data = root / "data"
    subprocess.run([sys.executable, "-m", "examples.tiny_lm.prepare", str(data)], cwd=REPO,
                   check=True, capture_output=True, timeout=300)
    env = {"HPCRUN_SITE_CONFIGS": str(_site_dir(root)), "PYTHONPATH": str(REPO),
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HOME": str(root / "home")}
    spec = write_spec(root / "run.yaml", _tiny_spec(data / "manifest.json", steps, example))
    runs = {}
    for name, inject in (("reference", None), ("interrupted", f"preempt@step={preempt_at}")):
        t0 = time.perf_counter()
        out = hpcrun("submit", str(spec), "--backend", "local", "--wait",
                     *(["--inject", inject] if inject else []), cwd=REPO, timeout=240,
                     env={**env, "HPCRUN_RUNS": str(root / name)})
        if not out.stdout.strip():
            raise RuntimeError(f"{name} run did not start: {out.stderr[-500:]}")
        run = run_dir_of(root / name, out.stdout)
        record = read_record(run)
        runs[name] = (run, str(record.state), record.step, time.perf_counter() - t0)
    (ref, ref_state, ref_step, ref_s), (cut, cut_state, cut_step, cut_s) = runs.values()
    diffs = diff_states(load_state(ref, find_committed(ref)), load_state(cut, find_committed(cut)))
    return {"steps": steps, "preempt_at": preempt_at, "reference": [ref_state, ref_step, ref_s],
            "interrupted": [cut_state, cut_step, cut_s],
            "bitwise_identical": not diffs and ref_step == cut_step == steps,
            "differences": diffs[:5]}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the device check; 0 also when skipped for want of CUDA."""
    import torch

    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA (the device check needs a GPU; its CPU parts run in the unit "
              "tests)", flush=True)
        return 0
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                               "machine": harness.machine(), "args": _plain(vars(args))}
    with harness.section(results, "nccl_init") as out:
        out.update(measure_nccl_init())
    for example in EXAMPLES:
        with tempfile.TemporaryDirectory(prefix="hpcrun-gpu-check-") as tmp, \
                harness.section(results, example.replace("_lm", "_example")) as out:
            out.update(measure_tiny_example(args.steps, args.preempt_at, Path(tmp), example))
    shapes = plan_tensors(int(args.ckpt_gib * GIB), int(args.tensor_mib * MIB))
    state = make_state(shapes, torch.device("cuda", 0))
    with harness.section(results, "staging") as out:
        out.update(measure_staging(state, args.repeats))
    with harness.section(results, "restore") as out:
        out.update(measure_restore(state, args.repeats))
    markdown = figures_markdown(results)
    js, md = harness.write_results(results, markdown, args.out / "gpu")
    print(markdown, f"\nwritten: {js} {md}", sep="\n", flush=True)
    return 0


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
