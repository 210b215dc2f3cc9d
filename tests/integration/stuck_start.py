"""Entrypoint for a start-up hang: in the job's first attempt the last rank wedges before its
first step (as on a stuck filesystem during restore); later attempts train normally."""

from __future__ import annotations

import os
import time
from typing import Any

from examples.tiny_lm.train import main as train


def main(ctx: Any) -> None:
    if ctx.rank == ctx.world_size - 1 and os.environ.get("HPCRUN_ATTEMPT") == "0":
        time.sleep(3600)
    train(ctx)
