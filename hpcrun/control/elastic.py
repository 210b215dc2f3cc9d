"""Elastic membership, pure: which gang sizes a run may continue on, and how the global batch
is kept at each of them.

A run with ``membership: {mode: elastic, min_nodes: m}`` and ``resources.nodes: N`` runs its
gang on any node count ``n`` in ``m..N`` (a lost node with no spare left shrinks it by one in the
same job; a requeued or resubmitted job asks Slurm for ``--nodes=m-N`` and forms the gang on
what it granted).
The world size is then ``n x tasks_per_node`` and node ranks are dense (``0..n-1``).

The global batch and the global sample order stay the same at every size: the data plane's
order is world-size independent and each rank takes ``global_batch / world_size`` rows of
global batch ``k`` (a per-rank batch change, no gradient accumulation), so the resume contract
holds across a shrink. That needs ``global_batch`` to be a multiple of every world size the run
may take: :func:`unkept_world_sizes` names the ones that are not, and the spec refuses them at
submit.

The gang itself is planned here too, as values: the first gang of an allocation
(:func:`initial_gang`), the spares that can take a lost node's place (:func:`usable_spares`), a
gang with spares swapped in (:func:`swap_in`) or shrunk to its survivors (:func:`shrink_gang`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from hpcrun.errors import MembershipError

if TYPE_CHECKING:
    from hpcrun.control.specload import Checks


class _Membership(Protocol):
    @property
    def mode(self) -> str: ...
    @property
    def min_nodes(self) -> int | None: ...


class _Resources(Protocol):
    @property
    def nodes(self) -> int: ...
    @property
    def spare_nodes(self) -> int: ...


class GangSpec(Protocol):
    """What elastic planning reads of a spec (a :class:`~hpcrun.control.spec.RunSpec` is one):
    its ``membership`` and its ``resources``."""

    @property
    def membership(self) -> _Membership: ...
    @property
    def resources(self) -> _Resources: ...

ELASTIC = "elastic"
"""``membership.mode`` of a run whose gang may shrink (``MembershipMode.ELASTIC``'s value)."""


def is_elastic(spec: GangSpec) -> bool:
    """Whether the run's gang may continue on fewer nodes than ``resources.nodes``."""
    return spec.membership.mode == ELASTIC


def survives_node_loss(spec: GangSpec) -> bool:
    """Whether a run outlives the loss of a node inside its allocation: it has hot spares to
    swap in, or an elastic membership that lets the gang shrink.

    Such a run's job step is ``--no-kill`` and its agents beat liveness; any other run's node
    loss ends the allocation and requeues.
    """
    return spec.resources.spare_nodes > 0 or is_elastic(spec)


def min_gang_nodes(spec: GangSpec) -> int:
    """The fewest nodes the gang may run on: ``membership.min_nodes`` when elastic, else
    ``resources.nodes``."""
    m = spec.membership.min_nodes
    return int(m) if is_elastic(spec) and m is not None else spec.resources.nodes


def gang_node_counts(min_nodes: int, nodes: int) -> range:
    """Every gang size between ``min_nodes`` and ``nodes``, both included."""
    return range(min(min_nodes, nodes), nodes + 1)


def sbatch_nodes(spec: GangSpec, *, requeue: bool = False) -> str:
    """The ``--nodes`` value of the run's allocation: ``N+S`` (``S`` hot spares) for its first
    job; for a requeued or resubmitted elastic run ``min-max``, so the job starts as soon as
    ``min_nodes`` are free rather than waiting for all of them, and the gang forms on what
    Slurm granted. (Slurm's consumable-resource selection grants the low end of a range when
    it can, measured on the testbed, so a first job asks for exactly what the spec says.)"""
    low, total = _node_range(spec)
    if requeue and is_elastic(spec) and low < total:
        return f"{low}-{total}"
    return str(total)


def requeue_resize(spec: GangSpec) -> dict[str, str]:
    """``scontrol update`` fields that make a requeued elastic job start on ``min-max`` nodes
    (``NumNodes``, and ``NumTasks`` at the low end: one agent per node, and a task count left
    at ``nodes`` would still need every node); empty for any other run."""
    low, total = _node_range(spec)
    if not is_elastic(spec) or low >= total:
        return {}
    return {"NumNodes": f"{low}-{total}", "NumTasks": str(low)}


def _node_range(spec: GangSpec) -> tuple[int, int]:
    """The fewest nodes the gang may run on and the nodes of a whole allocation (N+S)."""
    return min_gang_nodes(spec), spec.resources.nodes + spec.resources.spare_nodes


AGENT_COUNT_ENV = ("SLURM_NTASKS", "SLURM_NPROCS")
"""Variables ``srun`` takes its task count from when given none. A requeued job keeps the
values ``sbatch`` computed for its first allocation, so an elastic job's batch shell sets them
to the nodes it was granted (``$SLURM_JOB_NUM_NODES``) before it starts one agent per node."""


def unkept_world_sizes(global_batch: int | None, tasks_per_node: int,
                       node_counts: Sequence[int] | range) -> tuple[tuple[int, int], ...]:
    """``(nodes, world_size)`` pairs at which ``global_batch`` rows cannot be split evenly over
    the ranks (empty when every size keeps it, or when the spec sets no global batch)."""
    if global_batch is None:
        return ()
    return tuple((n, n * tasks_per_node) for n in node_counts
                 if global_batch % (n * tasks_per_node) != 0)


def keepable_global_batch(tasks_per_node: int, node_counts: Sequence[int] | range) -> int:
    """The smallest global batch every gang size keeps (the least common multiple of the world
    sizes): what to suggest when a spec's is not."""
    return math.lcm(*(n * tasks_per_node for n in node_counts))


def shrink_gang(gang: Sequence[str], lost: Sequence[str]) -> tuple[str, ...]:
    """The gang without its lost nodes, survivors in their order: node ranks are re-assigned
    densely (a survivor's node rank is its position here)."""
    gone = set(lost)
    return tuple(n for n in gang if n not in gone)


def initial_gang(allocation: Sequence[str], size: int, unusable: Iterable[str] = ()) -> tuple[
        str, ...]:
    """The first gang of an allocation: its first ``size`` usable nodes, in allocation order.

    Raises:
        MembershipError: fewer than ``size`` usable nodes.
    """
    bad = set(unusable)
    usable = [n for n in allocation if n not in bad]
    if len(usable) < size:
        raise MembershipError(
            f"the allocation {', '.join(allocation)} has {len(usable)} usable nodes "
            f"({', '.join(sorted(bad & set(allocation))) or 'none'} quarantined), expected at "
            f"least resources.nodes={size}; the run requeues onto other nodes")
    return tuple(usable[:size])


def usable_spares(allocation: Sequence[str], gang: Sequence[str], unusable: Iterable[str],
                  stale: Iterable[str] = ()) -> tuple[str, ...]:
    """Allocation nodes outside the gang that can take a lost node's place, in allocation order.
    """
    out = set(gang) | set(unusable) | set(stale)
    return tuple(n for n in allocation if n not in out)


def swap_in(gang: Sequence[str], lost: Sequence[str], spares: Sequence[str]) -> tuple[str, ...]:
    """The gang with each lost node replaced, in place, by the next spare.

    Each spare takes the lost node's position, so it takes that node's node rank and ranks.

    Raises:
        MembershipError: fewer spares than lost nodes.
    """
    if len(spares) < len(lost):
        raise MembershipError(f"{len(lost)} lost node(s) ({', '.join(lost)}) but only "
                              f"{len(spares)} spare(s); expected one spare per lost node")
    replacement = dict(zip(lost, spares, strict=False))
    return tuple(replacement.get(n, n) for n in gang)


def check_fixed_batch(global_batch: int | None, tasks_per_node: int, nodes: int,
                      checks: Checks) -> None:
    """A fixed gang's global batch splits evenly over its ranks, so the data plane's
    ``replica_rows`` does not refuse it in the allocation.

    A fixed gang has one world size, ``nodes x tasks_per_node``: a hot spare takes a lost node's
    place at the same size. The data-parallel size is the training code's choice (DDP and FSDP
    over every rank: the world size; a tensor- or pipeline-parallel mesh: a divisor of it),
    which the spec cannot see. The world size is what it can check: a batch it divides splits
    evenly over any data-parallel size, and :func:`check_elastic_batch` asks the same of every
    size; a mesh whose smaller data-parallel size alone divides the batch is refused too (raise
    the batch to a multiple of the world size).
    """
    bad = unkept_world_sizes(global_batch, tasks_per_node, (nodes,))
    if not bad:
        return
    checks(False, "data.global_batch",
           f"a multiple of the world size ({bad[0][1]}: {nodes} nodes x {tasks_per_node} "
           "ranks), so each rank takes an equal share of every global batch", global_batch,
           f"set data.global_batch to a multiple of "
           f"{keepable_global_batch(tasks_per_node, (nodes,))}, or change resources.nodes "
           "or resources.tasks_per_node", reads=("resources", "membership"))


def check_elastic_batch(global_batch: int | None, tasks_per_node: int,
                         counts: range, checks: Checks) -> None:
    """An elastic run keeps its global batch at every gang size it may shrink to (each rank
    takes ``global_batch / world_size`` rows): refuse one that cannot, naming the sizes."""
    bad = unkept_world_sizes(global_batch, tasks_per_node, counts)
    if not bad:
        return
    sizes = ", ".join(f"{w} ranks on {n} nodes" for n, w in bad)
    lcm = keepable_global_batch(tasks_per_node, counts)
    checks(False, "data.global_batch",
           f"a multiple of every world size the elastic gang may take "
           f"({', '.join(str(n * tasks_per_node) for n in counts)}: nodes "
           f"{counts.start}..{counts.stop - 1} x {tasks_per_node} ranks), so each rank takes "
           f"an equal share of the same global batch; it does not split over {sizes}",
           global_batch, f"set data.global_batch to a multiple of {lcm}, or raise "
           "membership.min_nodes to leave those sizes out", reads=("resources", "membership"))
