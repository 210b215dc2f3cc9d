"""Campaigns from Python: ``hpcrun.submit(spec)`` and ``hpcrun.sweep(spec, grid)``.

The same path as ``hpcrun submit`` / ``hpcrun sweep`` (admission, frozen spec, run record, one
allocation or one job array), returning handles a notebook or a script can drive::

    run = hpcrun.submit("run.yaml")
    run.wait()                    # RunState.SUCCEEDED, FAILED or CANCELLED
    run.result()                  # the run's post-run manifest (a dict)

    sw = hpcrun.sweep("run.yaml", {"config.lr": [1e-3, 3e-3], "config.seed": [0, 1, 2]},
                      max_parallel=2)
    sw.wait()                     # {run_id: terminal state}
    [r.result() for r in sw.runs]

``spec`` is a run.yaml path, a mapping or a :class:`~hpcrun.control.spec.RunSpec` (a mapping or
a spec is written to a temporary run.yaml: give data paths absolute).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.record import read_record
from hpcrun.control.spec import RunSpec
from hpcrun.control.states import is_terminal
from hpcrun.errors import RunNotFinishedError, WaitTimeoutError
from hpcrun.vocab import Backend, RunState

if TYPE_CHECKING:
    from hpcrun.launch.submission import SubmitContext

SpecLike = str | os.PathLike[str] | Mapping[str, Any] | RunSpec
"""What :func:`submit` and :func:`sweep` accept as the spec."""

POLL_S = 5.0
"""How often :meth:`RunHandle.wait` reads the record."""


@dataclass(frozen=True, slots=True)
class RunHandle:
    """One submitted run."""

    run_dir: Path
    """Its run directory (on the shared filesystem)."""
    job_id: str | None = None
    """Its Slurm job id at submission (None on the local backend)."""

    @property
    def run_id(self) -> str:
        """The run id (``hpcrun status RUN_ID``)."""
        return self.run_dir.name

    def state(self) -> RunState:
        """The run's state now (read from its record)."""
        return read_record(self.run_dir).state

    def wait(self, timeout_s: float | None = None, *, poll_s: float = POLL_S,
             clock: Clock = SYSTEM_CLOCK) -> RunState:
        """Block until the run ends; return its terminal state.

        Raises:
            WaitTimeoutError: ``timeout_s`` passed first (the run goes on).
        """
        deadline = None if timeout_s is None else clock.monotonic() + timeout_s
        while True:
            state = self.state()
            if is_terminal(state):
                return state
            if deadline is not None and clock.monotonic() >= deadline:
                raise WaitTimeoutError(f"run {self.run_id} is still {state.value} after "
                                       f"{timeout_s:g} s; wait longer or check `hpcrun status "
                                       f"{self.run_id}`")
            clock.sleep(poll_s)

    def result(self) -> dict[str, Any] | None:
        """The run's post-run manifest (terminal state, artifacts, provenance, counts, cost), or
        None when the run ended without publishing one.

        Raises:
            RunNotFinishedError: the run has not ended yet (call :meth:`wait` first).
            RecordError: the published manifest does not verify.
        """
        from hpcrun.observe.postrun import read_manifest

        record = read_record(self.run_dir)
        if not is_terminal(record.state):
            raise RunNotFinishedError(f"run {self.run_id} is {record.state.value}: its result "
                                      "exists once it ends; call .wait() first")
        if not (record.result or {}).get("manifest"):
            return None
        return read_manifest(self.run_dir, record.result)


@dataclass(frozen=True, slots=True)
class SweepHandle:
    """One submitted sweep: a handle per point."""

    sweep_dir: Path
    """The sweep directory."""
    runs: tuple[RunHandle, ...]
    """Each point's run, in array task order."""
    job_id: str | None = None
    """The array job id (None on the local backend)."""

    @property
    def sweep_id(self) -> str:
        """The sweep id (``hpcrun status SWEEP_ID``)."""
        return self.sweep_dir.name

    def state(self) -> dict[str, RunState]:
        """Each point's state, by run id."""
        return {r.run_id: r.state() for r in self.runs}

    def wait(self, timeout_s: float | None = None, *, poll_s: float = POLL_S,
             clock: Clock = SYSTEM_CLOCK) -> dict[str, RunState]:
        """Block until every point ended; return their terminal states by run id.

        Raises:
            WaitTimeoutError: ``timeout_s`` passed first.
        """
        deadline = None if timeout_s is None else clock.monotonic() + timeout_s
        out = {}
        for run in self.runs:
            left = None if deadline is None else max(0.0, deadline - clock.monotonic())
            out[run.run_id] = run.wait(left, poll_s=poll_s, clock=clock)
        return out

    def result(self) -> list[dict[str, Any] | None]:
        """Each point's post-run manifest (see :meth:`RunHandle.result`)."""
        return [r.result() for r in self.runs]


def _spec_file(spec: SpecLike) -> Path:
    """A run.yaml for ``spec``: the path itself, or a temporary file holding the mapping."""
    if isinstance(spec, str | os.PathLike):
        return Path(spec)
    body = spec.to_dict() if isinstance(spec, RunSpec) else dict(spec)
    folder = Path(tempfile.mkdtemp(prefix="hpcrun-spec-"))
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=True))
    return path


def _context() -> SubmitContext:
    """This process's submission context, wired to the runtime's agent; notices and warnings
    go to stderr, one line each, as the CLI prints them."""
    from hpcrun.launch.submission import SubmitContext
    from hpcrun.runtime.agent import agent_main
    from hpcrun.runtime.faults import parse_injections

    return SubmitContext.from_process(agent_entry=agent_main, check_faults=parse_injections,
                                      warn=lambda line: print(line, file=sys.stderr))


def submit(spec: SpecLike, *, backend: Backend | str | None = None, site: str | None = None,
           runs_root: str | None = None, after: Sequence[str] = (),
           verify_data: str = "sample") -> RunHandle:
    """Submit one run (as ``hpcrun submit``); return its handle.

    Args:
        spec: a run.yaml path, a mapping or a RunSpec.
        backend: ``slurm`` or ``local`` (default: the site's).
        site: site config name or path.
        runs_root: where the run directory goes.
        after: runs or sweeps to wait for (``RUN[:ok|any]``), as ``--after``.
        verify_data: admission's data check (``all``, ``sample``, ``none``).

    Raises:
        HpcrunError: admission refused the run (nothing was created), or submitting failed.
    """
    from hpcrun.launch.admit import parse_backend
    from hpcrun.launch.submission import SubmitRequest, submit_run

    done = submit_run(SubmitRequest(spec_path=_spec_file(spec), backend=parse_backend(backend),
                                    site=site, runs_root=runs_root, verify_data=verify_data,
                                    after=tuple(after)), _context())
    return RunHandle(done.run_dir, done.job_id)


def sweep(spec: SpecLike, grid: Mapping[str, Sequence[Any]] | None = None, *,
          points: Sequence[Mapping[str, Any]] = (), max_parallel: int | None = None,
          backend: Backend | str | None = None, site: str | None = None,
          runs_root: str | None = None,
          verify_data: str = "sample") -> SweepHandle:
    """Submit a sweep (as ``hpcrun sweep``): every combination of ``grid`` plus ``points``.

    Args:
        spec: the base run.yaml path, a mapping or a RunSpec.
        grid: dotted spec key → values, e.g. ``{"config.lr": [1e-3, 3e-3]}``.
        points: explicit points (dotted key → value).
        max_parallel: points running at once.

    Raises:
        SpecError: an empty grid, a key not in the spec, duplicate points (nothing created).
    """
    from hpcrun.launch.admit import parse_backend
    from hpcrun.launch.sweep_submission import SweepRequest, submit_sweep

    axes = tuple((str(k), tuple(v)) for k, v in (grid or {}).items())
    done = submit_sweep(SweepRequest(
        spec_path=_spec_file(spec), axes=axes, points=tuple(dict(p) for p in points),
        max_parallel=max_parallel, backend=parse_backend(backend), site=site,
        runs_root=runs_root, verify_data=verify_data), _context())
    return SweepHandle(done.sweep_dir, tuple(RunHandle(d) for d in done.run_dirs), done.job_id)


__all__ = ["RunHandle", "RunNotFinishedError", "SweepHandle", "WaitTimeoutError", "submit",
           "sweep"]
