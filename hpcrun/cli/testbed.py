"""``hpcrun testbed``: a real multi-node Slurm on one machine."""

from __future__ import annotations

import click


@click.group()
def testbed() -> None:
    """Bring up, inspect and tear down a real multi-node Slurm cluster on this machine."""
