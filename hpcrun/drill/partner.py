"""The ``node-loss-partner`` drill's outside actions: wait for a partner copy, then make tier 1
unreadable before the node is crashed (effectful).

The lost node's shards must then come from its partner: the tier-1 copies (every drained shard
directory) are removed, while the manifests stay where every tier's restore reads them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcrun.checkpoint.peer.ledger import fold_partner_copies
from hpcrun.checkpoint.tiers import check_id, fold_checkpoints, shared_root
from hpcrun.control.log import RunLog
from hpcrun.errors import CheckpointError
from hpcrun.vocab import Tier


def partner_ready(run_dir: Path, owner: str, *, strictly_newer: bool = True) -> str | None:
    """The newest checkpoint of which a partner holds a complete copy of ``owner``'s shards,
    when it is newer than every tier-1 commit (a restore from tier 1 would lose steps), or
    with ``strictly_newer=False`` at least as new."""
    entries = RunLog(run_dir).read()
    committed = fold_checkpoints(entries)
    shared = max((c.step for c in committed if Tier.SHARED in c.tiers), default=-1)
    steps = {c.ckpt_id: c.step for c in committed}
    held = [c.ckpt_id for c in fold_partner_copies(entries).values()
            if c.owner == owner and c.complete
            and steps.get(c.ckpt_id, -1) > shared - (0 if strictly_newer else 1)]
    return max(held, key=lambda ckpt: steps[ckpt], default=None)


def hide_tier1(run_dir: Path) -> list[str]:
    """Remove every drained shard directory from tier 1 (manifests stay); the checkpoints whose
    tier-1 copies are gone."""
    gone = []
    root = shared_root(run_dir)
    for c in fold_checkpoints(RunLog(run_dir).read()):
        try:
            ckpt_dir = root / check_id(c.ckpt_id)
        except CheckpointError:
            continue
        dirs = [ckpt_dir / n for n in c.nodes if (ckpt_dir / n).is_dir()]
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if dirs:
            gone.append(c.ckpt_id)
    return gone
