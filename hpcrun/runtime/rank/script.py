"""Script mode: a rank that is a plain ``python train.py args...`` process, and what its exit means.

A spec with ``script:`` (and ``args:``) or ``command:`` instead of ``entrypoint:`` runs the
user's script unchanged on every rank, as torchrun would (docs/scripts.md):

1. **Launch.** The agent starts each rank as :func:`rank_argv` in the code directory, with the
   job's interpreter, in its own session. Its environment is the torchrun one
   (:func:`rank_environ`: ``MASTER_ADDR``, ``MASTER_PORT`` (new for every attempt), ``RANK``,
   ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``,
   ``ROLE_WORLD_SIZE``, ``TORCHELASTIC_*``) beside the ``HPCRUN_*`` variables
   :mod:`hpcrun.lite` reads. hpcrun forms no process group: the script's own
   ``init_process_group(backend)`` with ``env://`` forms the default one. No warm process is
   used: the script's imports are its own. Rank 0 also gets ``WANDB_RUN_ID`` and
   ``WANDB_RESUME=allow`` (and, with ``observe.tracker: mlflow``, ``MLFLOW_RUN_ID`` and its
   store: :func:`tracker_environ`), so a script's own wandb or MLflow run is one run
   across requeues.
2. **Preemption.** The agent relays a preemption to every rank as the spec's ``preempt_signal``
   (:func:`rank_signal`, SIGTERM by default: what torchrun forwards to its workers, so what
   torchrun scripts handle), again every 2 s until they exit. The ranks then have the site's
   grace (:func:`grace_s`) to save and exit; ranks still running after it are killed.
3. **Exit.** :func:`script_exit` reads a rank's exit: after a relayed stop (or when
   :mod:`hpcrun.lite` left a ``preempted`` exit report) every exit is a preemption, whatever
   code the script chose, and the supervisor requeues the run; the script's own resume logic
   runs in the next incarnation. Exit 0 otherwise is success; any other exit is a
   ``process_crash`` (a script's exit code does not say whether the bug is its own), restarted
   in the allocation within the retry budget, as torchrun restarts failed workers.
4. **Figures.** The node-0 agent logs RUNNING once the ranks are started
   (:func:`running_payload`): a silent script never reports a step, and status then says so
   (``steps not reported by the script``) instead of showing step 0.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.control.entries import StatePayload
from hpcrun.control.states import RunState
from hpcrun.runtime.incarnation import EXIT_OK, EXIT_PREEMPTED, Ending, RankExit
from hpcrun.vocab import FaultClass, Tracker

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.site import SiteConfig

RANK_SIGNAL_ENV = "HPCRUN_RANK_SIGNAL"
"""The signal a script's ranks receive on a preemption (read by :mod:`hpcrun.lite`)."""

DEFAULT_GRACE_S = 60.0
"""The ranks' time to save after the signal where the site sends it with no lead
(``preempt_lead_s: 0``, the local backend)."""

RUNNING_REASON = "script ranks started"


def rank_argv(spec: RunSpec, python: str) -> list[str]:
    """A rank's command line: ``python <script> <args>`` or the spec's ``command``."""
    if spec.script is not None:
        return [python, spec.script, *spec.args]
    return list(spec.command)


def rank_signal(spec: RunSpec) -> int:
    """The signal number of the spec's ``preempt_signal``."""
    return int(signal.Signals[spec.preempt_signal])


def rank_environ(dist: DistEnv, spec: RunSpec, *, run_id: str) -> dict[str, str]:
    """What a script rank gets beside the ``HPCRUN_*`` variables: the torchrun environment
    (``MASTER_*``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_*`` come from ``dist.to_environ``)."""
    max_restarts = int(spec.retry.max_attempts.get(str(FaultClass.PROCESS_CRASH), 0))
    return {**dist.torchrun_environ(run_id=run_id, max_restarts=max_restarts),
            RANK_SIGNAL_ENV: spec.preempt_signal}


def tracker_environ(rank: int, *, run_id: str, spec: RunSpec | None = None,
                    run_dir: Path | None = None,
                    environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Rank 0's tracker run, one per hpcrun run across requeues and restarts, as a
    ``main(ctx)`` run's tracker has it (:mod:`hpcrun.observe.tracker`): ``WANDB_RUN_ID`` (the
    script's own ``wandb.init()`` resumes it) and, with ``observe.tracker: mlflow``,
    ``MLFLOW_RUN_ID`` and its store (``mlflow.start_run()`` resumes it). The agent keeps what
    the user's environment already sets. An MLflow store that cannot be reached is reported
    and left out: telemetry never stops a run."""
    if rank != 0:
        return {}
    from hpcrun.observe.tracker import mlflow_environ, tracker_run_id

    out = {"WANDB_RUN_ID": tracker_run_id(run_id), "WANDB_RESUME": "allow"}
    if spec is not None and run_dir is not None and spec.observe.tracker == Tracker.MLFLOW:
        try:
            out.update(mlflow_environ(run_dir, run_id, project=spec.observe.project,
                                      environ=environ if environ is not None else os.environ))
        except Exception as exc:  # telemetry never ends training
            print(f"hpcrun: no MLflow run for the script: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    return out


def grace_s(site: SiteConfig) -> float:
    """How long the ranks may take to save and exit after the signal: the site's lead."""
    return float(site.preempt_lead_s) or DEFAULT_GRACE_S


class Grace:
    """The ranks' time to exit after a stop: expired once ``grace_s`` passed since the agent
    first saw the stop (pure: the caller passes the time)."""

    def __init__(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._since: float | None = None

    def expired(self, *, stopping: bool, now: float) -> bool:
        """Whether ranks still running now must be killed."""
        if stopping and self._since is None:
            self._since = now
        return self._since is not None and now - self._since > self._grace_s


def script_exit(ex: RankExit, *, stopping: bool) -> RankExit:
    """How a script rank's exit reads to the agent (pure).

    Args:
        ex: the process's exit as observed (its exit report, if :mod:`hpcrun.lite` left one).
        stopping: whether a stop (a preemption, the budget) was relayed to the ranks.
    """
    code = ex.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exited {code}"
    if stopping or ex.report.get("status") == Ending.PREEMPTED:
        return dataclasses.replace(ex, returncode=EXIT_PREEMPTED, report={
            **ex.report, "status": Ending.PREEMPTED, "detail": f"script {how} after a stop"})
    if code == EXIT_OK:
        return dataclasses.replace(ex, report={**ex.report, "status": Ending.SUCCEEDED})
    return dataclasses.replace(ex, report={
        **ex.report, "status": Ending.FAILED, "fault": str(FaultClass.PROCESS_CRASH),
        "detail": str(ex.report.get("detail") or f"script {how}")})


def running_payload() -> StatePayload:
    """The RUNNING state the node-0 agent logs once a script's ranks started."""
    return StatePayload(state=RunState.RUNNING, reason=RUNNING_REASON)


def is_script_rank(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is a script rank's (it names the script's preemption signal)."""
    return RANK_SIGNAL_ENV in environ
