"""Slurm client over an injected :class:`~hpcrun.runner.CommandRunner`, and pure output parsers.

The parsers take text and return values; :class:`SlurmClient` builds argv, runs it through the
runner (one line each) and parses. Formats are chosen so that every field but the last cannot
contain the delimiter: ``squeue -o '%i|%T|%r|%N|%k'`` and ``sacct --parsable2`` with ``Comment``
last. Every Slurm state maps to a :class:`SlurmJobState`; an unknown one maps to ``UNKNOWN``.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from hpcrun.errors import SchedulerError
from hpcrun.runner import CommandResult, CommandRunner

SQUEUE_FORMAT = "%i|%T|%r|%N|%k"
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "NodeList", "Comment")
_INVALID_JOB = re.compile(r"invalid job id", re.IGNORECASE)
_HELD = re.compile(r"^JobHeld|held", re.IGNORECASE)
_ADMIN_HELD = re.compile(r"JobHeldAdmin|launch.failed.requeued.held", re.IGNORECASE)
_REFUSED = re.compile(r"access.*denied|permission denied|not authorized|disabled", re.IGNORECASE)


class SlurmJobState(StrEnum):
    """Slurm job states (long names), plus UNKNOWN for anything else and VANISHED for none."""

    BOOT_FAIL = "BOOT_FAIL"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    COMPLETING = "COMPLETING"
    CONFIGURING = "CONFIGURING"
    DEADLINE = "DEADLINE"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PENDING = "PENDING"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESIZING = "RESIZING"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REVOKED = "REVOKED"
    RUNNING = "RUNNING"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"    # a state this hpcrun does not know (newer Slurm)
    VANISHED = "VANISHED"  # neither squeue nor sacct knows the job


_SHORT = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CG": "COMPLETING",
    "CF": "CONFIGURING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED", "RQ": "REQUEUED",
    "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD", "RS": "RESIZING", "RD": "RESV_DEL_HOLD",
    "RV": "REVOKED", "R": "RUNNING", "SI": "SIGNALING", "SE": "SPECIAL_EXIT", "SO": "STAGE_OUT",
    "ST": "STOPPED", "S": "SUSPENDED", "TO": "TIMEOUT",
}

ACTIVE = frozenset({
    SlurmJobState.PENDING, SlurmJobState.RUNNING, SlurmJobState.CONFIGURING,
    SlurmJobState.COMPLETING, SlurmJobState.SUSPENDED, SlurmJobState.REQUEUED,
    SlurmJobState.REQUEUE_HOLD, SlurmJobState.REQUEUE_FED, SlurmJobState.RESIZING,
    SlurmJobState.SIGNALING, SlurmJobState.STAGE_OUT, SlurmJobState.STOPPED,
    SlurmJobState.RESV_DEL_HOLD,
})
"""States of a job that still holds or waits for an allocation."""


def parse_state(text: str) -> SlurmJobState:
    """Map Slurm's state text (``CANCELLED by 1000``, ``R``, ``RUNNING+``) to a state."""
    word = (text.strip().split() or [""])[0].rstrip("+").upper()
    word = _SHORT.get(word, word)
    try:
        return SlurmJobState(word)
    except ValueError:
        return SlurmJobState.UNKNOWN


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What the scheduler says about one job of a run (plus the heartbeat age, when known)."""

    job_id: str
    """Job id asked about."""
    state: SlurmJobState
    """Its state; VANISHED when neither squeue nor sacct knows it."""
    reason: str = ""
    """Pending/hold reason (``JobHeldAdmin``, ``BeginTime``, ...) or sacct's reason."""
    exit_code: int | None = None
    """Exit status of the batch script, when finished."""
    signal: int | None = None
    """Signal that ended it, when killed."""
    nodes: tuple[str, ...] = ()
    """Nodes of its allocation."""
    comment: str = ""
    """Its ``--comment`` (hpcrun tags ``hpcrun:<op_id>``)."""
    source: str = "none"
    """Who answered: ``squeue`` (the controller still holds it), ``sacct``, or ``none``."""
    heartbeat_age_s: float | None = None
    """Seconds since the run's newest heartbeat, filled by the caller; None when unknown."""
    down_nodes: tuple[str, ...] = ()
    """Nodes of its allocation that Slurm now reports down or not responding (filled by the
    caller for a job that ended without completing)."""
    ended_s_ago: float | None = None
    """Seconds since it ended, filled by the caller while the controller still holds it."""

    @property
    def vanished(self) -> bool:
        return self.state == SlurmJobState.VANISHED

    @property
    def held(self) -> bool:
        """Pending under a hold (user, admin, or ``scontrol requeuehold``)."""
        return self.state == SlurmJobState.REQUEUE_HOLD or (
            self.state == SlurmJobState.PENDING and bool(_HELD.search(self.reason)))

    @property
    def admin_held(self) -> bool:
        """Held by Slurm or an operator (too many requeues, launch failures): users may not be
        able to release it."""
        return self.held and bool(_ADMIN_HELD.search(self.reason))

    @property
    def in_controller(self) -> bool:
        """Whether slurmctld still holds the job (so ``scontrol requeue`` can act on it)."""
        return self.source == "squeue"


def _split(line: str, n: int) -> list[str] | None:
    parts = line.rstrip("\n").split("|", n - 1)
    return parts if len(parts) == n else None


def parse_squeue(text: str) -> list[Observation]:
    """Parse ``squeue --noheader -o '%i|%T|%r|%N|%k'`` output (malformed lines are skipped)."""
    out = []
    for line in text.splitlines():
        parts = _split(line, 5)
        if not parts or not parts[0].strip():
            continue
        job_id, state, reason, nodes, comment = (p.strip() for p in parts)
        out.append(Observation(job_id=job_id, state=parse_state(state), source="squeue",
                               reason="" if reason == "None" else reason,
                               nodes=tuple(parse_nodelist(nodes)),
                               comment="" if comment == "(null)" else comment))
    return out


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """``"2:0"`` → (2, None); ``"0:9"`` → (0, 9); anything else → (None, None)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if not m:
        return None, None
    code, sig = int(m.group(1)), int(m.group(2))
    return code, (sig or None)


def with_exit(obs: Observation, exit_code: int | None, signal: int | None) -> Observation:
    """``obs`` with the exit status another source gave (pure); the rest is squeue's."""
    return replace(obs, exit_code=exit_code, signal=signal)


def parse_sacct(text: str) -> list[Observation]:
    """Parse ``sacct --noheader --parsable2 -X --format=JobID,State,ExitCode,Reason,NodeList,
    Comment``. Steps (``123.batch``) are skipped; for a job listed twice the last line wins."""
    seen: dict[str, Observation] = {}
    for line in text.splitlines():
        parts = _split(line, len(SACCT_FIELDS))
        if not parts or not parts[0] or "." in parts[0]:
            continue
        job_id, state, exit_text, reason, nodes, comment = parts
        code, sig = parse_exit_code(exit_text)
        seen[job_id] = Observation(
            job_id=job_id, state=parse_state(state), exit_code=code, signal=sig, source="sacct",
            reason="" if reason == "None" else reason, nodes=tuple(parse_nodelist(nodes)),
            comment=comment)
    return list(seen.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class PastRun:
    """One run of a job that Slurm requeued (a line of ``sacct --duplicates``)."""

    state: SlurmJobState
    """How that run ended (NODE_FAIL, PREEMPTED, ...)."""
    exit_code: int | None
    """Exit status of its batch script."""
    signal: int | None
    """Signal that ended it."""
    nodes: tuple[str, ...]
    """Its allocation."""
    ended_at: float | None
    """When it ended (epoch seconds; None when unknown)."""


RUNS_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "End")


def parse_slurm_time(text: str) -> float | None:
    """Slurm's local ``2026-11-29T18:48:36`` as epoch seconds (None for ``Unknown`` or junk)."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_sacct_runs(text: str) -> list[PastRun]:
    """Parse ``sacct --duplicates --noheader --parsable2 -X --format=JobID,State,ExitCode,
    NodeList,End``: every run of the job, oldest first (malformed lines are skipped)."""
    runs = []
    for line in text.splitlines():
        parts = _split(line, len(RUNS_FIELDS))
        if not parts or not parts[0] or "." in parts[0]:
            continue
        _, state, exit_text, nodes, end = parts
        code, sig = parse_exit_code(exit_text)
        runs.append(PastRun(state=parse_state(state), exit_code=code, signal=sig,
                            nodes=tuple(parse_nodelist(nodes)), ended_at=parse_slurm_time(end)))
    return runs


def parse_scontrol_show_job(text: str) -> dict[str, str]:
    """Parse one job of ``scontrol show job [-o] ID`` into ``{key: value}``.

    A token without ``=`` belongs to the previous value (values such as ``Reason`` or
    ``Command`` may hold spaces); only the first job of a multi-job output is read.
    """
    fields: dict[str, str] = {}
    last = None
    for block in text.strip().split("\n\n")[:1]:
        for token in block.split():
            key, eq, value = token.partition("=")
            if eq and key and (key[0].isupper() or key in ("_",)):
                fields[key], last = value, key
            elif last is not None:
                fields[last] += " " + token
    return fields


def _expand_bracket(prefix: str, body: str) -> list[str]:
    out = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not dash:
            out.append(prefix + lo)
            continue
        width = len(lo) if lo.startswith("0") else 0
        out.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    return out


def _expand_host(expr: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", expr)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            choices.append(_expand_bracket("", piece[1:-1]))
        elif piece:
            choices.append([piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def parse_nodelist(text: str) -> list[str]:
    """Expand Slurm's hostlist syntax: ``node[1-3],gpu07`` → node1, node2, node3, gpu07.

    Zero padding is kept (``n[01-03]``); several brackets form their product
    (``r[1-2]n[1-2]``). ``(null)``, ``None assigned`` and empty text give an empty list.

    Raises:
        SchedulerError: the text is not a hostlist.
    """
    text = text.strip()
    if not text or text in ("(null)", "None assigned", "None"):
        return []
    if text.count("[") != text.count("]"):
        raise SchedulerError(f"not a Slurm hostlist: {text!r} (unbalanced brackets); expected "
                             "e.g. node[1-3],gpu07")
    hosts: list[str] = []
    for expr in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        try:
            hosts.extend(_expand_host(expr))
        except ValueError as exc:
            raise SchedulerError(f"not a Slurm hostlist: {text!r} ({exc}); expected e.g. "
                                 "node[1-3],gpu07") from exc
    return hosts


_NODE_DOWN = frozenset({"DOWN", "FAIL", "FAILING", "NO_RESPOND", "NOT_RESPONDING",
                        "POWERED_DOWN", "POWER_DOWN", "UNKNOWN"})


def node_is_down(state: str) -> bool:
    """Whether a node state from ``sinfo -o %T`` (``down*``, ``mixed*``, ``fail``, ``idle``)
    means the node is lost: down or failing, or not responding (the ``*`` suffix)."""
    state = state.strip().upper()
    return state.endswith("*") or re.split(r"[+~#!%$@^*-]", state)[0] in _NODE_DOWN


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """Parse ``sinfo --noheader -N -o '%N|%T'`` into ``{node: state}`` (a node listed once per
    partition appears once; a down state wins)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = _split(line, 2)
        if not parts or not parts[0].strip():
            continue
        node, state = (p.strip() for p in parts)
        if node not in states or node_is_down(state):
            states[node] = state
    return states


def parse_settle_s(text: str) -> float:
    """Seconds slurmctld may take to mark a lost node down, from ``scontrol show config``:
    SlurmdTimeout, plus one ping period (SlurmdTimeout / 3) for the last response it had, plus
    MessageTimeout for the failing ping, plus 5 s of margin (the testbed, at 10 s and 10 s,
    took 30 s from the crash). Slurm's defaults (300 s, 10 s) apply to a missing key."""
    found = dict(re.findall(r"^(SlurmdTimeout|MessageTimeout)\s*=\s*(\d+)", text, re.MULTILINE))
    slurmd = int(found.get("SlurmdTimeout", 300))
    return slurmd + slurmd / 3 + int(found.get("MessageTimeout", 10)) + 5


def parse_sbatch_output(text: str) -> str:
    """The job id from ``sbatch`` output (``Submitted batch job 123`` or ``--parsable`` ``123``
    / ``123;cluster``).

    Raises:
        SchedulerError: no job id in the output.
    """
    for line in text.splitlines():
        m = re.search(r"Submitted batch job (\d+)", line) or re.fullmatch(
            r"\s*(\d+)(?:;\S+)?\s*", line)
        if m:
            return m.group(1)
    raise SchedulerError(f"sbatch printed no job id (output: {text.strip()[:200]!r}); "
                         "check the sbatch arguments and the site's submit filter")


class SlurmClient:
    """Slurm commands through a :class:`CommandRunner` (the one effectful piece)."""

    def __init__(self, runner: CommandRunner, *, env: Mapping[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        self.runner = runner
        self.env = dict(env or {})
        self.timeout = timeout

    def _run(self, argv: Sequence[str], *, input: str | None = None) -> CommandResult:
        return self.runner.run(list(argv), input=input, env=self.env or None,
                               timeout=self.timeout)

    def sbatch(self, script: str | Path, args: Sequence[str] = ()) -> str:
        """Submit a script (a path, or the script's text via stdin); return the job id."""
        if isinstance(script, Path):
            result = self._run(["sbatch", "--parsable", *args, str(script)])
        else:
            result = self._run(["sbatch", "--parsable", *args], input=script)
        return parse_sbatch_output(result.check().stdout)

    def squeue(self, job_ids: Sequence[str]) -> list[Observation]:
        """The controller's view of ``job_ids`` (all states); unknown ids are left out."""
        result = self._run(["squeue", "--noheader", "--states=all", "-o", SQUEUE_FORMAT,
                            "-j", ",".join(job_ids)])
        if result.returncode != 0 and _INVALID_JOB.search(result.stderr):
            return []
        return parse_squeue(result.check().stdout)

    def sacct(self, job_ids: Sequence[str]) -> list[Observation]:
        """The accounting view of ``job_ids`` (allocations only)."""
        result = self._run(["sacct", "--noheader", "--parsable2", "-X",
                            f"--format={','.join(SACCT_FIELDS)}", "-j", ",".join(job_ids)])
        return parse_sacct(result.check().stdout)

    def find_by_comment(self, comment: str) -> list[str]:
        """Ids of the caller's jobs known to the controller whose ``--comment`` is ``comment``."""
        result = self._run(["squeue", "--me", "--noheader", "--states=all", "-o",
                            SQUEUE_FORMAT])
        return [o.job_id for o in parse_squeue(result.check().stdout) if o.comment == comment]

    def runs(self, job_id: str) -> list[PastRun]:
        """Every run of ``job_id`` so far (one per requeue), oldest first, from accounting."""
        result = self._run(["sacct", "--duplicates", "--noheader", "--parsable2", "-X",
                            f"--format={','.join(RUNS_FIELDS)}", "-j", job_id])
        return parse_sacct_runs(result.check().stdout)

    def scontrol_show_job(self, job_id: str) -> dict[str, str]:
        return parse_scontrol_show_job(
            self._run(["scontrol", "show", "job", "-o", job_id]).check().stdout)

    def down_nodes(self, nodes: Sequence[str]) -> tuple[str, ...]:
        """Those of ``nodes`` that Slurm reports down, failing or not responding."""
        if not nodes:
            return ()
        text = self._run(["sinfo", "--noheader", "-N", "-o", "%N|%T", "-n",
                          ",".join(nodes)]).check().stdout
        return tuple(n for n, st in sorted(parse_sinfo_nodes(text).items()) if node_is_down(st))

    def node_settle_s(self) -> float:
        """How long after a job's end a node it lost may still look healthy
        (:func:`parse_settle_s` of ``scontrol show config``)."""
        return parse_settle_s(self._run(["scontrol", "show", "config"]).check().stdout)

    def requeue(self, job_id: str) -> None:
        self._scontrol(job_id, "requeue", job_id)

    def requeuehold(self, job_id: str) -> None:
        self._scontrol(job_id, "requeuehold", job_id)

    def release(self, job_id: str) -> None:
        self._scontrol(job_id, "release", job_id)

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=J Key=Value ...`` (e.g. ``StartTime="now+60"``,
        ``ExcNodeList="n1,n2"``).

        Raises:
            SchedulerError: Slurm refused; the message says the site restricts the update.
        """
        self._scontrol(job_id, "update", f"JobId={job_id}",
                       *(f"{k}={v}" for k, v in sorted(fields.items())))

    def _scontrol(self, job_id: str, *args: str) -> None:
        result = self._run(["scontrol", *args])
        if result.returncode != 0 and _REFUSED.search(result.stderr + result.stdout):
            raise SchedulerError(
                f"Slurm refused `scontrol {' '.join(args)}` for job {job_id}: "
                f"{(result.stderr or result.stdout).strip()}; this site restricts that "
                "operation for users: ask the admins, or resubmit the run instead")
        result.check()

    def scancel(self, job_id: str, *, signal: str | None = None, batch: bool = False,
                full: bool = False) -> bool:
        """Cancel or signal a job; return False when Slurm no longer knows it."""
        argv = ["scancel", *(["--signal", signal] if signal else []),
                *(["--batch"] if batch else []), *(["--full"] if full else []), job_id]
        result = self._run(argv)
        if result.returncode != 0 and _INVALID_JOB.search(result.stderr):
            return False
        result.check()
        return True

    def observe(self, job_id: str) -> Observation:
        """squeue first, then sacct; VANISHED when neither knows the job.

        squeue has no exit status: for a job that ended while the controller still holds it,
        the exit code and signal come from sacct (else ``scontrol show job``).
        """
        for obs in self.squeue([job_id]):
            if obs.job_id == job_id:
                return self._with_exit(obs)
        try:
            found = [o for o in self.sacct([job_id]) if o.job_id == job_id]
        except SchedulerError:
            found = []  # accounting disabled or slurmdbd down: the job is simply not known
        return found[-1] if found else Observation(job_id=job_id, state=SlurmJobState.VANISHED)

    def _with_exit(self, obs: Observation) -> Observation:
        if obs.state in ACTIVE or obs.exit_code is not None:
            return obs
        try:
            found = [o for o in self.sacct([obs.job_id]) if o.job_id == obs.job_id]
        except SchedulerError:
            found = []  # accounting disabled: the controller's own record still has it
        if not found or found[-1].exit_code is None:
            try:
                text = self.scontrol_show_job(obs.job_id).get("ExitCode", "")
            except SchedulerError:
                return obs
            code, sig = parse_exit_code(text)
            return with_exit(obs, code, sig)
        return with_exit(obs, found[-1].exit_code, found[-1].signal)
