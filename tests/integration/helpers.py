"""Helpers for whole hpcrun runs on the Slurm testbed: data, specs, submission, log reads.

A :class:`RunFactory` submits runs through the real CLI (``python -m hpcrun.cli.main``) with the
testbed's client environment and a per-test runs root under the shared directory (the only path
every emulated node sees), and cancels whatever is still live when the test ends, so a failing
test never leaves a gang on the shared testbed.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrun.control.fencing import fold_fences
from hpcrun.control.log import EntryKind, LogEntry, RunLog
from hpcrun.control.record import RunRecord, read_record
from hpcrun.scheduler.slurm import parse_scontrol_show_job
from hpcrun.testbed import JobClient, Testbed
from hpcrun.testing.runs import hpcrun, tiny_spec, write_spec
from hpcrun.vocab import TERMINAL

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout under test: the CLI runs here so ``examples.tiny_lm.train`` imports."""

QUEUE_WAIT_S = 180.0
"""Extra seconds a run may wait for nodes: other tests may be using the shared testbed."""

_DATA: dict[Path, Path] = {}


def tiny_manifest(testbed: Testbed) -> Path:
    """The tiny_lm dataset's manifest, prepared once per session under the shared directory."""
    shared = testbed.shared_dir
    if shared not in _DATA:
        data = shared / "tests" / f"tiny-data-{uuid.uuid4().hex[:8]}"
        done = subprocess.run(
            [_python(), "-m", "examples.tiny_lm.prepare", str(data)], cwd=REPO_ROOT,
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"examples.tiny_lm.prepare failed: {done.stderr}"
        _DATA[shared] = data / "manifest.json"
    return _DATA[shared]


def _python() -> str:
    import sys

    return sys.executable


def paced(seconds: float, ranks: int) -> str:
    """Every rank sleeps ``seconds`` per step in every incarnation (keeps the run observable)."""
    return ";".join(f"slow@step=1,rank={r},seconds={seconds},every=1" for r in range(ranks))


def slurm_spec(testbed: Testbed, **overrides: Any) -> dict[str, Any]:
    """A tiny 2 nodes x 2 ranks spec on site ``testbed`` (``tiny_spec`` keywords override)."""
    return tiny_spec(manifest=tiny_manifest(testbed), **{"site": "testbed", **overrides})


@dataclass(kw_only=True)
class TestbedRun:
    """One run submitted to the testbed, and ways to look at it."""

    __test__ = False  # not a test class, whatever its name

    run_dir: Path
    """The run directory (under the test's runs root)."""
    job_id: str
    """The first Slurm job id."""
    env: dict[str, str]
    """Environment the CLI runs with (testbed client env, ``HPCRUN_RUNS``)."""
    submitted_at: float = field(default_factory=time.time)
    """Wall-clock time the submission returned."""

    @property
    def name(self) -> str:
        return self.run_dir.name

    def record(self) -> RunRecord:
        return read_record(self.run_dir, write_snapshot=False)

    def entries(self) -> list[LogEntry]:
        """Every log entry, void ones included, in slot order."""
        return RunLog(self.run_dir).read()

    def valid(self, kind: str | None = None) -> list[LogEntry]:
        """Entries that count under the fence in force at their slot, optionally of one kind."""
        _, valid = fold_fences(self.entries())
        return [e for e in valid if kind is None or e.kind == kind]

    def states(self) -> list[tuple[str, LogEntry]]:
        """The valid state entries as ``(state, entry)``, oldest first."""
        return [(str(e.payload.get("state")), e) for e in self.valid(EntryKind.STATE)]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return hpcrun(*args, env=self.env, cwd=REPO_ROOT, timeout=timeout)

    def wait(self, states: Iterable[str], *, timeout: float) -> RunRecord:
        """Poll until the record's state is one of ``states``; fail fast on another terminal."""
        wanted = set(states)
        deadline = time.monotonic() + timeout + QUEUE_WAIT_S
        while True:
            rec = self.record()
            if str(rec.state) in wanted:
                return rec
            assert rec.state not in TERMINAL, (
                f"run {self.name} ended {rec.state} ({(rec.state_info or {}).get('reason')}), "
                f"wanted {sorted(wanted)}; faults: {[f.detail for f in rec.faults]}")
            assert time.monotonic() < deadline, (
                f"run {self.name} is {rec.state} at step {rec.step} after {timeout:.0f} s "
                f"(+{QUEUE_WAIT_S:.0f} s queue allowance); wanted {sorted(wanted)}")
            time.sleep(0.5)

    def shown_manifest(self, state: str, *, timeout: float = 30) -> dict[str, Any]:
        """``hpcrun show --manifest`` once the ending published it; checks its state, run and
        generation (the fence that ended the run)."""
        import json

        def shown() -> subprocess.CompletedProcess[str] | None:
            out = self.cli("show", self.name, "--manifest")
            return out if out.returncode == 0 else None

        out = wait_until(f"the post-run manifest of {self.name}", shown, timeout=timeout)
        manifest: dict[str, Any] = json.loads(out.stdout)
        assert (manifest["terminal_state"], manifest["run_id"]) == (state, self.name)
        assert manifest["generation"] == self.record().generation
        return manifest

    def wait_for(self, what: str, predicate: Callable[[], Any], *, timeout: float) -> Any:
        """Poll ``predicate`` until it returns something truthy; return that."""
        return wait_until(what, predicate, timeout=timeout + QUEUE_WAIT_S)

    def rank_events(self, kind: str) -> list[dict[str, Any]]:
        """Every rank event of ``kind`` (from the node streams under ``events/``), in file
        order (each rank's events in the order it wrote them)."""
        import json

        from hpcrun.observe.events import read_events

        return [json.loads(e.to_json()) for e in read_events(self.run_dir)
                if e.kind == kind and e.rank >= 0]


def wait_until(what: str, predicate: Callable[[], Any], *, timeout: float,
               poll_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(poll_s)


class RunFactory:
    """Submits runs for one test and cancels those still live at its end."""

    def __init__(self, testbed: Testbed, runs_root: Path,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.testbed = testbed
        self.runs_root = runs_root
        self.env = {**testbed.env, "HPCRUN_RUNS": str(runs_root), **(extra_env or {})}
        self.runs: list[TestbedRun] = []

    def write(self, spec: Mapping[str, Any], name: str = "run.yaml") -> Path:
        return write_spec(self.runs_root / name, spec)

    def submit(self, spec: Mapping[str, Any], *, inject: str | None = None,
               env: Mapping[str, str] | None = None, name: str = "run.yaml",
               extra: Sequence[str] = ()) -> TestbedRun:
        """``hpcrun submit run.yaml [--inject] [extra...]`` (the submitit path)."""
        args = ["submit", str(self.write(spec, name)), *extra] + (
            ["--inject", inject] if inject else [])
        full_env = {**self.env, **(env or {})}
        done = hpcrun(*args, env=full_env, cwd=REPO_ROOT, timeout=180)
        assert done.returncode == 0, f"hpcrun submit failed: {done.stderr}"
        match = re.search(r"\(slurm job (\d+)\)", done.stdout)
        assert match, f"hpcrun submit printed no job id: {done.stdout!r}"
        run_id = done.stdout.split()[0]
        return self._track(TestbedRun(run_dir=self.runs_root / run_id, job_id=match.group(1),
                                      env=full_env))

    def sbatch(self, spec: Mapping[str, Any], slurm: JobClient, *,
               submit: bool = True) -> TestbedRun:
        """``hpcrun sbatch run.yaml > job.sh; sbatch job.sh`` (the plain path).

        With ``submit=False`` only the run and its script exist (``job_id`` is "").
        """
        rendered = hpcrun("sbatch", str(self.write(spec)), env=self.env, cwd=REPO_ROOT,
                          timeout=180)
        assert rendered.returncode == 0, f"hpcrun sbatch failed: {rendered.stderr}"
        match = re.search(r"created run (\S+) at (\S+)", rendered.stderr)
        assert match, f"hpcrun sbatch did not name the run: {rendered.stderr!r}"
        script = self.runs_root / "job.sh"
        script.write_text(rendered.stdout)
        if not submit:
            return self._track(TestbedRun(run_dir=Path(match.group(2)), job_id="",
                                          env=self.env))
        sent = subprocess.run(["sbatch", "--parsable", str(script)], env=_merged(self.env),
                              capture_output=True, text=True, timeout=60, check=False)
        assert sent.returncode == 0, f"sbatch job.sh failed: {sent.stderr}"
        job_id = sent.stdout.strip().split(";")[0]
        return self._track(TestbedRun(run_dir=Path(match.group(2)), job_id=job_id,
                                      env=self.env))

    def _track(self, run: TestbedRun) -> TestbedRun:
        self.runs.append(run)
        return run

    def cleanup(self) -> None:
        """Cancel every run of this test that is not terminal (fence first, then scancel)."""
        for run in self.runs:
            if run.record().state not in TERMINAL:
                run.cli("cancel", run.name)
            for job in run.record().slurm_job_ids():
                subprocess.run(["scancel", job], env=_merged(self.env), capture_output=True,
                               timeout=30, check=False)


def _merged(env: Mapping[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **env}


BASELINE_STEPS = 30
BASELINE_INJECT = "slow@step=5,rank=3,seconds=0.2,every=1"
"""The shared baseline run: rank 3 (on the second node) sleeps 0.2 s in each step from step 5."""

_BASELINE: dict[Path, TestbedRun] = {}


def baseline_run(testbed: Testbed) -> TestbedRun:
    """A 2 nodes x 2 ranks run of 30 steps with one slowed rank, submitted once per session.

    Tests that only read a finished run share it (success through submitit, multi-node commit
    and drain to the shared tier, straggler report), which keeps the fast suite short.
    """
    shared = testbed.shared_dir
    if shared not in _BASELINE:
        root = shared / "tests" / f"baseline-{uuid.uuid4().hex[:8]}"
        root.mkdir(parents=True)
        factory = RunFactory(testbed, root)
        _BASELINE[shared] = factory.submit(
            slurm_spec(testbed, steps=BASELINE_STEPS, every_steps=10), inject=BASELINE_INJECT)
    return _BASELINE[shared]


def scontrol_job(slurm: JobClient, job_id: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` as ``{key: value}`` ({} once the controller forgot it)."""
    out = slurm.run("scontrol", "show", "job", "-o", str(job_id))
    return parse_scontrol_show_job(out.stdout) if out.returncode == 0 else {}


def first_after(entries: Iterable[tuple[str, LogEntry]], state: str,
                after_slot: int = -1) -> LogEntry:
    """The first state entry named ``state`` after ``after_slot``."""
    found = [e for s, e in entries if s == state and e.slot > after_slot]
    assert found, f"no {state} entry after slot {after_slot}"
    return found[0]


TEARDOWN_S = 8.0
"""How much later Slurm's End of an allocation may be than the record's end (the stop's state
entry): the agents' exit and Slurm's epilog, which the record does not charge yet (3.5 s
measured on a loaded 2-core machine)."""


def sacct_allocations(slurm: JobClient, job_id: str) -> list[tuple[int, int, int]]:
    """``(start, end, nodes)`` of every record of ``job_id`` in Slurm's own accounting (a
    requeue or a shrink is a record of its own), times as epoch seconds."""
    out = slurm.run("env", "SLURM_TIME_FORMAT=%s", "sacct", "-j", str(job_id), "--duplicates",
                    "-X", "-n", "-P", "-o", "Start,End,NNodes").stdout
    rows = [ln.split("|") for ln in out.split() if ln.strip()]
    return [(int(start), int(end), int(nodes)) for start, end, nodes in rows]


def run_figures_of(run: TestbedRun) -> Any:
    """The figures status and the report show for ``run`` (ETTR over the record's
    allocations)."""
    from hpcrun.observe.collect import facts_from_record
    from hpcrun.observe.events import sorted_events
    from hpcrun.observe.figures import allocations_at, run_figures
    from hpcrun.observe.summary import summarize_events

    fig = run_figures(summarize_events(sorted_events(run.run_dir)),
                      allocations=allocations_at(facts_from_record(run.record()).allocations,
                                                 0.0))
    assert fig is not None, f"no figures for {run.run_dir}"
    return fig


def slurm_story(slurm: JobClient, run: TestbedRun, *, tail: int = 15) -> str:
    """For a failure message: what Slurm says of the run's job (every record, with its state,
    exit code and reason) and the last lines of each log the job and its agents wrote."""
    out = slurm.run("sacct", "-j", str(run.job_id), "--duplicates", "-n", "-P",
                    "-o", "JobID,State,ExitCode,Start,End,NodeList,Reason").stdout
    pending = slurm.run("squeue", "-h", "-j", str(run.job_id), "-o", "%T %r").stdout
    parts = [f"sacct:\n{out.strip()}", f"squeue: {pending.strip() or '-'}"]
    for path in sorted((run.run_dir / "logs").rglob("*")):
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.relative_to(run.run_dir)}\n" + "\n".join(lines))
    return "\n".join(parts)


def crash_noted(testbed: Testbed, run: TestbedRun, node: str, fault: str, *,
                step: int | None = None) -> None:
    """Power off ``node`` and note the injected fault in the run's log, at ``step`` (default:
    the run's step now), for the drill's evidence and contracts."""
    from hpcrun.control.entries import FaultInjectedNote
    from hpcrun.control.fencing import UNFENCED
    from hpcrun.control.log import RunLog

    testbed.crash(node)
    RunLog(run.run_dir).append_entry(FaultInjectedNote(
        fault=fault, node=node, step=run.record().step if step is None else step),
        generation=UNFENCED, holder="")
