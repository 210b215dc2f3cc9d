"""Run one drill: submit a spec at small scale with a fault, wait, check the contracts.

Effectful shell around the pure matrix and contract checks. A drill submits through the real
CLI (``python -m hpcrun.cli.main submit``) so it exercises exactly what a user runs; faults are
scheduled with ``HPCRUN_INJECT`` (rank crashes, checkpoint-stage kills, preemption, hang,
straggler, node crash on the local backend) or done from outside (cancel, node crash on the
testbed, a changed data object).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import FaultInjectedNote
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.drill.contracts import ContractResult, check_contracts, not_held
from hpcrun.drill.evidence import collect
from hpcrun.drill.matrix import DrillFault, MatrixRow, default_at, injection
from hpcrun.drill.rto import RtoSplit, rto_splits
from hpcrun.errors import HpcrunError, SpecError
from hpcrun.vocab import TERMINAL, Backend

HANG_S = 6.0
"""Hang threshold the drill sets (``HPCRUN_HANG_S``): detection in seconds, not minutes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DrillResult:
    """The outcome of one drill."""

    row: MatrixRow
    """The fault drilled."""
    backend: Backend
    """Where it ran."""
    run_dir: Path | None = None
    """The drilled run (None when the row was not run)."""
    inject: str = ""
    """The injection schedule used."""
    contracts: tuple[ContractResult, ...] = ()
    """Verdicts."""
    splits: tuple[RtoSplit, ...] = ()
    """Measured recoveries."""
    skipped: str = ""
    """Why the row was not run on this backend ("" when it ran)."""
    wall_s: float = 0.0
    """Wall time of the drill."""

    @property
    def ok(self) -> bool | None:
        """True when every applicable contract held; None when the row did not run."""
        if self.skipped:
            return None
        return not not_held(self.contracts, self.row)

    def contract(self, name: str) -> ContractResult | None:
        return next((c for c in self.contracts if c.name == name), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class DrillPlan:
    """What to submit for one drill (pure result of :func:`plan_drill`)."""

    spec: Mapping[str, Any]
    """The spec to submit (the user's, with the ledger on and the drill's adjustments)."""
    inject: str
    """``HPCRUN_INJECT`` schedule ("" for none)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the run."""
    at: int = 0
    """Step the fault is due at."""
    victim_rank: int = 0
    """Rank the fault targets."""


OUTSIDE = {DrillFault.CANCEL: frozenset({Backend.LOCAL, Backend.SLURM}), DrillFault.NODE_LOSS:
           frozenset({Backend.SLURM}), DrillFault.NODE_LOSS_SPARE: frozenset({Backend.SLURM}),
           DrillFault.NODE_LOSS_SUPERVISOR: frozenset({Backend.SLURM}),
           DrillFault.NODE_LOSS_PARTNER: frozenset({Backend.SLURM}),
           DrillFault.NODE_LOSS_SHRINK: frozenset({Backend.SLURM}),
           DrillFault.DATA_CHANGED: frozenset({Backend.LOCAL, Backend.SLURM})}
"""Faults the drill does from outside the run, per backend."""
CANCEL_PACE_S = 0.5
"""Seconds a step of rank 0 takes from the cancel row's fault step on: the drill polls the
record and cancels, which on a loaded machine takes seconds; an unpaced tiny run ends first."""


_WITH_SPARE = (DrillFault.NODE_LOSS_SPARE, DrillFault.NODE_LOSS_SUPERVISOR,
               DrillFault.NODE_LOSS_PARTNER, DrillFault.SHARED_FS_STALL)
"""Rows whose spec gets one hot spare (at least)."""


def drillable(row: MatrixRow, backend: Backend) -> str:
    """"" when this command can drill ``row`` on ``backend``, else why not (pure)."""
    if backend not in row.backends:
        return f"needs {'/'.join(sorted(row.backends))}"
    probe = injection(row, at=1, world_size=4, tasks_per_node=2)
    if not probe and backend not in OUTSIDE.get(row.fault, frozenset()):
        return "run by the Slurm integration suite (tests/integration/test_*_slurm.py)"
    return ""


def plan_drill(raw_spec: Mapping[str, Any], row: MatrixRow, *, at: int | None,
               backend: Backend = Backend.LOCAL) -> DrillPlan:
    """The spec, schedule and environment for drilling ``row`` on ``backend`` (pure)."""
    res = dict(raw_spec.get("resources") or {})
    nodes, tpn = int(res.get("nodes", 1)), int(res.get("tasks_per_node", 1))
    every = int((raw_spec.get("checkpoint") or {}).get("every_steps") or 10)
    step = default_at(every) if at is None else at
    if row.fault in (DrillFault.KILL_STAGING, DrillFault.KILL_SHARD_WRITE,
                     DrillFault.KILL_BEFORE_MANIFEST) and at is None:
        step = every + 1  # the second checkpoint: the first one is the restore point
    spec = dict(raw_spec)
    spec["config"] = {**dict(raw_spec.get("config") or {}), "ledger": True}
    if row.fault in _WITH_SPARE:
        spec["resources"] = {**res, "spare_nodes": max(1, int(res.get("spare_nodes", 0)))}
    if row.fault == DrillFault.NODE_LOSS_SHRINK:
        # no spare, an elastic gang one node smaller than asked: the loss shrinks it in place
        spec["resources"] = {**res, "spare_nodes": 0}
        spec["membership"] = {"mode": "elastic", "min_nodes": max(1, nodes - 1)}
    if row.fault == DrillFault.SDC:
        # Replica checks twice per checkpoint interval, the flip just after a check that makes
        # a commit known-good: the next check finds it and the run rolls back to that commit.
        check = max(1, every // 2)
        spec["sdc"] = {**dict(raw_spec.get("sdc") or {}), "every_steps": check}
        step = every + check + 2 if at is None else at
    env = {"HPCRUN_HANG_S": str(HANG_S)} if row.fault == DrillFault.HANG else {}
    victim = (0 if row.fault in (DrillFault.KILL_BEFORE_MANIFEST,
                                 DrillFault.NODE_LOSS_SUPERVISOR) else nodes * tpn - 1)
    inject = injection(row, at=step, world_size=nodes * tpn, tasks_per_node=tpn)
    if backend in OUTSIDE.get(row.fault, frozenset()):
        # done from outside (a real node crash on the testbed, a cancel); the cancel must find
        # the run still going, so from the fault step on rank 0 takes CANCEL_PACE_S a step
        inject = (f"slow@step={step},rank=0,seconds={CANCEL_PACE_S},every=1"
                  if row.fault == DrillFault.CANCEL else "")
    return DrillPlan(spec=spec, inject=inject, env=env, at=step, victim_rank=victim)


def load_raw_spec(path: Path) -> dict[str, Any]:
    """The spec file as a mapping, with a relative data manifest made absolute."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read run spec {path}: {exc}; pass a run.yaml") from exc
    if not isinstance(raw, dict):
        raise SpecError(f"{path} is not a run spec (expected a mapping, found "
                        f"{type(raw).__name__}); pass a run.yaml")
    data = dict(raw.get("data") or {})
    if isinstance(data.get("manifest"), str) and not Path(data["manifest"]).is_absolute():
        data["manifest"] = str((path.parent / data["manifest"]).resolve())
        raw["data"] = data
    return raw


def changed_data_manifest(manifest: Path, out_dir: Path) -> Path:
    """A copy of ``manifest`` in which one object's recorded digest no longer matches its file.

    The copy is self-consistent (its dataset id is recomputed), so what the run meets is exactly
    an object that changed after the manifest was built. The user's data is not touched.
    """
    import dataclasses

    from hpcrun.data.dataset import load_manifest

    original = load_manifest(manifest)  # a malformed manifest is one DataError line
    first = original.sources[0]
    obj = first.objects[0]
    algo = obj.digest.partition(":")[0]
    changed = dataclasses.replace(obj, digest=f"{algo}:{'0' * 32}")
    source = dataclasses.replace(first, objects=(changed, *first.objects[1:]))
    damaged = dataclasses.replace(original, sources=(source, *original.sources[1:]))
    out_dir.mkdir(parents=True, exist_ok=True)
    index = manifest.with_suffix(".index")
    if index.is_dir():
        shutil.copytree(index, out_dir / index.name, dirs_exist_ok=True)
    target = out_dir / manifest.name
    target.write_text(damaged.to_json())
    return target


def submit(spec_path: Path, *, backend: Backend, inject: str, env: Mapping[str, str],
           cwd: Path, extra_args: Sequence[str] = ()) -> str:
    """``hpcrun submit`` in a subprocess (``extra_args`` appended); return the run id."""
    argv = [sys.executable, "-m", "hpcrun.cli.main", "submit", str(spec_path),
            "--backend", backend.value, *extra_args]
    if inject:
        argv += ["--inject", inject]
    out = subprocess.run(argv, env={**os.environ, **env}, cwd=cwd, capture_output=True,
                         text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise HpcrunError(f"drill submit failed (exit {out.returncode}): "
                          f"{(out.stderr or out.stdout).strip()[-400:]}")
    return out.stdout.strip().split()[0]


def wait_terminal(run_dir: Path, *, timeout_s: float, clock: Clock = SYSTEM_CLOCK,
                  on_poll: Callable[[Any], None] | None = None) -> Any:
    """Poll the record until terminal (or ``timeout_s``); return the last record."""
    from hpcrun.control.record import read_record

    deadline = clock.monotonic() + timeout_s
    while True:
        record = read_record(run_dir)
        if record.state in TERMINAL or clock.monotonic() > deadline:
            return record
        if on_poll is not None:
            on_poll(record)
        clock.sleep(0.5)


def run_drill(spec_path: Path, row: MatrixRow, *, backend: Backend = Backend.LOCAL,
              at: int | None = None, timeout_s: float = 600.0, cwd: Path | None = None,
              rto_budget_s: float | None = None) -> DrillResult:
    """Drill ``row`` on ``backend``: submit, inject, wait, collect, check."""
    why = drillable(row, backend)
    if why:
        return DrillResult(row=row, backend=backend, skipped=why)
    t0 = time.monotonic()
    plan = plan_drill(load_raw_spec(spec_path), row, at=at, backend=backend)
    with tempfile.TemporaryDirectory(prefix="hpcrun-drill-") as tmp:
        spec = dict(plan.spec)
        extra: list[str] = []
        if row.fault == DrillFault.DATA_CHANGED:
            spec["data"] = {**dict(spec.get("data") or {}), "manifest": str(
                changed_data_manifest(Path(spec["data"]["manifest"]), Path(tmp) / "data"))}
            # The object changes after submit, as far as the run can tell: submit's own digest
            # check would refuse it before the run exists (docs/recovery.md).
            extra = ["--verify-data", "none"]
        path = Path(tmp) / "drill.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        run_id = submit(path, backend=backend, inject=plan.inject, env=plan.env,
                        cwd=cwd or Path.cwd(), extra_args=extra)
        run_dir = resolve_run(run_id)
        crashed: list[str] = []
        try:
            wait_terminal(run_dir, timeout_s=timeout_s, on_poll=_with_watch(
                _outside_action(row, run_dir, plan, backend, crashed), run_dir, backend))
        finally:
            boot_nodes(crashed)
    ev = collect(run_dir, victim_rank=plan.victim_rank)
    return DrillResult(row=row, backend=backend, run_dir=run_dir, inject=plan.inject,
                       contracts=tuple(check_contracts(ev, row, rto_budget_s=rto_budget_s)),
                       splits=tuple(rto_splits(ev.entries, ev.events)),
                       wall_s=time.monotonic() - t0)


def resolve_run(run_id: str) -> Path:
    from hpcrun.launch.runref import resolve_run_dir

    return resolve_run_dir(run_id, environ=os.environ)


def _outside_action(row: MatrixRow, run_dir: Path, plan: DrillPlan, backend: Backend,
                    crashed: list[str]) -> Callable[[Any], None] | None:
    """Faults done from outside the run, once its progress reaches the fault step (a crashed
    node's name goes to ``crashed``, for the caller to boot)."""
    done: list[bool] = []

    def cancel(record: Any) -> None:
        if not done and int(record.step) >= plan.at:
            done.append(True)
            subprocess.run([sys.executable, "-m", "hpcrun.cli.main", "cancel", str(run_dir)],
                           capture_output=True, timeout=120, check=False)

    def crash_node(record: Any) -> None:
        if not done and int(record.step) >= plan.at and record.membership:
            # the last gang node, or node rank 0 (the supervising node) for its own row
            node = str(record.membership[
                0 if row.fault == DrillFault.NODE_LOSS_SUPERVISOR else -1])
            if row.fault == DrillFault.NODE_LOSS_PARTNER:
                from hpcrun.drill.partner import hide_tier1, partner_ready

                if partner_ready(run_dir, node, strictly_newer=False) is None:
                    return  # its partner holds no copy as new as tier 1's yet
                hide_tier1(run_dir)
            done.append(True)
            crash_testbed_node(node)
            RunLog(run_dir).append_entry(FaultInjectedNote(
                fault=row.fault.value, node=node, step=int(record.step)),
                generation=UNFENCED, holder="")
            crashed.append(node)

    if row.fault == DrillFault.CANCEL:
        return cancel
    if row.fault in (DrillFault.NODE_LOSS, DrillFault.NODE_LOSS_SHRINK, *_WITH_SPARE) \
            and backend == Backend.SLURM:
        return crash_node
    return None


WATCH_EVERY_S = 10.0


def _with_watch(action: Callable[[Any], None] | None, run_dir: Path,
                backend: Backend) -> Callable[[Any], None] | None:
    """On Slurm, also run the login-node reconcile pass every 10 s, as cron would.

    A node lost before Slurm marks it down can make srun abort the whole step, and the job
    then ends FAILED instead of NODE_FAIL + requeue; recovering it is `hpcrun watch`'s job.
    """
    if backend != Backend.SLURM:
        return action
    from hpcrun.clock import SYSTEM_CLOCK
    from hpcrun.control.watch import watch_once
    from hpcrun.observe.postrun import post_run_publisher
    from hpcrun.runner import SubprocessRunner
    from hpcrun.scheduler.slurm import SlurmClient

    last = [time.monotonic()]
    on_end = post_run_publisher(clock=SYSTEM_CLOCK)

    def poll(record: Any) -> None:
        if action is not None:
            action(record)
        if time.monotonic() - last[0] >= WATCH_EVERY_S:
            last[0] = time.monotonic()
            watch_once(run_dir, SlurmClient(SubprocessRunner()), SYSTEM_CLOCK, on_end=on_end)

    return poll


def crash_testbed_node(node: str) -> None:
    """Power off ``node`` on the testbed; it stays off (as after a real power loss, Slurm
    marks it down) until :func:`boot_nodes`."""
    _testbed("crash", node)


def boot_nodes(nodes: list[str]) -> None:
    """Boot (and empty) ``nodes``, powered off by :func:`crash_testbed_node`."""
    while nodes:
        _testbed("boot", nodes.pop())


def _testbed(verb: str, node: str) -> None:
    subprocess.run([sys.executable, "-m", "hpcrun.cli.main", "testbed", verb, node],
                   capture_output=True, timeout=120, check=False)
