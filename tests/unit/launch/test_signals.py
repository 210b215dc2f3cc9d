"""Preemption signals: the handler only sets a flag, handlers are restored, ranks agree
(the agreement lives in :mod:`hpcrun.runtime.preemption`)."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from typing import Any

import pytest

from hpcrun.errors import ConfigError
from hpcrun.launch.signals import StopFlag, signal_number, stop_on
from hpcrun.runtime.preemption import agree_sum
from tests.unit.launch.test_dist import gang, spawn


@pytest.mark.parametrize("name", ["USR1", "SIGUSR1", "usr1", "sigusr1", " USR1 ",
                                  str(int(signal.SIGUSR1)), int(signal.SIGUSR1)])
def test_signal_number_accepts_the_usual_spellings(name: str | int) -> None:
    assert signal_number(name) == signal.SIGUSR1


@pytest.mark.parametrize("name", ["USR9", "", "SIG", "999", "DFL", "__class__"])
def test_signal_number_rejects_non_signals(name: str) -> None:
    with pytest.raises(ConfigError):
        signal_number(name)


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_real_signal_sets_the_flag_and_the_previous_handler_comes_back() -> None:
    seen: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        seen.append(signum)

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        flag = StopFlag()
        with stop_on(["USR1", signal.SIGUSR2], flag) as got:
            assert got is flag and not flag.is_set
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_until(lambda: flag.is_set)
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
        assert (flag.signum, flag.reason) == (signal.SIGUSR1, "SIGUSR1"), "first signal kept"
        assert seen == [], "the previous handler did not run while the block was active"
        assert signal.getsignal(signal.SIGUSR1) is previous
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_until(lambda: seen == [signal.SIGUSR1])
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_handlers_are_restored_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="boom"), stop_on([signal.SIGTERM], StopFlag()):
        assert signal.getsignal(signal.SIGTERM) is not before
        raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_on_outside_the_main_thread_is_a_clear_error() -> None:
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with stop_on(["USR1"], StopFlag()):
                pass
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=enter)
    worker.start()
    worker.join()
    assert len(errors) == 1 and isinstance(errors[0], ConfigError)
    assert "main thread" in str(errors[0])


def test_flag_set_by_hand_and_single_process_agreement() -> None:
    flag = StopFlag()
    assert agree_sum([int(flag.is_set)]) == [0]
    flag.set(reason="injected preempt@12")
    assert agree_sum([int(flag.is_set)]) == [1] and flag.reason == "injected preempt@12"
    assert flag.signum is None


AGREE = """
    import json, os, signal, sys, time
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.dist import init_process_group, destroy_process_group
    from hpcrun.launch.signals import StopFlag, stop_on
    from hpcrun.runtime.preemption import agree_sum
    env = DistEnv.from_environ(dict(os.environ))
    init_process_group(env, timeout_s=60)
    flag = StopFlag()
    stopped_at = None
    with stop_on(["USR1"], flag):
        print("ready", flush=True)
        for step in range(600):
            if agree_sum([int(flag.is_set)])[0]:
                stopped_at = step
                break
            time.sleep(0.02)  # the step's work; the signal lands somewhere in here
    print(json.dumps({"rank": env.rank, "stopped_at": stopped_at, "signalled": flag.is_set}))
    destroy_process_group()
"""


def test_ranks_agree_to_stop_at_the_same_step_when_only_one_was_signalled() -> None:
    procs = [spawn(AGREE, env) for env in gang(2, job="agree")]
    try:
        for proc in procs:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        procs[1].send_signal(signal.SIGUSR1)
        outputs = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr[-2000:]
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    steps = {o["stopped_at"] for o in outputs}
    assert len(steps) == 1 and None not in steps, f"ranks stopped at {steps}"
    assert [o["signalled"] for o in outputs] == [False, True]
