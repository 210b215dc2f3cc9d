"""Entrypoint that checks the site's ``setup:`` lines ran in the job before the ranks started:
each rank requires ``HPCRUN_SETUP_PROBE`` (exported by a setup line) and writes what it saw."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from examples.tiny_lm.train import main as train


def main(ctx: Any) -> None:
    seen = os.environ.get("HPCRUN_SETUP_PROBE", "")
    if not seen.startswith("set-by-setup-"):
        raise RuntimeError(f"rank {ctx.rank}: HPCRUN_SETUP_PROBE is {seen!r}; the site's setup "
                           "lines did not run before the agents")
    probe = Path(str(ctx.config["probe_dir"])) / f"rank-{ctx.rank}.txt"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(seen)
    train(ctx)
