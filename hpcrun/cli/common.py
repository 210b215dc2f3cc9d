"""Click pieces the command modules share: the choices of ``--backend`` and ``--verify-data``,
and this process's submission context."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from hpcrun.vocab import Backend

if TYPE_CHECKING:
    from hpcrun.launch.submission import SubmitContext

BACKENDS = (Backend.SLURM.value, Backend.LOCAL.value)
"""``--backend`` choices."""
VERIFY_DATA = ("all", "sample", "none")
"""``--verify-data`` choices."""


def submit_context() -> SubmitContext:
    """This process's submission context (:mod:`hpcrun.launch.submission`), wired to the
    runtime's agent; notices and warnings are printed on stderr."""
    from hpcrun.launch.submission import SubmitContext
    from hpcrun.runtime.agent import agent_main
    from hpcrun.runtime.faults import parse_injections

    return SubmitContext.from_process(agent_entry=agent_main, check_faults=parse_injections,
                                      warn=warn)


def warn(line: str) -> None:
    """Print a notice on stderr."""
    click.echo(line, err=True)
