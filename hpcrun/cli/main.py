"""Entry point of the ``hpcrun`` command.

Each plane contributes its commands from its own module in this package; this module only
assembles them and maps :class:`hpcrun.errors.HpcrunError` to one clear line and a non-zero exit.
"""

from __future__ import annotations

import sys

import click

from hpcrun.errors import HpcrunError
from hpcrun.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hpcrun")
def cli() -> None:
    """Operable, recoverable multi-node PyTorch training on Slurm.

    \b
    Typical session on a login node:
      hpcrun submit run.yaml        freeze the spec, create the run record, sbatch the gang
      hpcrun status RUN             state, generation, step, last checkpoint, ETTR
      hpcrun report RUN -o r.html   timeline, per-rank step times, waste breakdown
    Without Slurm, `hpcrun submit --backend local` runs the same gang as local processes.
    """


def _register() -> None:
    from hpcrun.cli import data as data_cmds
    from hpcrun.cli import run as run_cmds
    from hpcrun.cli import testbed as testbed_cmds

    cli.add_command(data_cmds.data)

    for command in run_cmds.COMMANDS:
        cli.add_command(command)
    cli.add_command(testbed_cmds.testbed)
    from hpcrun.cli import ckpt as ckpt_cmds

    cli.add_command(ckpt_cmds.ckpt)
    from hpcrun.cli import observe as observe_cmds

    for observe_command in observe_cmds.COMMANDS:
        cli.add_command(observe_command)
    from hpcrun.cli import sweep as sweep_cmds

    for sweep_command in sweep_cmds.COMMANDS:
        cli.add_command(sweep_command)
    from hpcrun.cli import spec as spec_cmds

    cli.add_command(spec_cmds.spec)
    from hpcrun.cli import drill as drill_cmds

    for drill_command in drill_cmds.COMMANDS:
        cli.add_command(drill_command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; an :class:`HpcrunError` becomes one line on stderr and its exit code."""
    try:
        rv = cli.main(args=argv, prog_name="hpcrun", standalone_mode=False)
    except HpcrunError as exc:
        click.echo(f"hpcrun: error: {_one_per_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("hpcrun: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    # Without standalone mode click returns ctx.exit(n)'s code instead of exiting.
    if isinstance(rv, int):
        sys.exit(rv)


def _one_per_line(message: str) -> str:
    """A message of several problems (every invalid key of a spec) as one indented line each
    under the first, so each reads on its own."""
    first, *rest = message.split("\n")
    return "\n".join([first, *(ln if ln[:1].isspace() else f"  {ln}" for ln in rest)])


if __name__ == "__main__":
    main()
