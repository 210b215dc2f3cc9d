"""A sweep on the local backend: every point's local launcher, at most ``max_parallel`` at once.

``hpcrun sweep --backend local`` starts this module detached (``python -m
hpcrun.launch.sweep_local --sweep-dir DIR``). It starts each point's
:mod:`hpcrun.launch.local` launcher in array task order, keeps at most ``max_parallel`` of them
running, and exits when every point's launcher has. Each point is an ordinary local run (its own
record, fencing, preemption, requeue, retries); ``hpcrun cancel SWEEP`` fences every point and
stops this launcher so no further point starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpcrun.control.record import read_record
from hpcrun.control.states import is_terminal
from hpcrun.control.sweep import point_environ, read_sweep_index

LAUNCHER_FILE = "sweep-launcher.json"
"""The running sweep launcher's pid, in the sweep directory."""


def run_bounded(run_dirs: Sequence[Path], max_parallel: int | None,
                start: Callable[[Path], int], stopped: threading.Event) -> list[int | None]:
    """``start(run_dir)`` for each point (it blocks until the point's launcher exits), at most
    ``max_parallel`` at once, in order; a point not yet started when ``stopped`` is set is
    skipped (None)."""
    def one(run_dir: Path) -> int | None:
        return None if stopped.is_set() else start(run_dir)

    workers = max_parallel or len(run_dirs) or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep-point") as pool:
        return list(pool.map(one, run_dirs))


def start_point(run_dir: Path, index: int) -> int:
    """Run point ``index``'s local launcher to its end; its exit status (0 for a point that
    already ended, e.g. cancelled before it started)."""
    if is_terminal(read_record(run_dir).state):
        return 0
    (run_dir / "logs").mkdir(parents=True, exist_ok=True, mode=0o750)
    with open(run_dir / "logs" / "launcher.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpcrun.launch.local", "--run-dir", str(run_dir)],
            env=point_environ(os.environ, index), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=os.environ.get("HPCRUN_CODE_PATH") or None)
        return proc.wait()


def stop_launcher(sweep_dir: Path) -> None:
    """Stop the sweep's launcher (no further point starts); running points are left to their
    own cancel."""
    try:
        pid = int(json.loads((sweep_dir / LAUNCHER_FILE).read_text())["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return
    if b"hpcrun.launch.sweep_local" in cmdline:
        os.kill(pid, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcrun-sweep-local")
    p.add_argument("--sweep-dir", required=True)
    a = p.parse_args(argv)
    sweep_dir = Path(a.sweep_dir).resolve()
    index = read_sweep_index(sweep_dir)
    (sweep_dir / LAUNCHER_FILE).write_text(json.dumps({"pid": os.getpid()}))
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stopped.set())
    dirs = index.run_dirs(sweep_dir)
    codes = run_bounded(dirs, index.max_parallel,
                        lambda d: start_point(d, dirs.index(d)), stopped)
    return 0 if all(c in (0, None) for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
