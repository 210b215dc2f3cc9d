"""Find debris in a run's log and move it aside, never deleting it (``hpcrun doctor``).

Debris (:class:`~hpcrun.control.log.LogDebris`) never blocks the log: readers skip it and
appends go past it. Moving it out of ``log/`` only makes the directory honest again; each move
is logged (a ``note`` entry, event ``log_debris_moved``), which closes its incident in the record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import LogDebrisMovedNote
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import LogDebris, RunLog
from hpcrun.storage import LOCAL_STORAGE, Storage

DEBRIS_DIR = "debris"
"""Where ``hpcrun doctor`` puts what it moves out of ``log/``, under the run directory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Moved:
    """One piece of debris moved aside."""

    debris: LogDebris
    """What it was."""
    to: Path
    """Where it is now."""


def find_debris(run_dir: str | os.PathLike[str], *,
                storage: Storage = LOCAL_STORAGE) -> list[LogDebris]:
    """Every file in ``log/`` that is not a well-formed entry of the log (reads every slot)."""
    log = RunLog(run_dir, storage=storage)
    log.read()
    return list(log.debris)


def _free_name(storage: Storage, folder: Path, name: str) -> Path:
    dest, n = folder / name, 1
    while storage.exists(dest):
        dest, n = folder / f"{name}.{n}", n + 1
    return dest


def move_debris(run_dir: str | os.PathLike[str], debris: list[LogDebris], *,
                storage: Storage = LOCAL_STORAGE, clock: Clock = SYSTEM_CLOCK) -> list[Moved]:
    """Move ``debris`` into ``RUN_DIR/debris/`` and log that it did.

    Raises:
        StorageError: a move failed (what was moved before it is logged).
    """
    run_dir = Path(run_dir)
    folder = run_dir / DEBRIS_DIR
    storage.makedirs(folder)
    moved: list[Moved] = []
    try:
        for d in debris:
            dest = _free_name(storage, folder, d.name)
            storage.rename(run_dir / "log" / d.name, dest)
            moved.append(Moved(debris=d, to=dest))
    finally:
        if moved:
            RunLog(run_dir, storage=storage, clock=clock).append_entry(
                LogDebrisMovedNote(names=tuple(m.debris.name for m in moved),
                                   to=tuple(str(m.to.relative_to(run_dir)) for m in moved)),
                generation=UNFENCED, holder="")
    return moved
