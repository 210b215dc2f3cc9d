"""The ``stale-worker`` drill's stale writer: a frozen node's pending drain, published after the
newer fence (effectful).

A node whose slurmd froze is declared down and the job runs on elsewhere under a newer
generation, while the node's own processes may live on. Whatever that node had not published
yet, its share of the checkpoints that never reached tier 1, it drains and publishes under its
old generation whenever it gets to it. The frozen agent's own retries end within the drain's
bounded wait, which may come before Slurm puts up the newer fence, so the drill does not count
on them: once the newer fence is up, it resumes the frozen node's pending drain itself, through
the agents' drain code, under that node's generation and holder, and reports what the log made
of the write. The ``stale`` contract (:mod:`hpcrun.drill.contracts`) then holds the run to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcrun.control.log import EntryKind, LogEntry, RunLog
from hpcrun.errors import ArgumentError, StaleGenerationError


@dataclass(frozen=True, kw_only=True, slots=True)
class StaleWrite:
    """What the stale writer wrote and what the log told it."""

    node: str
    """The frozen node it wrote for."""
    generation: int
    """The fenced-out generation it wrote under."""
    newer: int
    """The slot of the newer fence it wrote after."""
    entries: tuple[LogEntry, ...]
    """The entries of ``node`` under ``generation`` after ``newer`` once it wrote, in slot
    order: its own, and any the frozen agent still wrote."""
    refused: str
    """The log's answer to its publish (``StaleGenerationError``'s message); "" when the log
    accepted it, which would make the newer fence worthless."""


def newer_fence(entries: list[LogEntry], generation: int) -> LogEntry | None:
    """The first fence of a generation after ``generation`` among ``entries`` (pure)."""
    return next((e for e in entries if e.kind == EntryKind.FENCE and e.generation > generation),
                None)


def drain_as_stale(run_dir: Path, node_local_root: Path, *, node: str,
                   fence: LogEntry) -> StaleWrite:
    """Drain ``node``'s pending shards to tier 1 and publish their DRAINED entries under the
    generation and holder of ``fence``, after a newer fence.

    Args:
        run_dir: The run directory.
        node_local_root: Host path of ``node``'s tier-0 root (``<root>/<run_id>/ckpt``).
        node: The frozen node.
        fence: The fence entry of the generation ``node`` ran under.

    Returns:
        What was written (no entry when ``node`` had nothing left to drain) and the refusal.

    Raises:
        ArgumentError: ``fence`` is no fence, or no newer fence is up yet (a write now would
            not be stale).
    """
    from hpcrun.checkpoint.drain import drain_pending

    if fence.kind != EntryKind.FENCE:
        raise ArgumentError(f"the stale writer needs the fence of the node's generation, found "
                            f"a {fence.kind} entry at slot {fence.slot}")
    log = RunLog(run_dir)
    newer = newer_fence(log.read(), fence.generation)
    if newer is None:
        raise ArgumentError(f"no fence newer than generation {fence.generation} in {run_dir}: "
                            "a write now would not be stale; wait for the newer incarnation")
    refused = ""
    try:
        drain_pending(run_dir, node_local_root, node=node, log=log,
                      generation=fence.generation, holder=fence.holder, limit=None)
    except StaleGenerationError as exc:
        refused = str(exc)
    mine = tuple(e for e in log.read(since_slot=newer.slot + 1)
                 if (e.generation, e.holder) == (fence.generation, fence.holder)
                 and e.payload.get("node") == node)
    return StaleWrite(node=node, generation=fence.generation, newer=newer.slot, entries=mine,
                      refused=refused)
