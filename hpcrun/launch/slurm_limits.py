"""Does the job fit the partition's and the QoS's limits? Queries, parsers and verdicts.

A job over its partition's ``MaxTime`` or ``MaxNodes``, larger than the partition, asking for more
GPUs per node than its nodes have, or over its QoS's or association's ``MaxWall``/``MaxTRES``
passes ``sbatch`` only to wait in the queue forever (``PartitionTimeLimit``,
``QOSMaxNodePerJobLimit``...) or to be refused after the run was created. These checks ask first:
``scontrol show partition`` and ``scontrol show node`` for the partition's limits and its nodes'
GPUs, ``sacctmgr show qos``/``show associations`` for the QoS and association limits, and
``sbatch --test-only`` for Slurm's own word on the whole request. Parsers and verdicts are pure;
each query goes through the injected runner (:func:`hpcrun.launch.slurm_names.query`) and a query
that is not available here (no Slurm client, no accounting) skips its check with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcrun.errors import SchedulerError
from hpcrun.launch.admission import CheckKind, Finding, Passed, Problem, Skipped
from hpcrun.launch.slurm_names import query
from hpcrun.runner import CommandRunner

SCONTROL_PARTITIONS = ("scontrol", "--oneliner", "show", "partition")
SCONTROL_NODES = ("scontrol", "--oneliner", "show", "node")
QOS_LIMITS_FORMAT = "format=Name,MaxWall,MaxTRESPerJob"
SACCTMGR_QOS_LIMITS = ("sacctmgr", "--noheader", "--parsable2", "show", "qos", QOS_LIMITS_FORMAT)
ASSOC_LIMITS_FORMAT = "format=Account,Partition,MaxWall,MaxTRES"
_CHECK = CheckKind.SCHEDULER
_UNLIMITED = frozenset({"", "UNLIMITED", "INFINITE", "NONE", "N/A", "(null)"})
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def sacctmgr_assoc_limits_argv(user: str) -> list[str]:
    """``sacctmgr`` listing ``user``'s associations with their wall and TRES limits."""
    return ["sacctmgr", "--noheader", "--parsable2", "show", "associations", f"user={user}",
            ASSOC_LIMITS_FORMAT]


@dataclass(frozen=True, kw_only=True, slots=True)
class JobAsk:
    """What the job asks Slurm for, from :func:`hpcrun.launch.sbatch.sbatch_args`."""

    partition: str | None = None
    """``--partition`` (None: the cluster's default partition)."""
    qos: str | None = None
    """``--qos`` (None: the association's default)."""
    account: str | None = None
    """``--account`` (None: the user's default account)."""
    nodes: int = 1
    """The most nodes the job may get (the top of an elastic ``min-max`` range)."""
    time_min: int = 60
    """``--time`` in minutes."""
    gpus_per_node: int = 0
    """GPUs asked per node (``--gpus-per-node`` or ``--gres=gpu:N``)."""

    @classmethod
    def from_args(cls, args: Sequence[tuple[str, str]]) -> JobAsk:
        """From ``sbatch_args``' ``(flag, value)`` pairs."""
        flags = dict(args)
        gres = _GPU_GRES.search(flags.get("gres", ""))
        gpus = flags.get("gpus-per-node") or (gres.group(1) if gres else "0")
        nodes = flags.get("nodes", "1").split("-")[-1]
        return cls(partition=flags.get("partition"), qos=flags.get("qos"),
                   account=flags.get("account"), nodes=int(nodes),
                   time_min=parse_minutes(flags.get("time", "60")) or 60,
                   gpus_per_node=int(gpus.rsplit(":", 1)[-1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionLimits:
    """One partition's limits, as ``scontrol show partition`` prints them."""

    name: str
    """Partition name."""
    default: bool = False
    """Whether jobs that name no partition land here."""
    max_time_min: int | None = None
    """``MaxTime`` in minutes (None: unlimited)."""
    max_nodes: int | None = None
    """``MaxNodes`` per job (None: unlimited)."""
    total_nodes: int = 0
    """``TotalNodes``: no job gets more nodes than the partition has."""
    qos: str | None = None
    """The partition's own QoS (``QoS=``), whose limits apply on top of the job's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TresLimits:
    """A QoS's or an association's limits that a single job meets."""

    name: str
    """The QoS name, or ``account`` / ``account@partition`` for an association."""
    max_wall_min: int | None = None
    """``MaxWall`` in minutes (None: unlimited)."""
    max_tres_per_job: Mapping[str, int] = field(default_factory=dict)
    """``MaxTRESPerJob`` (``node``, ``cpu``, ``gres/gpu`` ...)."""


def parse_minutes(text: str) -> int | None:
    """Minutes of a Slurm time (``30``, ``1:00:00``, ``2-12``, ``1-00:00:00``); None for
    unlimited or what is not a time. Minutes alone (``30``) are minutes, as ``--time`` reads them;
    ``MM:SS`` rounds seconds up."""
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return None
    m = _TIME.match(text)
    if m is None:
        return None
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        return days * 1440 + (a or 0) * 60 + (b or 0) + (1 if c else 0)
    if c is not None:  # H:M:S
        return (a or 0) * 60 + (b or 0) + (1 if c else 0)
    if b is not None:  # M:S
        return (a or 0) + (1 if b else 0)
    return a


def _fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol --oneliner`` line (values have no spaces)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def parse_partition_limits(text: str) -> dict[str, PartitionLimits]:
    """Partitions by name from ``scontrol --oneliner show partition``."""
    out = {}
    for line in text.splitlines():
        f = _fields(line)
        if "PartitionName" not in f:
            continue
        qos = f.get("QoS", "")
        out[f["PartitionName"]] = PartitionLimits(
            name=f["PartitionName"], default=f.get("Default") == "YES",
            max_time_min=parse_minutes(f.get("MaxTime", "")), max_nodes=_count(f.get("MaxNodes")),
            total_nodes=_count(f.get("TotalNodes")) or 0,
            qos=None if qos.upper() in _UNLIMITED else qos.lower())
    return out


def parse_node_gpus(text: str) -> dict[str, tuple[int, frozenset[str]]]:
    """Each node's GPU count and partitions from ``scontrol --oneliner show node``."""
    out = {}
    for line in text.splitlines():
        f = _fields(line)
        if "NodeName" not in f:
            continue
        gpus = sum(int(n) for n in _GPU_GRES.findall(f.get("Gres", "")))
        parts = frozenset(p for p in f.get("Partitions", "").split(",") if p)
        out[f["NodeName"]] = (gpus, parts)
    return out


def parse_tres(text: str) -> dict[str, int]:
    """``node=2,cpu=8,gres/gpu=4`` as a mapping (entries that are not counts are left out)."""
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key and value.isdigit():
            out[key.strip()] = int(value)
    return out


def parse_qos_limits(text: str) -> dict[str, TresLimits]:
    """QoS limits by name from ``sacctmgr --noheader --parsable2 show qos`` with
    :data:`QOS_LIMITS_FORMAT` (``Name|MaxWall|MaxTRESPerJob``)."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0]:
            continue
        name = parts[0].lower()
        out[name] = TresLimits(name=name, max_wall_min=parse_minutes(parts[1]),
                               max_tres_per_job=parse_tres(parts[2]))
    return out


def parse_assoc_limits(text: str) -> list[TresLimits]:
    """Association limits from ``sacctmgr ... show associations`` with
    :data:`ASSOC_LIMITS_FORMAT` (``Account|Partition|MaxWall|MaxTRES``)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[0]:
            continue
        name = parts[0].lower() + (f"@{parts[1]}" if parts[1] else "")
        out.append(TresLimits(name=name, max_wall_min=parse_minutes(parts[2]),
                              max_tres_per_job=parse_tres(parts[3])))
    return out


def _over(what: str, asked: str, limit: str, fix: str) -> Problem:
    return Problem(check=_CHECK, what=f"{what}: the job asks for {asked}",
                   expected=f"at most {limit}", fix=fix)


def check_partition_limits(ask: JobAsk, part: PartitionLimits,
                           gpus: Mapping[str, tuple[int, frozenset[str]]]) -> list[Finding]:
    """The job against its partition: ``MaxTime``, ``MaxNodes``, its size and its nodes' GPUs."""
    where = f"partition {part.name!r}"
    out: list[Finding] = []
    if part.max_time_min is not None and ask.time_min > part.max_time_min:
        out.append(_over(f"time limit over {where}'s MaxTime", f"{ask.time_min} min",
                         f"{part.max_time_min} min", "lower resources.time_limit_min (a long "
                         "run goes on in segments: it requeues at each time limit)"))
    if part.max_nodes is not None and ask.nodes > part.max_nodes:
        out.append(_over(f"more nodes than {where}'s MaxNodes", f"{ask.nodes} nodes",
                         f"{part.max_nodes}", "lower resources.nodes (+ spare_nodes) or pick "
                         "another partition"))
    if part.total_nodes and ask.nodes > part.total_nodes:
        out.append(_over(f"more nodes than {where} has", f"{ask.nodes} nodes",
                         f"{part.total_nodes}", "lower resources.nodes (+ spare_nodes) or pick "
                         "a larger partition"))
    if ask.gpus_per_node:
        have = max((n for n, parts in gpus.values() if part.name in parts), default=0)
        if ask.gpus_per_node > have:
            out.append(_over(f"more GPUs per node than {where}'s nodes have (their Gres)",
                             f"{ask.gpus_per_node} GPUs per node", f"{have}",
                             "lower resources.gpus_per_node or pick a GPU partition"))
    return out or [Passed(check=_CHECK, what=f"the job fits {where}'s limits")]


def check_tres_limits(ask: JobAsk, limits: TresLimits, *, kind: str) -> list[Finding]:
    """The job against a QoS's (``kind="QoS"``) or an association's wall and per-job TRES."""
    where = f"{kind} {limits.name!r}"
    out: list[Finding] = []
    if limits.max_wall_min is not None and ask.time_min > limits.max_wall_min:
        out.append(_over(f"time limit over {where}'s MaxWall", f"{ask.time_min} min",
                         f"{limits.max_wall_min} min", "lower resources.time_limit_min or pick "
                         "another QoS"))
    tres = limits.max_tres_per_job
    if "node" in tres and ask.nodes > tres["node"]:
        out.append(_over(f"more nodes than {where}'s MaxTRESPerJob", f"{ask.nodes} nodes",
                         f"node={tres['node']}", "lower resources.nodes or pick another QoS"))
    gpus = ask.gpus_per_node * ask.nodes
    if "gres/gpu" in tres and gpus > tres["gres/gpu"]:
        out.append(_over(f"more GPUs than {where}'s MaxTRESPerJob", f"{gpus} GPUs",
                         f"gres/gpu={tres['gres/gpu']}", "ask for fewer GPUs or pick another QoS"))
    return out


def parse_test_only(returncode: int, stderr: str) -> Finding:
    """Slurm's own word from ``sbatch --test-only``: it prints where and when the job would start,
    or why it cannot (``allocation failure: ...``, ``sbatch: error: ...``). No sbatch here (exit
    127) or no controller to ask skips the check."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    first = lines[0] if lines else "no output"
    if returncode == 0:
        said = next((ln for ln in lines if "to start at" in ln), "accepted")
        return Passed(check=_CHECK, what=f"sbatch --test-only: {said.removeprefix('sbatch: ')}")
    if returncode == 127 or any(p in first for p in _UNREACHABLE):
        return Skipped(check=_CHECK, what=f"sbatch --test-only not checked: {first}")
    said = next((ln for ln in lines if "error" in ln or "failure" in ln), first)
    return Problem(check=_CHECK, what=f"Slurm refuses the job: {said.removeprefix('sbatch: ')}",
                   fix="change what the message names (this is sbatch --test-only's answer)")


_UNREACHABLE = ("command not found", "Unable to contact slurm controller",
                "Could not establish a configuration source")
"""What ``sbatch`` says when there is no controller to ask: the check is skipped, not failed."""


def sbatch_test_only_argv(args: Sequence[tuple[str, str]]) -> list[str]:
    """``sbatch --test-only`` with the job's own flags and a no-op script."""
    flags = [f"--{k}" if v == "" else f"--{k}={v}" for k, v in args if k not in _RUN_FLAGS]
    return ["sbatch", "--test-only", *flags, "--wrap=true"]


_RUN_FLAGS = frozenset({"output", "error", "open-mode", "comment", "chdir"})
"""Flags about where the job writes, not what it asks for: left out of the test."""


def limit_findings(ask: JobAsk, args: Sequence[tuple[str, str]], runner: CommandRunner, *,
                   user: str) -> list[Finding]:
    """Every limit verdict for the job; a check whose query is not available is skipped."""
    text, why = query(runner, SCONTROL_PARTITIONS)
    if text is None:
        return [Skipped(check=_CHECK, what=f"partition limits not checked: {why}")]
    parts = parse_partition_limits(text)
    part = parts.get(ask.partition) if ask.partition else next(
        (p for p in parts.values() if p.default), None)
    out: list[Finding] = []
    if part is not None:
        nodes, why = query(runner, SCONTROL_NODES) if ask.gpus_per_node else ("", "")
        out += check_partition_limits(ask, part, parse_node_gpus(nodes or ""))
    out += _qos_findings(ask, part, runner)
    out += _assoc_findings(ask, runner, user=user)
    return [*out, _test_only(args, runner)]


def _qos_findings(ask: JobAsk, part: PartitionLimits | None,
                  runner: CommandRunner) -> list[Finding]:
    names = [q for q in (ask.qos.lower() if ask.qos else None, part.qos if part else None) if q]
    if not names:
        return []
    text, why = query(runner, SACCTMGR_QOS_LIMITS)
    if text is None:
        return [Skipped(check=_CHECK, what=f"QoS limits not checked: {why}")]
    qos = parse_qos_limits(text)
    return [f for name in names if name in qos for f in check_tres_limits(ask, qos[name],
                                                                          kind="QoS")]


def _assoc_findings(ask: JobAsk, runner: CommandRunner, *, user: str) -> list[Finding]:
    text, why = query(runner, sacctmgr_assoc_limits_argv(user))
    if text is None:
        return [Skipped(check=_CHECK, what=f"association limits not checked: {why}")]
    mine = [a for a in parse_assoc_limits(text) if association_applies(a.name, ask)]
    return [f for a in mine for f in check_tres_limits(ask, a, kind="association")]


def association_applies(name: str, ask: JobAsk) -> bool:
    """Whether the association ``account`` or ``account@partition`` governs the job (every
    association of the user when the job names no account)."""
    account, _, partition = name.partition("@")
    if ask.account is not None and account != ask.account.lower():
        return False
    return not partition or ask.partition is None or partition == ask.partition


def _test_only(args: Sequence[tuple[str, str]], runner: CommandRunner) -> Finding:
    try:
        result = runner.run(sbatch_test_only_argv(args), timeout=30.0)
    except SchedulerError as exc:
        return Skipped(check=_CHECK, what=f"sbatch --test-only not run: {exc}")
    return parse_test_only(result.returncode, result.stderr)
