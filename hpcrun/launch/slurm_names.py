"""Do the partition, account and QoS a job asks for exist? Queries, parsers and verdicts.

``sbatch`` refuses a job naming an unknown partition, an account the user has no association
with, or a QoS that does not exist, but only once hpcrun has already created the run. These
helpers ask first: ``sinfo`` for the partitions, ``sacctmgr`` for the user's associations and
the QoS names. The parsers and verdicts are pure; each query is one call through the injected
:class:`~hpcrun.runner.CommandRunner` and returns None (with the reason) when the command is not
available here (no Slurm client, no accounting database), so the check is skipped, never failed.

Slurm keeps account and QoS names in lower case in its database (``sacctmgr`` prints them so and
``sbatch`` accepts any case): they are compared case-insensitively; partitions are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcrun.errors import SchedulerError
from hpcrun.launch.admission import CheckKind, Finding, Passed, Problem, Skipped
from hpcrun.runner import CommandRunner

SINFO_PARTITIONS = ("sinfo", "--all", "--noheader", "--format=%R")
"""Every partition, hidden ones included (a hidden partition may still be usable)."""
SACCTMGR_QOS = ("sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=Name")
ASSOC_FORMAT = "format=Account,Partition,QOS"
_CHECK = CheckKind.SCHEDULER


def sacctmgr_associations_argv(user: str) -> list[str]:
    """``sacctmgr`` listing ``user``'s associations as ``Account|Partition|QOS`` lines."""
    return ["sacctmgr", "--noheader", "--parsable2", "show", "associations", f"user={user}",
            ASSOC_FORMAT]


@dataclass(frozen=True, kw_only=True, slots=True)
class Association:
    """One of the user's associations: an account, optionally limited to a partition."""

    account: str
    """Account name (lower case, as the database keeps it)."""
    partition: str
    """Partition the association is limited to; "" for every partition."""
    qos: tuple[str, ...]
    """QoS names the association may use (empty: the cluster default applies)."""


def parse_partitions(text: str) -> frozenset[str]:
    """Partition names from ``sinfo --noheader --format=%R`` (one per line, repeated once per
    node state)."""
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def parse_associations(text: str) -> list[Association]:
    """Associations from ``sacctmgr --noheader --parsable2 show associations ... format=Account,
    Partition,QOS`` (``Account|Partition|QOS``, QoS names comma-separated)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0]:
            continue
        account, partition, qos = parts
        out.append(Association(account=account.lower(), partition=partition,
                               qos=tuple(q.lower() for q in qos.split(",") if q)))
    return out


def parse_qos_names(text: str) -> frozenset[str]:
    """QoS names from ``sacctmgr --noheader --parsable2 show qos format=Name``."""
    return frozenset(line.strip().lower() for line in text.splitlines() if line.strip())


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmAsk:
    """The partition, account and QoS a job's ``sbatch`` flags name (None: Slurm's default)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None

    @classmethod
    def from_args(cls, args: Sequence[tuple[str, str]]) -> SlurmAsk:
        """From :func:`hpcrun.launch.sbatch.sbatch_args`' ``(flag, value)`` pairs."""
        flags = dict(args)
        return cls(partition=flags.get("partition"), account=flags.get("account"),
                   qos=flags.get("qos"))


def check_partition(partition: str | None, known: frozenset[str]) -> Finding:
    """Whether the job's partition is one ``sinfo`` lists."""
    if partition is None:
        return Passed(check=_CHECK, what="no partition named: Slurm picks its default partition")
    if partition in known:
        return Passed(check=_CHECK, what=f"partition {partition!r} exists")
    return Problem(check=_CHECK, what=f"partition {partition!r} does not exist on this cluster",
                   expected=f"one of {', '.join(sorted(known)) or '(none listed)'}",
                   fix="set resources.partition in the spec (or partition in the site config)")


def check_account(account: str | None, assocs: Sequence[Association]) -> Finding:
    """Whether the user has an association with the job's account."""
    if account is None:
        return Passed(check=_CHECK, what="no account named: Slurm charges your default account")
    mine = sorted({a.account for a in assocs})
    if not mine:
        return Skipped(check=_CHECK, what=f"account {account!r} not checked: sacctmgr lists no "
                                          "associations for you")
    if account.lower() in mine:
        return Passed(check=_CHECK, what=f"account {account!r} is one of yours")
    return Problem(check=_CHECK, what=f"account {account!r} is not one of your Slurm accounts",
                   expected=f"one of {', '.join(mine)}",
                   fix="set resources.account in the spec (or account in the site config)")


def check_qos(ask: SlurmAsk, names: frozenset[str], assocs: Sequence[Association]) -> Finding:
    """Whether the job's QoS exists and, when its account's associations limit the QoS, is
    allowed there."""
    if ask.qos is None:
        return Passed(check=_CHECK, what="no QoS named: the association's default applies")
    qos = ask.qos.lower()
    if qos not in names:
        return Problem(check=_CHECK, what=f"QoS {ask.qos!r} does not exist on this cluster",
                       expected=f"one of {', '.join(sorted(names)) or '(none listed)'}",
                       fix="set resources.qos in the spec (or qos in the site config)")
    account = ask.account.lower() if ask.account else None
    allowed = sorted({q for a in assocs if account in (None, a.account) for q in a.qos})
    if allowed and qos not in allowed:
        whose = f"account {ask.account!r}" if ask.account else "your associations"
        return Problem(check=_CHECK, what=f"QoS {ask.qos!r} is not allowed for {whose}",
                       expected=f"one of {', '.join(allowed)}",
                       fix="pick an allowed QoS, or ask the site to add it to the association")
    return Passed(check=_CHECK, what=f"QoS {ask.qos!r} exists")


def query(runner: CommandRunner, argv: Sequence[str], *, timeout: float = 30.0
          ) -> tuple[str | None, str]:
    """Run one query; ``(stdout, "")``, or ``(None, why)`` when it is not available here."""
    try:
        result = runner.run(list(argv), timeout=timeout)
    except SchedulerError as exc:  # not installed, or no answer in time
        return None, str(exc)
    if result.returncode != 0:
        why = (result.stderr or result.stdout).strip().splitlines()[:1] or ["no output"]
        return None, f"`{' '.join(argv[:2])} ...` exited {result.returncode}: {why[0]}"
    return result.stdout, ""


def scheduler_findings(ask: SlurmAsk, runner: CommandRunner, *, user: str) -> list[Finding]:
    """Partition, account and QoS verdicts for ``ask``; a check whose query is not available
    here is skipped with the reason."""
    if ask == SlurmAsk():
        return [Passed(check=_CHECK, what="the job names no partition, account or QoS: "
                                           "Slurm's defaults apply")]
    out: list[Finding] = []
    text, why = query(runner, SINFO_PARTITIONS) if ask.partition else ("", "")
    out.append(check_partition(ask.partition, parse_partitions(text)) if text is not None else
               Skipped(check=_CHECK, what=f"partition {ask.partition!r} not checked: {why}"))
    if ask.account is None and ask.qos is None:
        return [*out, check_account(None, ()), check_qos(ask, frozenset(), ())]
    text, why = query(runner, sacctmgr_associations_argv(user))
    if text is None:
        names = " and ".join(f"{k} {v!r}" for k, v in (("account", ask.account),
                                                       ("QoS", ask.qos)) if v)
        return [*out, Skipped(check=_CHECK, what=f"{names} not checked: {why}")]
    assocs = parse_associations(text)
    out.append(check_account(ask.account, assocs))
    if ask.qos is None:
        return [*out, check_qos(ask, frozenset(), assocs)]
    text, why = query(runner, SACCTMGR_QOS)
    out.append(check_qos(ask, parse_qos_names(text), assocs) if text is not None else
               Skipped(check=_CHECK, what=f"QoS {ask.qos!r} not checked: {why}"))
    return out
