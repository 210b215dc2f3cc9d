"""What starts a run's ranks, and the one Slurm step that starts them in ``pmix`` mode (pure).

``agent`` (the default): each node's agent forks its K ranks and hands each its place in the gang
(``HPCRUN_RANK``, ...). ``pmix``: the supervising agent starts one gang-wide step per incarnation,
``srun --mpi=pmix ... python -m hpcrun.runtime.rank.mpitask``, as a site that starts one task per
GPU with an MPI launcher does; each task takes its rank, the world size and the rendezvous from
``MPI.COMM_WORLD`` (:mod:`hpcrun.runtime.rank.mpitask`), and each node's agent still watches,
signals and reports its node's ranks (:mod:`hpcrun.runtime.node.mpigang`).

The spec's ``dist.rank_launcher`` wins over the site's ``rank_launcher``;
:func:`rank_launcher_problem` refuses at submit what ``pmix`` cannot run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpcrun.vocab import Backend, RankLauncher

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.site import SiteConfig

MPITASK_MODULE = "hpcrun.runtime.rank.mpitask"
"""The module each task of a ``pmix`` step runs."""


def rank_launcher(spec: RunSpec, site: SiteConfig) -> RankLauncher:
    """The spec's ``dist.rank_launcher``, else the site's default."""
    return spec.dist.rank_launcher if spec.dist.rank_launcher is not None else site.rank_launcher


def rank_launcher_problem(spec: RunSpec, site: SiteConfig, backend: Backend) -> str | None:
    """Why the run's rank launcher cannot work here, or None (checked at submit)."""
    if rank_launcher(spec, site) is not RankLauncher.PMIX:
        return None
    source = ("dist.rank_launcher" if spec.dist.rank_launcher is not None
              else f"site {site.name!r} rank_launcher")
    if backend != Backend.SLURM:
        return (f"{source} is pmix but the run's backend is {backend}: `srun --mpi=pmix` needs "
                "Slurm; submit to a Slurm site, or set dist.rank_launcher: agent")
    if site.container is not None:
        return (f"{source} is pmix but site {site.name!r} runs its ranks in a container "
                f"({site.container.runtime} image {site.container.image}), which the pmix step "
                "does not enter; set dist.rank_launcher: agent, or use a site without one")
    if spec.script_mode:
        return (f"{source} is pmix but the spec runs a script (script:/command:), which its "
                "node's agent starts as torchrun would; set dist.rank_launcher: agent, or run "
                "an entrypoint (main(ctx))")
    return None


def mpi_step_argv(*, job_id: str, nodes: Sequence[str], tasks_per_node: int, python: Sequence[str],
                  run_dir: str, generation: int, attempt: int, output: str, wait_s: float,
                  extra: Sequence[str] = ()) -> list[str]:
    """The ``srun`` command line of one incarnation's gang-wide ``pmix`` step.

    ``--overlap``: the agents' own step holds the allocation's CPUs; ``-n`` as well as
    ``--ntasks-per-node``: inside a step ``SLURM_NTASKS`` is inherited and wins over
    ``--ntasks-per-node`` alone; ``--kill-on-bad-exit=0``: a failed rank is its agent's to
    report (a fault class, a restart), not a reason for Slurm to kill the others first.
    """
    return [
        "srun", "--mpi=pmix", "--overlap", f"--jobid={job_id}", "-N", str(len(nodes)),
        "-n", str(len(nodes) * tasks_per_node), f"--ntasks-per-node={tasks_per_node}",
        f"--nodelist={','.join(nodes)}", "--distribution=block", "--kill-on-bad-exit=0",
        "--open-mode=append", f"--output={output}", *extra,
        *python, "-m", MPITASK_MODULE, "--run-dir", run_dir, "--generation", str(generation),
        "--attempt", str(attempt), "--wait-s", f"{wait_s:g}",
    ]
