"""A commit publishes the run's progress itself: PROGRESS (the step, the gang's tokens) and the
data CURSOR of the saved step, right after its COMMIT, whether the save blocked or committed
later (the cursor is the one taken when the save started)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hpcrun.checkpoint import Checkpointer
from hpcrun.checkpoint.commit import CommitProgress
from hpcrun.control.log import EntryKind, RunLog

CURSOR = {"kind": "hpcrun.data.cursor/1", "position": {"batch": 7}}


def _after_commit(log: RunLog) -> list[tuple[str, int]]:
    kinds = (EntryKind.COMMIT, EntryKind.PROGRESS, EntryKind.CURSOR)
    return [(str(e.kind), int(e.payload["step"])) for e in log.read() if e.kind in kinds]


def test_a_blocking_commit_publishes_progress_and_cursor_after_the_commit(
        incarnation: Callable[..., Checkpointer], log: RunLog) -> None:
    ck = incarnation()
    ck.save(7, {"w": torch.ones(4)}, progress=CommitProgress(tokens=896, cursor=CURSOR),
            blocking=True)
    assert _after_commit(log) == [("commit", 7), ("progress", 7), ("cursor", 7)]
    [progress] = [e for e in log.read() if e.kind == EntryKind.PROGRESS]
    [cursor] = [e for e in log.read() if e.kind == EntryKind.CURSOR]
    assert progress.payload["tokens"] == 896 and cursor.payload["cursor"] == CURSOR


def test_an_async_commit_publishes_the_saved_steps_progress_when_it_lands(
        incarnation: Callable[..., Checkpointer], log: RunLog) -> None:
    ck = incarnation()
    ck.save(3, {"w": torch.ones(4)}, progress=CommitProgress(tokens=384, cursor=CURSOR))
    ck.wait()
    assert _after_commit(log) == [("commit", 3), ("progress", 3), ("cursor", 3)]


def test_a_save_without_progress_publishes_only_its_commit(
        incarnation: Callable[..., Checkpointer], log: RunLog) -> None:
    incarnation().save(5, {"w": torch.ones(4)}, blocking=True)
    assert _after_commit(log) == [("commit", 5)]
