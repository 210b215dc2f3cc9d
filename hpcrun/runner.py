"""Every subprocess hpcrun starts goes through one injected :class:`CommandRunner`.

Unit tests pass :class:`hpcrun.testing.FakeRunner`; they never patch ``subprocess``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hpcrun.errors import SchedulerError


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandResult:
    """What a finished command returned."""

    argv: tuple[str, ...]
    """The command line that ran."""
    returncode: int
    """Its exit status."""
    stdout: str
    """Its standard output, decoded."""
    stderr: str
    """Its standard error, decoded."""

    def check(self) -> CommandResult:
        """Return self, or raise :class:`SchedulerError` naming the command and its stderr."""
        if self.returncode != 0:
            raise SchedulerError(
                f"`{' '.join(self.argv)}` exited {self.returncode}: "
                f"{(self.stderr or self.stdout).strip() or 'no output'}"
            )
        return self


@runtime_checkable
class CommandRunner(Protocol):
    """Runs one command and returns its result; never raises for a non-zero exit."""

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult: ...


class SubprocessRunner:
    """The real runner. ``env`` entries are added to the inherited environment."""

    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self._base_env = dict(base_env) if base_env is not None else None

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        full_env = dict(self._base_env if self._base_env is not None else os.environ)
        full_env.update(env or {})
        try:
            proc = subprocess.run(
                list(argv), input=input, env=full_env, timeout=timeout,
                capture_output=True, text=True, check=False,
            )
        except FileNotFoundError as exc:
            raise SchedulerError(
                f"command not found: {argv[0]!r}; install it or put it on PATH"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SchedulerError(
                f"`{' '.join(argv)}` did not finish within {timeout} s; "
                "the scheduler may be overloaded, retry later"
            ) from exc
        return CommandResult(
            argv=tuple(argv), returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr
        )


SLURM_WRAPPER_ENV = "HPCRUN_SLURM_WRAPPER"
"""A command prefix every Slurm call of the agent runs through (a Pyxis site's agents run in an
image without Slurm's clients: e.g. ``ssh -o BatchMode=yes slurm-gw`` or a site script that runs
its arguments on the host)."""


class PrefixRunner:
    """Runs each command as ``prefix + argv`` through ``inner`` (the result names ``argv``)."""

    def __init__(self, inner: CommandRunner, prefix: Sequence[str]) -> None:
        self._inner = inner
        self._prefix = list(prefix)

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        result = self._inner.run([*self._prefix, *argv], input=input, env=env, timeout=timeout)
        return CommandResult(argv=tuple(argv), returncode=result.returncode,
                             stdout=result.stdout, stderr=result.stderr)


def slurm_runner(environ: Mapping[str, str], inner: CommandRunner | None = None) -> CommandRunner:
    """The runner of an agent's Slurm calls: through :data:`SLURM_WRAPPER_ENV` when set."""
    import shlex

    base = inner if inner is not None else SubprocessRunner()
    prefix = shlex.split(environ.get(SLURM_WRAPPER_ENV, ""))
    return PrefixRunner(base, prefix) if prefix else base
