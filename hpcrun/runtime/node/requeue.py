"""How the supervising agent puts its own job back in the queue, once.

On Slurm the job requeues itself with ``scontrol requeuehold``, then ``scontrol update`` of
``StartTime`` (backoff), ``ExcNodeList`` (quarantine) and, for an elastic run, ``NumNodes``
(``min_nodes-nodes``: the requeued job starts once that many are free), then ``scontrol
release``: the hold keeps the job from starting again before the updates land, so they cannot
race the requeue. The hold also makes Slurm kill this job's processes, so the agent ignores
SIGTERM for the few milliseconds the three commands take. When the job is no longer RUNNING,
Slurm has already requeued it (``PreemptMode=REQUEUE``): hpcrun never requeues twice.

On the local backend the launcher is the scheduler: the agent exits with EXIT_PREEMPTED and the
launcher reads the requeue operation from the run log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.runtime.preemption import sigterm_ignored
from hpcrun.scheduler.slurm import SlurmJobState
from hpcrun.vocab import Backend

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.runtime.node.info import NodeInfo
    from hpcrun.scheduler.slurm import PastRun, SlurmClient


class Requeuer(Protocol):
    """Puts the current job back in the queue after ``delay_s``, avoiding ``exclude``."""

    slurm_requeues: bool
    """Set by :meth:`requeue` when the scheduler is preempting the job and requeues it
    itself (the agent then stays until the job ends: :meth:`outlive`)."""

    def requeue(self, *, delay_s: float, exclude: Sequence[str]) -> str:
        """Do it; return a short description of what was done (for the log)."""
        ...

    def previous_run(self, *, tries: int = 5, wait_s: float = 1.0) -> PastRun | None:
        """How the scheduler ended this job's previous run, when it requeued the job by
        itself (None when unknown, or not applicable)."""
        ...

    def outlive(self, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> bool:
        """Keep the job alive until the scheduler ends it (True), or give up (False)."""
        ...

    def release(self) -> str:
        """End the job now that the run ended and no batch script is left to end it (its
        first node was lost); return a short description of what was done."""
        ...


class LocalRequeuer:
    """The local launcher relaunches on EXIT_PREEMPTED; nothing to do here."""

    slurm_requeues = False

    def requeue(self, *, delay_s: float, exclude: Sequence[str]) -> str:
        return f"local launcher relaunches after {delay_s:.1f} s"

    def previous_run(self, *, tries: int = 5, wait_s: float = 1.0) -> PastRun | None:
        return None  # the local launcher relaunches only on what the log says

    def outlive(self, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> bool:
        return False  # the launcher ends the allocation when its agents exit

    def release(self) -> str:
        return "the local launcher ends when its agents exit"


class SlurmRequeuer:
    """requeuehold → update StartTime/ExcNodeList (and an elastic run's NumNodes=min-max) →
    release, on this job id."""

    def __init__(self, client: SlurmClient, job_id: str, *, clock: Clock = SYSTEM_CLOCK,
                 resize: Mapping[str, str] | None = None) -> None:
        self._client = client
        self._job_id = job_id
        self._resize = dict(resize or {})
        """Extra ``scontrol update`` fields of the requeued job (an elastic run's ``NumNodes``
        range and ``NumTasks``); empty: its size is unchanged."""
        self._clock = clock
        self.slurm_requeues = False
        """Set when Slurm is preempting the job and requeues it itself."""

    def requeue(self, *, delay_s: float, exclude: Sequence[str]) -> str:
        client = self._client
        state = client.observe(self._job_id).state
        if state not in (SlurmJobState.RUNNING, SlurmJobState.COMPLETING):
            return f"job {self._job_id} is {state}: Slurm already requeued it, not requeueing"
        preempting = self._preempt_time()
        if preempting:
            self.slurm_requeues = True
            return (f"job {self._job_id} is being preempted (PreemptTime {preempting}): Slurm "
                    "requeues it, not requeueing")
        with sigterm_ignored():
            client.requeuehold(self._job_id)
            fields: dict[str, str] = {}
            if delay_s > 0:
                fields["StartTime"] = f"now+{max(1, round(delay_s))}"
            if exclude:
                fields["ExcNodeList"] = ",".join(exclude)
            fields.update(self._resize)
            if fields:
                client.update_job(self._job_id, **fields)
            client.release(self._job_id)
        return (f"requeued job {self._job_id} (hold, begin +{delay_s:.0f} s, "
                f"exclude {','.join(exclude) or '-'}"
                + (f", nodes {self._resize['NumNodes']}" if "NumNodes" in self._resize else "")
                + ", release)")

    def previous_run(self, *, tries: int = 5, wait_s: float = 1.0) -> PastRun | None:
        """The run before this one, from ``sacct --duplicates`` (None without accounting).

        slurmdbd records asynchronously: while it lists fewer than two runs the query is
        repeated, ``tries`` times at most, ``wait_s`` apart.
        """
        from hpcrun.errors import SchedulerError

        for attempt in range(tries):
            try:
                runs = self._client.runs(self._job_id)
            except SchedulerError:
                return None
            if len(runs) >= 2:
                return runs[-2]
            if attempt + 1 < tries:
                self._clock.sleep(wait_s)
        return None

    def outlive(self, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> bool:
        """Keep the job alive until Slurm ends it (True), or until ``timeout_s`` (False).

        A job whose processes all exit during its preemption's grace time completes normally,
        and Slurm then never requeues it; a job that Slurm kills at the end of the grace time is
        requeued. The same wait lets a scancel or a time limit end the job as Slurm says.
        """
        deadline = self._clock.monotonic() + timeout_s
        while self._clock.monotonic() < deadline:
            obs = self._client.observe(self._job_id)
            if obs.state is not SlurmJobState.RUNNING:
                return True
            self._clock.sleep(poll_s)
        return False

    def release(self) -> str:
        """``scancel`` this job: the batch script died with the job's first node, so Slurm
        would hold the allocation until the time limit (sacct then says CANCELLED; the run's
        state is the log's)."""
        with sigterm_ignored():
            found = self._client.scancel(self._job_id)
        return (f"cancelled job {self._job_id}: its batch host was lost" if found
                else f"job {self._job_id} already ended")

    def _preempt_time(self) -> str | None:
        """When Slurm started preempting the job (it stays RUNNING through the grace time and
        then requeues it itself under PreemptMode=REQUEUE), or None."""
        from hpcrun.errors import SchedulerError

        try:
            info = self._client.scontrol_show_job(self._job_id)
        except SchedulerError:
            return None  # cannot tell: requeue, as for a time limit
        value = str(info.get("PreemptTime", "None"))
        return None if value in ("None", "Unknown", "") else value


def requeuer_for(node: NodeInfo, spec: RunSpec,
                 environ: Mapping[str, str] | None = None) -> Requeuer:
    """The requeuer of this node's backend: Slurm's, or the local launcher's. Its Slurm calls go
    through the site's ``HPCRUN_SLURM_WRAPPER`` when ``environ`` sets one (agents inside a Pyxis
    image: :func:`hpcrun.runner.slurm_runner`)."""
    if node.backend == Backend.LOCAL:
        return LocalRequeuer()
    from hpcrun.control.elastic import requeue_resize
    from hpcrun.runner import slurm_runner
    from hpcrun.scheduler.slurm import SlurmClient

    # an elastic run's requeued job starts once min_nodes are free
    return SlurmRequeuer(SlurmClient(slurm_runner(environ or {})), node.job_id,
                         resize=requeue_resize(spec))
