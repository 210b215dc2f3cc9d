"""Checkpoint write/restore throughput, side by side, on a Llama-shaped bf16 state.

    python -m benchmarks.ckpt_bench [--size-gib 1] [--dir /path/on/the/tier] [--json out.json]

Measures durable write GB/s (data on the medium: fsync included) and cold restore GB/s (page cache
dropped for the files first) for hpcrun, ``torch.save``/``torch.load``, torch.distributed.checkpoint
and safetensors, against the raw device limit (``fio``, O_DIRECT, queue depth 16; installed from
Debian packages when missing). Also the exposed pause of an hpcrun save against a warm-buffer
memcpy of the same bytes. ``--size-gib 4`` for the large run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
from hpcrun.control.log import RunLog, new_holder

GB = 1e9


def llama_state(size_gib: float, dim: int = 2048) -> dict[str, torch.Tensor]:
    """bf16 tensors shaped like a Llama model's (embedding, attention, MLP, norms) of ~size."""
    hidden = int(8 * dim / 3 + 255) // 256 * 256
    per_layer = (4 * dim * dim + 3 * dim * hidden + 2 * dim) * 2
    vocab = 32000
    layers = max(1, round((size_gib * 2**30 - 2 * vocab * dim * 2) / per_layer))
    g = torch.Generator().manual_seed(0)
    out = {"tok_embeddings.weight": torch.randn(vocab, dim, generator=g).bfloat16(),
           "output.weight": torch.randn(vocab, dim, generator=g).bfloat16()}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("wq", "wk", "wv", "wo"):
            out[p + f"attention.{name}.weight"] = torch.randn(dim, dim, generator=g).bfloat16()
        out[p + "feed_forward.w1.weight"] = torch.randn(hidden, dim, generator=g).bfloat16()
        out[p + "feed_forward.w2.weight"] = torch.randn(dim, hidden, generator=g).bfloat16()
        out[p + "feed_forward.w3.weight"] = torch.randn(hidden, dim, generator=g).bfloat16()
        out[p + "attention_norm.weight"] = torch.ones(dim).bfloat16()
        out[p + "ffn_norm.weight"] = torch.ones(dim).bfloat16()
    return out


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def drop_cache(root: Path) -> None:
    """Drop cached pages of every file under ``root`` (they are clean after fsync)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fsync_tree(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def scratch(base: Path, name: str) -> Iterator[Path]:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_hpcrun(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    (d / "log").mkdir()
    log = RunLog(d)
    holder = new_holder()
    fence = log.claim(holder)
    layout = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="n0")
    ck = Checkpointer(identity=CheckpointIdentity(run_id="bench", spec_id="bench",
                                                  generation=fence.generation, holder=holder),
                      tiers=TierLayout(run_dir=d), layout=layout, log=log,
                      fence_slot=fence.slot, keep_last=2)
    ck.save(0, {"model": state}, blocking=True)  # warms the staging buffer
    t0 = time.perf_counter()
    res = ck.save(1, {"model": state}, blocking=True)
    write = time.perf_counter() - t0
    ck.close()
    drop_cache(d)
    target = {"model": {k: torch.empty_like(v) for k, v in state.items()}}
    holder2 = new_holder()
    fence2 = log.claim(holder2)
    ck2 = Checkpointer(identity=CheckpointIdentity(run_id="bench", spec_id="bench",
                                                   generation=fence2.generation, holder=holder2),
                       tiers=TierLayout(run_dir=d), layout=layout, log=log,
                       fence_slot=fence2.slot)
    read = timed(lambda: ck2.restore(target))
    ck2.close()
    assert all(torch.equal(target["model"][k], v) for k, v in state.items())
    return {"write_s": write, "read_s": read, "pause_s": res.pause_s if res else float("nan")}


def bench_torch_save(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    path = d / "model.pt"

    def write() -> None:
        torch.save(state, path)
        fsync_tree(d)

    w = timed(write)
    drop_cache(d)
    r = timed(lambda: torch.load(path, weights_only=True))
    return {"write_s": w, "read_s": r}


def bench_dcp(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    def write() -> None:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d), thread_count=2,
                                                            sync_files=True))
        fsync_tree(d)

    w = timed(write)
    drop_cache(d)
    target = {k: torch.empty_like(v) for k, v in state.items()}
    r = timed(lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(str(d))))
    return {"write_s": w, "read_s": r}


def bench_safetensors(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    from safetensors.torch import load_file, save_file

    path = d / "model.safetensors"

    def write() -> None:
        save_file(state, str(path))
        fsync_tree(d)

    w = timed(write)
    drop_cache(d)
    r = timed(lambda: {k: v.clone() for k, v in load_file(str(path)).items()})
    return {"write_s": w, "read_s": r}


def warm_memcpy_s(state: dict[str, torch.Tensor]) -> float:
    """Seconds to copy ``state`` into already-faulted-in buffers (the floor for a pause)."""
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():
        dst[k].copy_(v)
    return timed(lambda: [dst[k].copy_(v) for k, v in state.items()])


def ensure_fio() -> str | None:
    if shutil.which("fio"):
        return shutil.which("fio")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["apt-get", "install", "-y", "-q", "fio"], check=False,
                       capture_output=True, timeout=240)
    return shutil.which("fio")


def fio_limit(d: Path, size_bytes: int) -> dict[str, float]:
    fio = ensure_fio()
    if fio is None:
        return {}
    out = {}
    for rw in ("write", "read"):
        proc = subprocess.run(
            [fio, "--name=raw", f"--rw={rw}", "--bs=4M", "--iodepth=16", "--ioengine=libaio",
             "--direct=1", f"--size={size_bytes}", f"--filename={d / 'fio.dat'}",
             "--end_fsync=1", "--output-format=json"], capture_output=True, text=True,
            check=False, timeout=300)
        if proc.returncode == 0:
            job = json.loads(proc.stdout)["jobs"][0][rw]
            out[rw] = job["bw_bytes"] / GB
    return out


def run(size_gib: float, base: Path) -> dict[str, Any]:
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    state = llama_state(size_gib)
    size = nbytes(state)
    rows: dict[str, dict[str, float]] = {}
    for name, fn in (("hpcrun", bench_hpcrun), ("torch.save", bench_torch_save),
                     ("dcp", bench_dcp), ("safetensors", bench_safetensors)):
        with scratch(base, name.replace(".", "_")) as d:
            r = fn(state, d)
            rows[name] = {"write_gbps": size / r["write_s"] / GB,
                          "read_gbps": size / r["read_s"] / GB,
                          **({"pause_s": r["pause_s"]} if "pause_s" in r else {})}
    with scratch(base, "fio") as d:
        raw = fio_limit(d, size)
    return {"bytes": size, "rows": rows, "raw": raw, "memcpy_s": warm_memcpy_s(state)}


def render(result: dict[str, Any]) -> str:
    raw = result["raw"]
    lines = [f"state: {result['bytes'] / 2**30:.2f} GiB bf16 (Llama-shaped)",
             "| method | durable write GB/s | cold restore GB/s |", "|---|---|---|"]
    if raw:
        lines.append(f"| raw O_DIRECT (fio, QD16) | {raw.get('write', 0):.2f} | "
                     f"{raw.get('read', 0):.2f} |")
    for name, r in result["rows"].items():
        lines.append(f"| {name} | {r['write_gbps']:.2f} | {r['read_gbps']:.2f} |")
    h = result["rows"]["hpcrun"]
    lines.append(f"exposed pause (hpcrun staging): {h['pause_s']:.3f} s; warm memcpy of the same "
                 f"bytes: {result['memcpy_s']:.3f} s; ratio {h['pause_s'] / result['memcpy_s']:.2f}"
                 " (target ≤ 1.5)")
    ts = result["rows"]["torch.save"]["write_gbps"]
    lines.append(f"hpcrun write / torch.save: {h['write_gbps'] / ts:.2f}x (target ≥ 2)")
    if raw:
        lines.append(f"hpcrun write / raw: {h['write_gbps'] / raw['write']:.2f} (target ≥ 0.8); "
                     f"restore / raw read: {h['read_gbps'] / raw['read']:.2f} (target ≥ 0.9)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=None, help="Directory on the tier to measure.")
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = ap.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="hpcrun-ckpt-bench-", dir="/var/tmp"))
    try:
        result = run(args.size_gib, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
