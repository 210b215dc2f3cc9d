"""A background drain: bounded rate that backs off when steps slow down, idle priority."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrun.checkpoint import drain_pending, fold_checkpoints
from hpcrun.checkpoint.pacing import MIB, DrainPacer, PacePolicy, next_rate
from hpcrun.control.log import RunLog
from hpcrun.testing.fakes import FakeClock

from .conftest import trained

POLICY = PacePolicy(start_bps=64 * MIB, min_bps=4 * MIB, max_bps=256 * MIB,
                    increase_bps=32 * MIB, chunk=8 * MIB, check_s=0.5)
REPO = Path(__file__).resolve().parents[3]


def test_rate_grows_while_steps_keep_pace_and_halves_when_they_slow() -> None:
    assert next_rate(64 * MIB, 0.010, 0.0104, POLICY) == 96 * MIB  # within 5 %
    assert next_rate(64 * MIB, 0.010, 0.0110, POLICY) == 32 * MIB  # 10 % slower: back off
    assert next_rate(250 * MIB, 0.010, 0.010, POLICY) == 256 * MIB  # capped
    assert next_rate(5 * MIB, 0.010, 0.020, POLICY) == 4 * MIB  # the drain never stops
    assert next_rate(64 * MIB, None, 0.02, POLICY) == 64 * MIB  # nothing known: hold


class Steps:
    """Step periods a training loop reports: ``base`` alone, ``slow`` while ``draining``."""

    def __init__(self, base: float, slow: float) -> None:
        self.base, self.slow, self.draining = base, slow, False

    def __call__(self) -> list[float]:
        return [self.slow if self.draining else self.base]


def _copy(pacer: DrainPacer, steps: Steps, nbytes: int) -> None:
    pacer.begin()
    steps.draining = True
    for _ in range(nbytes // POLICY.chunk):
        pacer.pace(POLICY.chunk)
    steps.draining = False
    pacer.end()


def test_the_bucket_holds_the_rate() -> None:
    clock = FakeClock()
    pacer = DrainPacer(Steps(0.01, 0.01), PacePolicy(start_bps=64 * MIB, max_bps=64 * MIB,
                                                     chunk=8 * MIB), clock=clock)
    t0 = clock.monotonic()
    _copy(pacer, Steps(0.01, 0.01), 256 * MIB)
    # 256 MiB at 64 MiB/s: 4 s (the last chunk's sleep comes after it was moved)
    assert clock.monotonic() - t0 == pytest.approx(4.0, abs=0.2)
    assert pacer.copied == 256 * MIB


def test_a_drain_that_slows_training_backs_off_and_one_that_does_not_speeds_up() -> None:
    clock = FakeClock()
    hurting = Steps(0.010, 0.013)
    pacer = DrainPacer(hurting, POLICY, clock=clock)
    pacer.idle()
    _copy(pacer, hurting, 512 * MIB)
    assert pacer.backoffs >= 3 and pacer.rate == POLICY.min_bps
    clock.advance(10)
    harmless = Steps(0.010, 0.0101)
    calm = DrainPacer(harmless, POLICY, clock=clock)
    calm.idle()
    _copy(calm, harmless, 512 * MIB)
    assert calm.backoffs == 0 and calm.rate == POLICY.max_bps


def test_paced_drain_copies_the_same_verified_bytes(run_dir: Path, tmp_path: Path, log: RunLog,
                                                    incarnation) -> None:
    from hpcrun.checkpoint import pacing

    nvme = tmp_path / "nvme"
    ck = incarnation(node_local_root=nvme)
    model, opt = trained(1)
    ckpt_id = ck.save(1, {"model": model, "optim": opt}, blocking=True).ckpt_id
    clock = FakeClock()
    steps = Steps(0.01, 0.01)
    one_mib = PacePolicy(chunk=4096, start_bps=1 * MIB, min_bps=1 * MIB, max_bps=1 * MIB)
    pacer = DrainPacer(steps, one_mib, clock=clock)
    t0 = clock.monotonic()
    pacing._ACTIVE[:] = [pacer]
    try:
        assert drain_pending(run_dir, nvme, node="node0", log=log, generation=ck.id.generation,
                             holder=ck.id.holder) == [ckpt_id]
    finally:
        pacing._ACTIVE.clear()
    src = sorted((nvme).rglob("*.h5"))
    dst = sorted((run_dir / "ckpt" / ckpt_id).rglob("*.h5"))
    assert src and [p.read_bytes() for p in src] == [p.read_bytes() for p in dst]
    total = sum(p.stat().st_size for p in src)
    assert pacer.copied == 3 * total  # source read, copy written, copy read back: all paced
    assert clock.monotonic() - t0 == pytest.approx(3 * total / MIB, abs=0.01)  # at 1 MiB/s
    assert "node0" in fold_checkpoints(log.read())[0].drained


_PRIORITY = """
import os
from pathlib import Path
from hpcrun.runtime.node.drainpace import start_background_drain
p = start_background_drain(Path("/nonexistent/nvme"), "run", "n0")
print(p.nice, p.policy, p.io, os.sched_getscheduler(0) == os.SCHED_BATCH,
      os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux-only")
def test_the_drainer_process_runs_at_the_lowest_priority_that_progresses() -> None:
    out = subprocess.run([sys.executable, "-c", _PRIORITY], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), check=True).stdout.split()
    assert out[0] == "19" and out[1] == "batch" and out[3] == "True" and out[4] == "19", out
    assert out[2] in ("best-effort/7", "unchanged")  # ioprio: where the kernel allows it
