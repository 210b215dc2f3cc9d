"""``hpcrun testbed``: a real multi-node Slurm on one machine."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from hpcrun.errors import TestbedError
from hpcrun.testbed import Testbed, TestbedConfig
from hpcrun.testbed.config import (
    LANE_ENV,
    MAX_LANES,
    STATE_DIR_ENV,
    TESTBED_FILE,
    default_lane,
    default_state_dir,
    lane_config,
    render_env_exports,
    state_dir_of_slurm_conf,
)

_STATE_DIR_HELP = "State directory [env HPCRUN_TESTBED_DIR; default /var/lib/hpcrun-testbed]."
_LANE_HELP = (f"Which of up to {MAX_LANES} testbeds side by side (own state dir <DIR>-laneK, "
              "ports, job ids; lane 0 is the plain one) [env HPCRUN_TESTBED_LANE; default 0].")


def _config(state_dir: str | None, lane: int | None, **fields: object) -> TestbedConfig:
    base = Path(os.path.abspath(state_dir)) if state_dir else default_state_dir(os.environ)
    return lane_config(base, default_lane(os.environ) if lane is None else lane,
                       **fields)  # type: ignore[arg-type]


def _existing(state_dir: str | None, lane: int | None, *, must_exist: bool = False) -> Testbed:
    """The testbed named by ``--state-dir``/``--lane`` or their variables; without any, the one
    this shell's ``SLURM_CONF`` points at (a lane's clients reach their own), else lane 0.

    A ``--state-dir`` that holds a testbed already (a lane's own directory, as ``hpcrun testbed
    up`` printed it) is that testbed, whatever ``$HPCRUN_TESTBED_LANE`` says. ``must_exist``
    (crash, boot): a testbed that was never brought up is refused, so a crash never silently
    acts on nothing."""
    if state_dir is not None and lane is None and \
            (Path(state_dir) / TESTBED_FILE).is_file():
        return Testbed.from_state_dir(Path(os.path.abspath(state_dir)))
    named = state_dir is not None or lane is not None or any(
        os.environ.get(k) for k in (STATE_DIR_ENV, LANE_ENV))
    pointed = None if named else state_dir_of_slurm_conf(os.environ.get("SLURM_CONF", ""))
    where = pointed or _config(state_dir, lane).state_dir
    if must_exist and not (where / TESTBED_FILE).is_file():
        raise TestbedError(f"no testbed at {where} (no {TESTBED_FILE}); bring it up with "
                           "`hpcrun testbed up` (with the same --state-dir/--lane), or name the "
                           "one that is up with --state-dir")
    return Testbed.from_state_dir(where)


def state_dir_option(fn: Callable[..., None]) -> Callable[..., None]:
    """``--state-dir`` and ``--lane``: which testbed a command acts on."""
    fn = click.option("--lane", type=click.IntRange(0, MAX_LANES - 1), default=None,
                      help=_LANE_HELP)(fn)
    return click.option("--state-dir", metavar="DIR", default=None, help=_STATE_DIR_HELP)(fn)


@click.group()
def testbed() -> None:
    """Run a real multi-node Slurm cluster on this machine.

    \b
    munged, MariaDB + slurmdbd, slurmctld and N slurmd run on this host; each slurmd lives in
    its own UTS + mount namespace (hostname nodeK, private /etc/hosts, its own node-local
    directory). Needs root. Point clients at it with:
      eval "$(hpcrun testbed env)"
    """


@testbed.command(short_help="Start the testbed, or verify it when already up.")
@click.option("-N", "--nodes", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Number of compute nodes (node1..nodeN).")
@click.option("--no-accounting", is_flag=True,
              help="Skip MariaDB and slurmdbd (sacct will not work).")
@click.option("--grace-time", type=click.IntRange(0, 3600), default=15, show_default=True,
              metavar="SECONDS", help="GraceTime of the preemptible batch partition.")
@state_dir_option
def up(nodes: int, no_accounting: bool, grace_time: int, state_dir: str | None,
       lane: int | None) -> None:
    """Start the testbed (installing Slurm if missing); verify it if it is already up."""
    config = _config(state_dir, lane, nodes=nodes, accounting=not no_accounting,
                     grace_time=grace_time)
    result = Testbed(config).up()
    if result.cold:
        what = "started"
    elif result.started:
        what = f"repaired (restarted {', '.join(result.started)})"
    else:
        what = "already up"
    click.echo(f"testbed {what} in {result.seconds:.1f} s: {config.nodes} nodes, "
               f"partitions batch (default, preemptible) and high")
    click.echo(f"  slurm.conf  {config.slurm_conf}")
    click.echo(f"  shared      {config.shared_dir}  (same path on host and nodes)")
    click.echo(f"  node-local  {config.node_local_path} inside jobs "
               f"(host: {config.state_dir}/nodes/nodeK/local)")
    click.echo(f"  logs        {config.log_dir}")
    click.echo("Point clients at it:")
    click.echo(f"  export SLURM_CONF={config.slurm_conf}")


@testbed.command(short_help="Stop the testbed and wipe job state.")
@state_dir_option
def down(state_dir: str | None, lane: int | None) -> None:
    """Stop every daemon the testbed started and wipe job state (packages stay installed)."""
    tb = _existing(state_dir, lane)
    stopped = tb.down()
    click.echo(f"testbed down: stopped {', '.join(stopped)}" if stopped
               else "testbed down: nothing was running")


@testbed.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@state_dir_option
def status(as_json: bool, state_dir: str | None, lane: int | None) -> None:
    """Show daemons (with pids) and node states. Exits 1 when the testbed is not fully up."""
    st = _existing(state_dir, lane).status()
    click.echo(st.to_json() if as_json else st.to_text())
    if not st.up:
        sys.exit(1)


@testbed.command(short_help="Emulate power loss of NODE (SIGKILL everything on it).")
@click.argument("node")
@state_dir_option
def crash(node: str, state_dir: str | None, lane: int | None) -> None:
    """Emulate power loss of NODE: SIGKILL its slurmd and every process on it.

    Slurm marks the node DOWN after SlurmdTimeout (10 s); --requeue jobs are requeued.
    """
    killed = _existing(state_dir, lane, must_exist=True).crash(node)
    click.echo(f"{node}: killed {len(killed)} processes" + (f" ({killed})" if killed else ""))


@testbed.command()
@click.argument("node")
@state_dir_option
def boot(node: str, state_dir: str | None, lane: int | None) -> None:
    """Start NODE's slurmd in a fresh namespace and return it to service."""
    _existing(state_dir, lane, must_exist=True).boot(node)
    click.echo(f"{node}: up and resumed")


@testbed.command()
@state_dir_option
def env(state_dir: str | None, lane: int | None) -> None:
    """Print export lines for clients: eval "$(hpcrun testbed env)"."""
    click.echo(render_env_exports(_existing(state_dir, lane).config), nl=False)
