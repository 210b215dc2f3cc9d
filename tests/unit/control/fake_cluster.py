"""A tiny in-memory Slurm behind the CommandRunner seam, for reconcile and cancel tests.

It answers squeue/sacct/sbatch/scontrol/scancel with the output formats of Slurm 22.05 that
``hpcrun.scheduler.slurm`` asks for (see tests/unit/scheduler/golden/ for captured real outputs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcrun.runner import CommandResult


@dataclass
class Job:
    state: str = "PENDING"
    reason: str = "None"
    nodes: str = ""
    comment: str = ""
    exit: str = "0:0"
    in_controller: bool = True
    fields: dict[str, str] = field(default_factory=dict)


class FakeCluster:
    """Records every argv in ``calls``; ``jobs`` is the cluster state."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.calls: list[tuple[str, ...]] = []
        self.next_id = 200
        self.refuse_update = False
        self.node_states: dict[str, str] = {}

    def run(self, argv: Sequence[str], *, input: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float | None = None) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        handler = getattr(self, f"_{argv[0]}")
        rc, out, err = handler(list(argv[1:]))
        return CommandResult(argv=argv, returncode=rc, stdout=out, stderr=err)

    def count(self, *prefix: str) -> int:
        return sum(1 for c in self.calls if c[:len(prefix)] == prefix)

    def _squeue(self, args: list[str]) -> tuple[int, str, str]:
        if "-j" in args:
            ids = args[args.index("-j") + 1].split(",")
            known = [i for i in ids if i in self.jobs and self.jobs[i].in_controller]
            if len(ids) == 1 and not known:
                return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        else:
            known = [i for i, j in self.jobs.items() if j.in_controller]
        lines = [f"{i}|{self.jobs[i].state}|{self.jobs[i].reason}|{self.jobs[i].nodes}|"
                 f"{self.jobs[i].comment or '(null)'}" for i in known]
        return 0, "".join(line + "\n" for line in lines), ""

    def _sacct(self, args: list[str]) -> tuple[int, str, str]:
        ids = args[args.index("-j") + 1].split(",")
        lines = [f"{i}|{j.state}|{j.exit}|{j.reason}|{j.nodes or 'None assigned'}|"
                 for i, j in self.jobs.items() if i in ids]
        return 0, "".join(line + "\n" for line in lines), ""

    def _sbatch(self, args: list[str]) -> tuple[int, str, str]:
        job_id = str(self.next_id)
        self.next_id += 1
        comment = next((a.split("=", 1)[1] for a in args if a.startswith("--comment=")), "")
        self.jobs[job_id] = Job(comment=comment,
                                fields={a.split("=", 1)[0]: a.split("=", 1)[-1] for a in args})
        return 0, f"{job_id}\n", ""

    def _sinfo(self, args: list[str]) -> tuple[int, str, str]:
        names = args[args.index("-n") + 1].split(",")
        return 0, "".join(f"{n}|{self.node_states.get(n, 'idle')}\n" for n in names), ""

    def _scontrol(self, args: list[str]) -> tuple[int, str, str]:
        verb = args[0]
        if args[:2] == ["show", "config"]:
            return 0, "MessageTimeout          = 10 sec\nSlurmdTimeout           = 10 sec\n", ""
        if args[:2] == ["show", "job"]:
            job = self.jobs[args[-1]]
            return 0, (f"JobId={args[-1]} JobState={job.state} "
                       f"EndTime={job.fields.get('EndTime', 'Unknown')}\n"), ""
        if verb == "update":
            job_id = args[1].split("=", 1)[1]
            if self.refuse_update:
                return 1, "", f"Access/permission denied for job {job_id}\n"
            for kv in args[2:]:
                key, _, value = kv.partition("=")
                self.jobs[job_id].fields[key] = value
                if key == "Comment":
                    self.jobs[job_id].comment = value
            return 0, "", ""
        job = self.jobs.get(args[1])
        if job is None or not job.in_controller:
            return 1, "", "Invalid job id specified\n"
        if verb == "requeuehold":
            job.state, job.reason, job.nodes = "PENDING", "job requeued in held state", ""
        elif verb == "release":
            job.reason = "BeginTime" if "StartTime" in job.fields else "None"
        elif verb == "requeue":
            job.state, job.reason = "PENDING", "None"
        return 0, "", ""

    def _scancel(self, args: list[str]) -> tuple[int, str, str]:
        job = self.jobs.get(args[-1])
        if job is None:
            return 1, "", f"scancel: error: Kill job error on job id {args[-1]}: " \
                          "Invalid job id specified\n"
        job.state = "CANCELLED"
        return 0, "", ""
