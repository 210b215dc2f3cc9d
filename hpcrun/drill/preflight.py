"""``hpcrun preflight`` and ``hpcrun canary``: what can fail early, checked before a long run.

Preflight checks the pieces in isolation on the machine it runs on (a login node, or a compute
node of the target allocation): a process group forms and an all-reduce completes, the links
between the spec's nodes carry an all-reduce at even bandwidth (:mod:`hpcrun.drill.linkcheck`,
the one check that starts ranks on those nodes: one per node, every pair measured, the slowest
pair named against the median), both storage tiers are writable (measured bandwidth, cold
reads), a checkpoint commits and restores bit for bit, telemetry is written, and the spec's own
entrypoint registers its state (every rank runs ``main(ctx)`` up to the end of ``ctx.restore``
on the local backend: a leaf hpcrun cannot save is refused there, before any step); first, the same
admission checks as ``hpcrun submit``
(:mod:`hpcrun.launch.admit`: spec, site, entrypoint importable, data manifest with every object
hashed, Slurm partition/account/QoS), one row per finding. On a GPU site, the node's GPUs are
checked too (:mod:`hpcrun.drill.gpu_health`: nvidia-smi health fields, Xids, a known-answer
matmul per GPU, an NCCL all-reduce's bus bandwidth). The canary runs the
spec itself for a few steps with one committed checkpoint, a stop and a restore, and checks the
sample and mixture accounting.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcrun.drill.contracts import ContractResult
from hpcrun.drill.linkcheck import ROW
from hpcrun.errors import HpcrunError
from hpcrun.vocab import Backend

Check = ContractResult
PROBE_BYTES = 32 << 20
"""Bytes written per tier for the bandwidth probe."""
_PG_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=os.environ["PF_INIT"], rank=int(os.environ["PF_RANK"]),
                        world_size=int(os.environ["PF_WORLD"]))
t = torch.ones(1)
dist.all_reduce(t)
assert int(t.item()) == dist.get_world_size(), t
dist.destroy_process_group()
"""


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except (HpcrunError, OSError, ValueError, subprocess.SubprocessError) as exc:
        return Check(name=name, ok=False, detail=f"{type(exc).__name__}: {exc}"[:200])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_group_check(world: int, *, timeout_s: float = 120.0) -> Check:
    """``world`` local processes form a gloo group and all-reduce once."""
    t0 = time.monotonic()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", _PG_SCRIPT], env={
        **os.environ, "PF_INIT": init, "PF_RANK": str(r), "PF_WORLD": str(world),
        "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for r in range(world)]
    outs = [p.communicate(timeout=timeout_s)[0].decode(errors="replace") for p in procs]
    failed = [(r, o) for r, (p, o) in enumerate(zip(procs, outs, strict=True)) if p.returncode]
    if failed:
        return Check(name="process group", ok=False, detail=f"rank {failed[0][0]} failed: "
                     f"{failed[0][1].strip().splitlines()[-1] if failed[0][1].strip() else ''}")
    return Check(name="process group", ok=True, detail=f"{world} ranks, gloo all-reduce ok in "
                 f"{time.monotonic() - t0:.1f} s (devices: "
                 f"{_devices()})")


def _devices() -> str:
    import torch

    return f"{torch.cuda.device_count()} cuda" if torch.cuda.is_available() else "cpu"


def storage_check(name: str, directory: Path, *, nbytes: int = PROBE_BYTES) -> Check:
    """Write ``nbytes`` durably under ``directory``, read them back cold; report MB/s."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".hpcrun-preflight-{os.getpid()}"
    chunk = os.urandom(1 << 20) * 4
    try:
        t0 = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(nbytes // len(chunk)):
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.monotonic() - t0
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a cached read proves nothing
            t0 = time.monotonic()
            while os.read(fd, 4 << 20):
                pass
            read_s = time.monotonic() - t0
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    mb = nbytes / 1e6
    return Check(name=name, ok=True, detail=f"{directory}: write {mb / write_s:.0f} MB/s "
                 f"(fsync'd), cold read {mb / max(read_s, 1e-6):.0f} MB/s")


def admission_rows(spec_path: Path, *, backend: Backend) -> tuple[list[Check], Any]:
    """The checks ``hpcrun submit`` runs (with every data object hashed), as rows, and the
    :class:`~hpcrun.launch.admit.Admission`. Storage rows are left to the measured tier checks.
    """
    import getpass
    import shutil

    from hpcrun.launch.admission import CheckKind, Passed, Problem, VerifyData
    from hpcrun.launch.admit import AdmissionRequest, admit
    from hpcrun.launch.codever import repo_root
    from hpcrun.runner import SubprocessRunner

    runner = SubprocessRunner()
    request = AdmissionRequest(
        spec_path=spec_path, code_path=repo_root(Path.cwd(), runner), python=sys.executable,
        user=getpass.getuser(), backend=backend, have_sbatch=shutil.which("sbatch") is not None,
        verify_data=VerifyData.ALL)
    result = admit(request, environ=os.environ, runner=runner)
    rows = [Check(name=str(f.check), detail=f.line().partition(": ")[2],
                  ok=True if isinstance(f, Passed) else False if isinstance(f, Problem) else None)
            for f in result.report.findings() if f.check is not CheckKind.STORAGE]
    return rows, result


def checkpoint_check(scratch: Path, *, spec_id: str = "preflight") -> Check:
    """A checkpoint commits through the real protocol and restores bit for bit."""
    import torch

    from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
    from hpcrun.control.log import RunLog, new_holder

    run_dir = scratch / "ckpt-roundtrip"
    (run_dir / "log").mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir)
    layout = Layout(rank=0, world_size=1, node_rank=0, local_rank=0, num_nodes=1, node="pf0")
    model = torch.nn.Linear(64, 64)

    def checkpointer() -> Any:
        fence = log.claim(new_holder("preflight."))
        ident = CheckpointIdentity(run_id=run_dir.name, spec_id=spec_id,
                                   generation=fence.generation, holder=fence.holder)
        return Checkpointer(identity=ident,
                            tiers=TierLayout(run_dir=run_dir, node_local_root=scratch / "local"),
                            layout=layout, log=log, fence_slot=fence.slot)

    t0 = time.monotonic()
    writer = checkpointer()
    saved = writer.save(1, {"model": model}, blocking=True)
    writer.close()
    other = torch.nn.Linear(64, 64)
    reader = checkpointer()
    restored = reader.restore({"model": other})
    reader.close()
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 other.state_dict().values(), strict=True))
    ok = bool(saved and saved.committed and restored and same)
    return Check(name="checkpoint round trip", ok=ok, detail=(
        f"commit + restore in {time.monotonic() - t0:.2f} s, bytes equal" if ok else
        f"committed={getattr(saved, 'committed', None)} restored={restored} equal={same}"))


def telemetry_check(scratch: Path) -> Check:
    """An event written by the run's event writer reads back."""
    from hpcrun.observe.events import EventWriter, read_event_file

    path = scratch / "events" / "rank-00000.jsonl"
    writer = EventWriter(path, run_id="preflight", generation=1, rank=0, node="pf0")
    writer.emit("step", 1, dur_s=0.1, tokens=1)
    writer.close()
    events = list(read_event_file(path))
    ok = len(events) == 1 and events[0].kind == "step"
    return Check(name="telemetry", ok=ok,
                 detail=f"{len(events)} event(s) read back from {path.name}")


def preflight(spec_path: Path, *, backend: Backend = Backend.LOCAL) -> list[Check]:
    """Every preflight check for the spec at ``spec_path``: the admission checks of ``hpcrun
    submit`` (every data object hashed), then the pieces that need to run."""
    from hpcrun.launch.site import expand_path

    rows, admitted = admission_rows(spec_path, backend=backend)
    spec, site = admitted.spec, admitted.site
    if spec is None or site is None:
        return rows
    world = spec.resources.nodes * spec.resources.tasks_per_node
    shared = admitted.runs_root or Path(site.shared_path)  # unexpandable: a problem row above

    def local() -> Path:
        return expand_path(site.node_local_path, {**os.environ, "SLURM_JOB_ID": "preflight"})

    with tempfile.TemporaryDirectory(prefix="hpcrun-preflight-") as tmp:
        scratch = Path(tmp)
        rows += [
            _guard("process group", lambda: process_group_check(min(world, 4))
                   if backend == Backend.LOCAL else Check(
                       name="process group", ok=None,
                       detail="formed across the nodes by the node links row; ranks per node: "
                       "`hpcrun canary --backend slurm`")),
            _guard(ROW, lambda: links_check(spec, site, backend=backend, admitted=rows)),
            _guard("shared tier", lambda: storage_check("shared tier", shared)),
            _guard("node-local tier", lambda: storage_check("node-local tier", local())),
            _guard("checkpoint round trip", lambda: checkpoint_check(scratch,
                                                                     spec_id=spec.spec_id)),
            _guard("telemetry", lambda: telemetry_check(scratch)),
            _guard(REGISTRATION_ROW, lambda: registration_check(spec_path, spec, site,
                                                                admitted=rows)),
        ]
    if site.gpus_per_node > 0:
        rows += gpu_checks()
    return rows


REGISTRATION_ROW = "state registration"
PROBE_MAX_RANKS = 16
"""Most ranks the registration probe starts on this machine."""


def registration_check(spec_path: Path, spec: Any, site: Any, *, admitted: list[Check],
                       timeout_s: float = 300.0) -> Check:
    """The spec's own entrypoint on every rank (local backend, this machine) up to the end of
    ``ctx.restore``: the state it registers can be checkpointed (a leaf type hpcrun cannot
    save is refused there, naming its path), an ``init_from`` loads, the SDC check starts;
    then each rank ends (``HPCRUN_PROBE``) before its first step. Not started when an
    ``admitted`` row failed (the run could not start)."""
    import torch

    world = spec.resources.nodes * spec.resources.tasks_per_node
    if any(c.ok is False for c in admitted):
        return Check(name=REGISTRATION_ROW, ok=None,
                     detail="not run: fix the failed rows above first")
    if spec.script_mode:
        return Check(name=REGISTRATION_ROW, ok=None,
                     detail="a script run registers no state with ctx.restore")
    if site.gpus_per_node > 0 and not torch.cuda.is_available():
        return Check(name=REGISTRATION_ROW, ok=None, detail=(
            "the ranks need GPUs this machine lacks; `hpcrun canary --backend slurm` runs the "
            "registration on the allocation"))
    if world > PROBE_MAX_RANKS:
        return Check(name=REGISTRATION_ROW, ok=None, detail=(
            f"{world} ranks are more than this machine starts at once ({PROBE_MAX_RANKS}); "
            "`hpcrun canary --backend slurm` runs the registration on the allocation"))
    return _probe(spec_path, world, timeout_s)


def _probe(spec_path: Path, world: int, timeout_s: float) -> Check:
    import yaml

    from hpcrun.control.log import EntryKind
    from hpcrun.drill.evidence import collect
    from hpcrun.drill.runner import load_raw_spec, submit, wait_terminal
    from hpcrun.observe.events import EventKind
    from hpcrun.runtime.incarnation import PROBE_ENV, PROBE_REGISTRATION

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpcrun-probe-") as tmp:
        path, runs = Path(tmp) / "probe.yaml", Path(tmp) / "runs"
        path.write_text(yaml.safe_dump(load_raw_spec(spec_path), sort_keys=False))
        run_dir = runs / submit(path, backend=Backend.LOCAL, inject="", cwd=Path.cwd(),
                                env={PROBE_ENV: PROBE_REGISTRATION, "HPCRUN_RUNS": str(runs)})
        wait_terminal(run_dir, timeout_s=timeout_s)
        ev = collect(run_dir)
    took = time.monotonic() - t0
    done = [e for e in ev.events if e.kind == EventKind.REGISTERED]
    if ev.state == "SUCCEEDED" and len({e.rank for e in done}) == world:
        families = ", ".join(done[0].data.get("families", []))
        return Check(name=REGISTRATION_ROW, ok=True, detail=(
            f"ctx.restore accepted {families or 'no state'} on all {world} ranks "
            f"({took:.0f} s, local backend)"))
    faults = [str(e.payload.get("detail", "")) for e in ev.entries
              if e.kind == EntryKind.FAULT and e.payload.get("detail")]
    why = (faults[-1] if faults else ev.reason or ev.state).strip().splitlines()[-1]
    return Check(name=REGISTRATION_ROW, ok=False, detail=(
        f"{ev.state} before ctx.restore returned on every rank: {why[:300]}"))


def links_check(spec: Any, site: Any, *, backend: Backend, admitted: list[Check]) -> Check:
    """The pairwise all-reduce bandwidth between the spec's nodes (:mod:`hpcrun.drill.linkcheck`):
    an ``srun`` step over the nodes on Slurm (not started when an ``admitted`` scheduler row
    failed: the allocation could not start), emulated nodes on the local backend."""
    import shutil

    from hpcrun.drill.linkcheck import local_link_check, slurm_link_check
    from hpcrun.runner import SubprocessRunner

    if backend == Backend.LOCAL:
        return local_link_check(spec.resources.nodes)
    if any(r.name == "scheduler" and r.ok is False for r in admitted):
        return Check(name=ROW, ok=None, detail="not started: a scheduler row above failed")
    if shutil.which("srun") is None:
        return Check(name=ROW, ok=None, detail="srun not found: run `hpcrun preflight --backend "
                     "slurm` where Slurm's clients are (a login node)")
    return slurm_link_check(spec, site, SubprocessRunner(), environ=os.environ)


_NCCL_SCRIPT = """
import os, time, torch, torch.distributed as dist
rank, world = int(os.environ["PF_RANK"]), int(os.environ["PF_WORLD"])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", init_method=os.environ["PF_INIT"], rank=rank, world_size=world,
                        device_id=dev)
t = torch.ones(int(os.environ["PF_ELEMS"]), device=dev)
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
if rank == 0:
    print((time.perf_counter() - t0) / 10)
dist.destroy_process_group()
"""


def gpu_checks(runner: Any = None) -> list[Check]:
    """This node's GPUs: nvidia-smi health and Xids, a known-answer matmul per GPU, an NCCL
    all-reduce across them (rows skipped, not failed, on a node without GPUs)."""
    import torch

    from hpcrun.drill.gpu_health import node_verdict, query_node
    from hpcrun.runner import SubprocessRunner

    node = socket.gethostname().split(".")[0]
    gpus, xids, note = query_node(runner or SubprocessRunner())
    if not gpus and not torch.cuda.is_available():
        return [Check(name="gpu health", ok=None, detail=f"no GPU visible on {node}: run "
                      "`hpcrun preflight` on a compute node of the site (srun -N1 --gpus ...)")]
    ok, line = node_verdict(node, gpus, xids)
    rows = [Check(name="gpu health", ok=ok, detail=f"{line}{'; ' + note if note else ''}")]
    rows.append(_guard("gpu matmul", lambda: matmul_rows(node)))
    rows.append(_guard("nccl all-reduce", lambda: nccl_bandwidth_check(node)))
    return rows


def matmul_rows(node: str) -> Check:
    """A known-answer matmul on every visible GPU; a wrong answer names the GPU and node."""
    import torch

    from hpcrun.drill.gpu_health import matmul_check

    count = torch.cuda.device_count()
    wrong = {i: n for i in range(count) if (n := matmul_check(torch.device("cuda", i)))}
    if wrong:
        listed = ", ".join(f"GPU{i}: {n} wrong entries" for i, n in sorted(wrong.items()))
        return Check(name="gpu matmul", ok=False, detail=f"node {node}: {listed}; quarantine "
                     f"it (add {node} to resources.exclude)")
    return Check(name="gpu matmul", ok=True, detail=f"node {node}: {count} GPU(s) computed the "
                 "known answer exactly")


def nccl_bandwidth_check(node: str, *, nbytes: int = 256 << 20,
                         timeout_s: float = 300.0) -> Check:
    """One NCCL all-reduce group over this node's GPUs; report its bus bandwidth."""
    import torch

    from hpcrun.drill.gpu_health import bus_bandwidth_gbs

    world = torch.cuda.device_count()
    if world < 2:
        return Check(name="nccl all-reduce", ok=None, detail=f"node {node} has {world} GPU; "
                     "an all-reduce needs 2 or more")
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", _NCCL_SCRIPT], env={
        **os.environ, "PF_INIT": init, "PF_RANK": str(r), "PF_WORLD": str(world),
        "PF_ELEMS": str(nbytes // 4)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for r in range(world)]
    outs = [p.communicate(timeout=timeout_s)[0].decode(errors="replace") for p in procs]
    failed = [r for r, p in enumerate(procs) if p.returncode]
    if failed:
        last = outs[failed[0]].strip().splitlines()[-1:] or [""]
        return Check(name="nccl all-reduce", ok=False, detail=f"node {node}: rank {failed[0]} "
                     f"failed ({last[0][:120]}); quarantine it (add {node} to resources.exclude)")
    seconds = float(outs[0].strip().splitlines()[-1])
    return Check(name="nccl all-reduce", ok=True, detail=f"node {node}: {world} GPUs, "
                 f"{bus_bandwidth_gbs(nbytes, seconds, world):.1f} GB/s bus bandwidth "
                 f"({nbytes >> 20} MiB)")


def mixture_error(meta: Any) -> float | None:
    """Largest |realized − weight × draws| of the exact mixture in a cursor (pure); None when
    the cursor holds no mixture."""
    from hpcrun.drill.restore import cursor_position

    pos = cursor_position(meta)
    data = meta.get("data") if isinstance(meta, dict) else None
    layout = (data or {}).get("state", {}).get("layout", {}) if isinstance(data, dict) else {}
    mix = pos.get("mixture") if isinstance(pos, dict) else None
    weights = layout.get("mixture", {}).get("weights") if isinstance(layout, dict) else None
    if not isinstance(mix, dict) or not isinstance(weights, list):
        return None
    draws, counts = int(mix.get("draw", 0)), list(mix.get("counts", []))
    total = sum(weights) or 1.0
    return max(abs(c - w / total * draws) for c, w in zip(counts, weights, strict=False))


def canary_plan(raw: dict[str, Any], steps: int | None) -> tuple[dict[str, Any], str, int]:
    """The canary's spec, injection and step count (pure): a checkpoint every ``k`` steps, a
    preemption right after the first one (stop commit, requeue, restore), ``2k + 2`` steps
    (at least ``k + 6``, so the stop lands before the end)."""
    every = int((raw.get("checkpoint") or {}).get("every_steps") or 5)
    total = max(steps or 2 * every + 2, every + 6)
    spec = dict(raw)
    spec["config"] = {**dict(raw.get("config") or {}), "ledger": True, "steps": total}
    spec["checkpoint"] = {**dict(raw.get("checkpoint") or {}), "cadence": "every_steps",
                          "every_steps": every}
    # Steps may take milliseconds: rank 0 is slowed after the signal so the stop lands in time.
    return spec, f"preempt@step={every + 1};slow@step={every + 1},rank=0,seconds=0.5", total


def canary(spec_path: Path, *, backend: Backend = Backend.LOCAL, steps: int | None = None,
           timeout_s: float = 600.0) -> list[Check]:
    """Run the spec for a few steps with a commit, a stop and a restore; check the accounting."""
    import yaml

    from hpcrun.drill.runner import load_raw_spec, resolve_run, submit, wait_terminal

    spec, inject, total = canary_plan(load_raw_spec(spec_path), steps)
    with tempfile.TemporaryDirectory(prefix="hpcrun-canary-") as tmp:
        path = Path(tmp) / "canary.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        run_dir = resolve_run(submit(path, backend=backend, inject=inject, env={},
                                  cwd=Path.cwd()))
        wait_terminal(run_dir, timeout_s=timeout_s)
    return canary_checks(run_dir, total=total)


def canary_checks(run_dir: Path, *, total: int) -> list[Check]:
    """The canary's verdicts over the run it left behind."""
    from hpcrun.control.entries import CommitPayload, EntryKind, decode_as
    from hpcrun.drill.evidence import collect
    from hpcrun.drill.ledger import check_ledger
    from hpcrun.drill.rto import rto_splits
    from hpcrun.drill.states import find_committed, load_state
    from hpcrun.observe.stragglers import step_times_from_events

    ev = collect(run_dir)
    times, _ = step_times_from_events(ev.events)
    flat = sorted(t for ts in times.values() for t in ts)
    median = flat[len(flat) // 2] if flat else float("nan")
    commits = [decode_as(e, CommitPayload) for e in ev.entries if e.kind == EntryKind.COMMIT]
    splits = rto_splits(ev.entries, ev.events)
    out = [
        Check(name="steps", ok=ev.state == "SUCCEEDED",
              detail=f"{ev.state} after {total} steps; median step {median * 1000:.0f} ms over "
                     f"{len(times)} ranks ({run_dir.name})"),
        Check(name="checkpoint commit", ok=bool(commits),
              detail=f"{len({c.ckpt_id for c in commits})} committed"),
        Check(name="restore", ok=bool(splits) and all(s.steps_lost == 0 for s in splits),
              detail=(f"restored step {splits[0].restored_step} after the stop; RTO "
                      f"{splits[0].total_s:.1f} s ({splits[0].row()})") if splits
              else "no restore happened"),
    ]
    if ev.ledger is not None:
        rep = check_ledger(ev.ledger, total_steps=total, malformed=ev.ledger_malformed)
        out.append(Check(name="samples", ok=rep.ok, detail=rep.summary()))
    err = None
    try:
        err = mixture_error(load_state(run_dir, find_committed(run_dir)).ranks[0].meta)
    except (HpcrunError, OSError) as exc:
        out.append(Check(name="mixture accounting", ok=False, detail=str(exc)[:160]))
    else:
        out.append(Check(name="mixture accounting", ok=None if err is None else err < 1.0,
                         detail="no mixture in the cursor" if err is None else
                         f"max |realized − weight·draws| = {err:.2f} (< 1 for exact quotas)"))
    return out
