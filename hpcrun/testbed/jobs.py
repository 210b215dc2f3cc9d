"""Submit batch scripts to the testbed and wait for job states: what integration tests need.

The parsers are pure; :class:`JobClient` is a thin shell over a :class:`CommandRunner`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import TestbedError
from hpcrun.runner import CommandResult, CommandRunner, SubprocessRunner

TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                             "DEADLINE", "BOOT_FAIL"})
"""States a job does not leave by itself (NODE_FAIL and PREEMPTED may be followed by a requeue)."""
_SACCT_FIELDS = "JobID,State,NodeList,ExitCode"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRecord:
    """One accounting record of a job (a requeued job has one per run)."""

    job_id: int
    """Slurm job id (the same across requeues)."""
    state: str
    """Normalised state, e.g. ``COMPLETED``, ``NODE_FAIL``, ``REQUEUED``, ``PREEMPTED``."""
    nodes: str
    """Slurm hostlist the run had, e.g. ``node[1-2]``; ``None assigned`` when it never ran."""
    exit_code: str
    """``code:signal`` as sacct prints it."""


def normalize_state(raw: str) -> str:
    """``CANCELLED by 0`` → ``CANCELLED``; ``completing`` → ``COMPLETING``; strips flags."""
    word = raw.strip().split(" ")[0] if raw.strip() else ""
    return word.rstrip("+").upper()


def parse_job_id(text: str) -> int:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    head = text.strip().splitlines()[-1].split(";")[0] if text.strip() else ""
    if not head.isdigit():
        raise TestbedError(f"sbatch --parsable printed {text.strip()!r}, expected a job id; "
                           "check the script's #SBATCH lines")
    return int(head)


def parse_squeue_state(text: str) -> str | None:
    """The state from ``squeue -h -t all -j J -o %T``, None when squeue no longer knows it."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return normalize_state(lines[0]) if lines else None


def parse_sacct_records(text: str) -> list[JobRecord]:
    """Records from ``sacct -X -n -P -o JobID,State,NodeList,ExitCode`` (step rows skipped)."""
    records = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        records.append(JobRecord(job_id=int(parts[0]), state=normalize_state(parts[1]),
                                 nodes=parts[2], exit_code=parts[3]))
    return records


class JobClient:
    """Slurm client calls the tests make against the testbed.

    Args:
        env: entries added to each command's environment (``Testbed.env``: SLURM_CONF).
        runner: where commands run; the real subprocess runner by default.
        clock: time source for waiting.
        output_dir: where a job submitted without ``--output`` writes ``slurm-<id>.out``;
            None discards it. Never the caller's working directory (Slurm's default), which
            for a test is the repository.
    """

    def __init__(self, env: Mapping[str, str], *, runner: CommandRunner | None = None,
                 clock: Clock = SYSTEM_CLOCK, output_dir: Path | None = None) -> None:
        self.env = dict(env)
        self.output_dir = output_dir
        self._runner = runner if runner is not None else SubprocessRunner()
        self._clock = clock

    def run(self, *argv: str, input: str | None = None, timeout: float = 60) -> CommandResult:
        """Run a Slurm client command with the testbed's environment; never raises on exit."""
        return self._runner.run(argv, input=input, env=self.env, timeout=timeout)

    def submit(self, script: str, *sbatch_args: str) -> int:
        """``sbatch --parsable ARGS`` with ``script`` (text starting ``#!``) on stdin.

        Without ``--output``/``-o`` in ``sbatch_args`` the job's output goes to
        ``output_dir`` (or nowhere), never to the current directory.
        """
        result = self.run("sbatch", "--parsable", *sbatch_args,
                          *self._output_flag(sbatch_args), input=script)
        if result.returncode != 0:
            raise TestbedError(f"sbatch {' '.join(sbatch_args)} exited {result.returncode}: "
                               f"{(result.stderr or result.stdout).strip()}")
        return parse_job_id(result.stdout)

    def _output_flag(self, sbatch_args: Sequence[str]) -> list[str]:
        if any(a in ("-o", "--output") or a.startswith(("--output=", "-o")) for a in sbatch_args):
            return []
        if self.output_dir is None:
            return ["--output=/dev/null"]
        return [f"--output={self.output_dir}/slurm-%j.out"]

    def state(self, job_id: int) -> str | None:
        """Current state from squeue, falling back to sacct once squeue forgot the job."""
        queued = self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T")
        state = parse_squeue_state(queued.stdout) if queued.returncode == 0 else None
        if state is not None:
            return state
        history = self.history(job_id)
        return history[-1].state if history else None

    def history(self, job_id: int) -> list[JobRecord]:
        """Every accounting record of the job, oldest first (``sacct --duplicates``)."""
        result = self.run("sacct", "-j", str(job_id), "--duplicates", "-X", "-n", "-P",
                          "-o", _SACCT_FIELDS)
        return parse_sacct_records(result.stdout) if result.returncode == 0 else []

    def wait_for_state(self, job_id: int, states: Collection[str], *, timeout: float,
                       interval: float = 0.5) -> str:
        """Poll until the job is in one of ``states``; return that state.

        Raises:
            TestbedError: after ``timeout`` s, or at once when the job reaches a terminal state
                that is not wanted; the message names the last state seen.
        """
        wanted = {s.upper() for s in states}
        deadline = self._clock.monotonic() + timeout
        state = None
        while True:
            state = self.state(job_id)
            if state in wanted:
                return state
            if state in TERMINAL_STATES:
                raise TestbedError(f"job {job_id} ended {state}, expected {sorted(wanted)}")
            if self._clock.monotonic() >= deadline:
                raise TestbedError(f"job {job_id} not in {sorted(wanted)} after {timeout:g} s; "
                                   f"last state {state}")
            self._clock.sleep(interval)

    def wait_for_accounting(self, job_id: int, predicate_states: Collection[str], *,
                            timeout: float) -> list[JobRecord]:
        """Poll sacct until the job's history holds every state in ``predicate_states``."""
        wanted = {s.upper() for s in predicate_states}
        deadline = self._clock.monotonic() + timeout
        while True:
            history = self.history(job_id)
            if wanted <= {r.state for r in history}:
                return history
            if self._clock.monotonic() >= deadline:
                seen = [r.state for r in history]
                raise TestbedError(f"sacct history of job {job_id} lacks {sorted(wanted)} "
                                   f"after {timeout:g} s; found {seen}")
            self._clock.sleep(0.5)
