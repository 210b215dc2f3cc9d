"""An FSDP2 model's checkpoint: hpcrun against torch.distributed.checkpoint (DCP), in one run,
for ``python -m benchmarks`` (``--only fsdp``) or alone (``python -m benchmarks.suite_fsdp
[--size-gib 1] [--world 4] [--repeats 3]``).

``--world`` rank processes on this machine form a gloo group; each builds the same model, a
stack of square ``Linear`` layers sharded with ``fully_shard`` (FSDP2, one DTensor ``Shard(0)``
per parameter), takes one AdamW step (so the optimizer holds two moments per parameter: the
state is about ``--size-gib`` in all, a quarter per rank at 4), and then, interleaved in every
repeat, the same state goes through:

- *hpcrun sync*: ``Checkpointer.save(blocking=True)`` on the ranks' checkpoint group, registered
  as a user registers it (``{"model": model, "optim": optim}``, no adapter): durable and
  committed when it returns;
- *hpcrun async*: ``save()`` returns after staging (the *pause* training sees), durable and
  committed at ``wait()``;
- *DCP*: ``dcp.save`` of ``get_state_dict(model, optim)`` with ``FileSystemWriter(sync_files=
  True)``, what a DCP user writes;
- *DCP async*: ``dcp.async_save`` on its own gloo group (returns after staging: its pause),
  durable at ``future.result()``;

then, after a page-cache drop, *hpcrun restore* (``Checkpointer.restore`` by a new reader into
the model and optimizer in place; its phase split, each phase the slowest rank's, is printed)
and *DCP load* (``dcp.load`` + ``set_state_dict``). Every figure
is the slowest rank's, between barriers; the restored state is checked bitwise against the
saved one once per repeat (an xxh3 digest of each rank's local shards).

Targets (issue: sharded models): durable write >= 1.5x DCP's rate, restore >= 1.2x DCP's,
hpcrun's async pause <= DCP async's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Samples, drop_caches, ratio, table, verdict
from hpcrun.testing.net import free_port

REPO = Path(__file__).resolve().parents[1]
WIDTH = 2048
"""Side of each square layer: 16 MiB of fp32 weights, sharded by rows."""
WRITE_TARGET, RESTORE_TARGET = 1.5, 1.2


def layers_for(size_gib: float) -> int:
    """Layers whose weights and two AdamW moments come to about ``size_gib``."""
    return max(1, round(size_gib * 2**30 / (3 * WIDTH * WIDTH * 4)))


# -- one rank (its own process) -----------------------------------------------------------------

class _Rank:
    """One rank's model, optimizer, groups and scratch directories."""

    def __init__(self, rank: int, world: int, layers: int, scratch: Path) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.rank, self.world, self.scratch = rank, world, scratch
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False)
                                           for _ in range(layers)])
        mesh = init_device_mesh("cpu", (world,))
        for layer in self.model:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.model(torch.randn(2, WIDTH)).square().mean().backward()
        self.optim.step()
        self.optim.zero_grad()
        self.ck_group = dist.new_group(backend="gloo")  # as a run's checkpoint group
        self.dcp_group = dist.new_group(backend="gloo")  # async_save's background collectives
        self.run_dir = scratch / "run"
        if rank == 0:
            (self.run_dir / "log").mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.step = 0

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.optim}

    def locals(self) -> list[Any]:
        """This rank's local shards of every model and optimizer tensor, in order."""
        import torch
        from torch.distributed.tensor import DTensor

        tensors = [*self.model.parameters(), *(v for s in self.optim.state.values()
                                               for v in s.values()
                                               if isinstance(v, torch.Tensor) and v.dim())]
        return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]

    def digest(self) -> str:
        """xxh3 of this rank's local shards, in order."""
        import torch
        import xxhash

        h = xxhash.xxh3_64()
        for local in self.locals():
            h.update(local.detach().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def perturb(self) -> None:
        """Overwrite the model and optimizer state (so a restore has all of it to bring back)."""
        import torch

        with torch.no_grad():
            for local in self.locals():
                local.fill_(0.5)

    def checkpointer(self, *, writer: bool) -> Any:
        import torch.distributed as dist

        from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
        from hpcrun.control.log import RunLog, new_holder

        log = RunLog(self.run_dir)
        box: list[Any] = [None]
        if self.rank == 0 and writer:
            holder = new_holder()
            fence = log.claim(holder)
            box = [(fence.generation, holder, fence.slot)]
        elif self.rank == 0:
            box = [(1, "reader", -1)]  # fence_slot -1: a reader that sees every commit
        dist.broadcast_object_list(box, src=0)
        gen, holder, slot = box[0]
        layout = Layout(rank=self.rank, world_size=self.world, node_rank=0,
                        local_rank=self.rank, num_nodes=1, node="n0")
        return Checkpointer(identity=CheckpointIdentity(run_id="bench", spec_id="bench",
                                                        generation=gen, holder=holder),
                            tiers=TierLayout(run_dir=self.run_dir), layout=layout, log=log,
                            fence_slot=slot, keep_last=2, group=self.ck_group)


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timed(fn: Any) -> tuple[float, Any]:
    """(the slowest rank's seconds between two barriers, this rank's result)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    took = time.perf_counter() - t0
    dist.barrier()
    return _slowest(took), out


def _dcp_dir(r: _Rank, name: str) -> Path:
    import torch.distributed as dist

    d = r.scratch / name
    if r.rank == 0:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    dist.barrier()
    return d


def _dcp_state(r: _Rank) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(r.model, r.optim)
    return {"model": msd, "optim": osd}


def _dcp_save(r: _Rank, s: Samples) -> None:
    import torch.distributed.checkpoint as dcp

    d = _dcp_dir(r, "dcp")
    took, _ = _timed(lambda: dcp.save(_dcp_state(r), storage_writer=dcp.FileSystemWriter(
        str(d), sync_files=True)))
    s.add("dcp.write_s", took)


def _timed_async(name: str, start: Any, finish: Any, s: Samples) -> Any:
    """An asynchronous save: ``start()`` returns after staging (the pause), ``finish(handle)``
    once durable; both the slowest rank's, between barriers, as ``<name>.pause_s`` and
    ``<name>.write_s``. Returns what ``finish`` returned."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    handle = start()
    pause = time.perf_counter() - t0
    out = finish(handle)
    durable = time.perf_counter() - t0
    dist.barrier()
    s.add(f"{name}.pause_s", _slowest(pause))
    s.add(f"{name}.write_s", _slowest(durable))
    return out


def _dcp_async(r: _Rank, s: Samples) -> None:
    import torch.distributed.checkpoint as dcp

    d = _dcp_dir(r, "dcp-async")
    _timed_async("dcp async", lambda: dcp.async_save(
        _dcp_state(r), storage_writer=dcp.FileSystemWriter(str(d), sync_files=True),
        process_group=r.dcp_group), lambda fut: fut.result(), s)


def _dcp_load(r: _Rank, s: Samples) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    def load() -> None:
        sd = _dcp_state(r)
        dcp.load(sd, storage_reader=dcp.FileSystemReader(str(r.scratch / "dcp")))
        set_state_dict(r.model, r.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])

    s.add("dcp.read_s", _timed(load)[0])


def _hpcrun_saves(r: _Rank, ck: Any, s: Samples) -> None:
    r.step += 1
    took, res = _timed(lambda: ck.save(r.step, r.state(), blocking=True))
    assert res is not None and res.committed, res
    s.add("hpcrun sync.write_s", took)
    r.step += 1
    res = _timed_async("hpcrun async", lambda: ck.save(r.step, r.state()),
                       lambda _: ck.wait(), s)
    assert res is not None and res.committed, res


def _cold(r: _Rank) -> str:
    import torch.distributed as dist

    how = drop_caches(r.scratch) if r.rank == 0 else ""
    dist.barrier()
    return how


def _hpcrun_restore(r: _Rank, saved: str, s: Samples) -> None:
    r.perturb()
    reader = r.checkpointer(writer=False)
    try:
        took, res = _timed(lambda: reader.restore(r.state()))
    finally:
        reader.close()
    assert res is not None and res.step == r.step, res
    assert r.digest() == saved, "hpcrun restore is not bitwise the saved state"
    s.add("hpcrun.read_s", took)
    for phase, v in res.phases.items():  # the slowest rank's split of its restore
        s.add(f"hpcrun.phase.{phase}", _slowest(float(v)))


def worker(rank: int, world: int, port: int, layers: int, repeats: int, scratch: Path,
           out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    r = _Rank(rank, world, layers, scratch)
    s, how = Samples(), ""
    ck = r.checkpointer(writer=True)
    local_bytes = torch.tensor([sum(t.numel() * t.element_size() for t in r.locals())],
                               dtype=torch.float64)
    dist.all_reduce(local_bytes)
    for _ in range(repeats):
        _hpcrun_saves(r, ck, s)
        saved = r.digest()
        _dcp_save(r, s)
        _dcp_async(r, s)
        how = _cold(r)
        _hpcrun_restore(r, saved, s)
        _cold(r)
        r.perturb()
        _dcp_load(r, s)
        assert r.digest() == saved, "DCP load is not bitwise the saved state"
    ck.close()
    if rank == 0:
        out.write_text(json.dumps({"samples": s.values, "cache_drop": how,
                                   "state_bytes": float(local_bytes.item()), "layers": layers}))
    dist.barrier()
    dist.destroy_process_group()


# -- the driver ---------------------------------------------------------------------------------

def run(size_gib: float = 1.0, world: int = 4, repeats: int = 3,
        base: Path = Path("/var/tmp")) -> dict[str, Any]:
    """Start the gang, collect rank 0's samples, return medians and ratios."""
    layers = layers_for(size_gib)
    with tempfile.TemporaryDirectory(prefix="hpcrun-bench-fsdp-", dir=base) as tmp:
        scratch, out = Path(tmp), Path(tmp) / "samples.json"
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        procs = [subprocess.Popen(
            [sys.executable, "-m", "benchmarks.suite_fsdp", "--worker", str(rank), str(world),
             str(port), str(layers), str(repeats), str(scratch), str(out)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]
        logs = [p.communicate(timeout=3600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a bench rank failed:\n" + "\n".join(logs)[-3000:])
        raw = json.loads(out.read_text())
    return summarize(raw, world=world, repeats=repeats)


def summarize(raw: dict[str, Any], *, world: int, repeats: int) -> dict[str, Any]:
    s = Samples(values=raw["samples"])
    med = s.medians()
    size = raw["state_bytes"]
    out: dict[str, Any] = {"state_bytes": size, "world": world, "repeats": repeats,
                           "layers": raw["layers"], "cache_drop": raw["cache_drop"],
                           "samples": s.values, "medians": med}
    out["write_vs_dcp"] = ratio(med.get("dcp.write_s"), med.get("hpcrun sync.write_s"))
    out["async_write_vs_dcp_async"] = ratio(med.get("dcp async.write_s"),
                                            med.get("hpcrun async.write_s"))
    out["restore_vs_dcp"] = ratio(med.get("dcp.read_s"), med.get("hpcrun.read_s"))
    out["pause_vs_dcp_async"] = ratio(med.get("hpcrun async.pause_s"),
                                      med.get("dcp async.pause_s"))
    return out


def render(r: dict[str, Any]) -> list[str]:
    title = "### FSDP2 checkpoint: hpcrun vs torch.distributed.checkpoint"
    if "medians" not in r:
        return [title, f"failed: {r.get('error')}", ""]
    med, size = r["medians"], r["state_bytes"]

    def row(name: str, key: str) -> list[Any]:
        sec = med.get(key)
        return [name, sec, size / sec / 1e9 if sec else None]

    rows = [row("hpcrun save(blocking=True): durable, committed", "hpcrun sync.write_s"),
            row("hpcrun save() → wait(): durable, committed", "hpcrun async.write_s"),
            row("DCP save (FileSystemWriter, sync_files)", "dcp.write_s"),
            row("DCP async_save → result()", "dcp async.write_s"),
            row("hpcrun restore (cold, new reader)", "hpcrun.read_s"),
            row("DCP load + set_state_dict (cold)", "dcp.read_s")]
    return [f"{title} ({size / 2**30:.2f} GiB of model and AdamW state, {r['world']} gloo "
            f"ranks, {r['layers']} layers of {WIDTH}², {r['repeats']} repeats; cold reads: "
            f"{r['cache_drop']})", "",
            *table(["path", "seconds (median, slowest rank)", "GB/s"], rows), "",
            f"- durable write: DCP / hpcrun sync ≥ {WRITE_TARGET}: {r['write_vs_dcp']:.2f}, "
            f"{verdict(r['write_vs_dcp'], WRITE_TARGET, at_least=True)} (async: DCP async / "
            f"hpcrun async {r['async_write_vs_dcp_async']:.2f})",
            f"- restore: DCP / hpcrun ≥ {RESTORE_TARGET}: {r['restore_vs_dcp']:.2f}, "
            f"{verdict(r['restore_vs_dcp'], RESTORE_TARGET, at_least=True)}",
            _split(med),
            f"- pause: hpcrun async {med['hpcrun async.pause_s']:.3f} s vs DCP async_save "
            f"{med['dcp async.pause_s']:.3f} s (≤ 1: {r['pause_vs_dcp_async']:.2f}, "
            f"{verdict(r['pause_vs_dcp_async'], 1.0, at_least=False)})", ""]


def _split(med: dict[str, float]) -> str:
    """The restore's phases (each the slowest rank's median): where its time went."""
    ph = {k.removeprefix("hpcrun.phase."): v for k, v in med.items()
          if k.startswith("hpcrun.phase.")}
    secs = ", ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in ph.items()
                     if k.endswith("_s"))
    return (f"- hpcrun restore split (slowest rank per phase): {secs}; "
            f"{ph.get('direct_bytes', 0) / 2**20:.0f} MiB O_DIRECT, "
            f"{ph.get('buffered_bytes', 0) / 2**20:.0f} MiB buffered")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        a = argv[1:]
        worker(int(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]), Path(a[5]), Path(a[6]))
        return
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_fsdp")
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    a = p.parse_args(argv)
    print("\n".join(render(run(a.size_gib, a.world, a.repeats, a.dir))))


if __name__ == "__main__":
    main()
