"""The effectful shell of the testbed: pid files, ``/proc``, signals, ports and waiting.

Everything that reads ``/proc`` takes the proc root as an argument, so the namespace-safety rules
are unit-tested on a fake tree. Processes are only ever signalled by pid after checking that the
pid is alive and has the expected name (pid files go stale; pids are reused), or after checking
that it lives in a node's namespace that is not the host's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

from hpcrun.clock import Clock
from hpcrun.errors import TestbedError
from hpcrun.testbed.plan import is_node_namespace

PROC = Path("/proc")


def read_pid(path: Path) -> int | None:
    """The pid in ``path``, or None when the file is missing or does not hold a positive int."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None


def write_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``path`` atomically (temp file in the same directory, then rename) with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _stat_fields(pid: int, proc: Path) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); [] when
    unreadable. "pid (comm) S ...": comm may hold spaces or parens, the state follows the last
    ")"."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return []
    return raw.rpartition(")")[2].split()


def _stat_state(pid: int, proc: Path) -> str | None:
    fields = _stat_fields(pid, proc)
    return fields[0] if fields else None


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    """``pid``'s parent from ``/proc/<pid>/stat`` (None when unreadable)."""
    fields = _stat_fields(pid, proc)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def leaves_first(pids: Iterable[int], proc: Path = PROC) -> list[int]:
    """``pids`` ordered so that every process comes before its parent (deepest first)."""
    wanted = set(pids)
    parents = {pid: parent_pid(pid, proc) for pid in wanted}

    def depth(pid: int) -> int:
        seen, up = {pid}, parents.get(pid)
        while up is not None and up in wanted and up not in seen:
            seen.add(up)
            up = parents.get(up)
        return len(seen) - 1

    return sorted(wanted, key=lambda pid: (-depth(pid), -pid))


def process_name(pid: int, proc: Path = PROC) -> str | None:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def is_alive(pid: int | None, name: str | None = None, proc: Path = PROC) -> bool:
    """True when ``pid`` runs (a zombie does not) and, if given, its name is ``name``."""
    if pid is None:
        return False
    state = _stat_state(pid, proc)
    if state is None or state in ("Z", "X"):
        return False
    return name is None or process_name(pid, proc) == name


def uts_namespace(pid: int | str, proc: Path = PROC) -> str | None:
    """``uts:[inode]`` of ``pid`` (``"self"`` for this process), None when unreadable."""
    try:
        return os.readlink(proc / str(pid) / "ns" / "uts")
    except OSError:
        return None


def host_namespaces(proc: Path = PROC) -> tuple[str | None, str | None]:
    """The UTS namespaces of pid 1 and of this process: never a node's."""
    return uts_namespace(1, proc), uts_namespace("self", proc)


def pids_in_namespace(namespace: str, proc: Path = PROC) -> list[int]:
    """Live pids whose UTS namespace is ``namespace``; [] if it is a host namespace."""
    hosts = host_namespaces(proc)
    if hosts[1] is None or not is_node_namespace(namespace, hosts):
        return []
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and uts_namespace(entry.name, proc) == namespace:
            pids.append(int(entry.name))
    return sorted(p for p in pids if is_alive(p, proc=proc))


def send_signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_until(predicate: Callable[[], bool], *, timeout: float, clock: Clock,
               what: str, hint: str = "", interval: float = 0.1) -> None:
    """Poll ``predicate`` until true; raise TestbedError naming ``what`` after ``timeout`` s."""
    deadline = clock.monotonic() + timeout
    while not predicate():
        if clock.monotonic() >= deadline:
            raise TestbedError(f"testbed: {what} did not happen within {timeout:g} s"
                               + (f"; {hint}" if hint else ""))
        clock.sleep(interval)


def stop_pids(pids: list[int], *, clock: Clock, grace: float, proc: Path = PROC) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` s, then SIGKILL the survivors and wait for them."""
    if grace > 0:
        send_signal(pids, signal.SIGTERM)
        with contextlib.suppress(TestbedError):
            wait_until(lambda: not any(is_alive(p, proc=proc) for p in pids),
                       timeout=grace, clock=clock, what="SIGTERM stop")
    survivors = [p for p in pids if is_alive(p, proc=proc)]
    send_signal(survivors, signal.SIGKILL)
    wait_until(lambda: not any(is_alive(p, proc=proc) for p in survivors), timeout=10,
               clock=clock, what=f"death of pids {survivors} after SIGKILL")


def kill_namespace(namespace: str, *, clock: Clock, proc: Path = PROC) -> list[int]:
    """Power loss of a node: SIGSTOP every process of its UTS namespace, then SIGKILL them all,
    children before parents, again until none is left.

    A real power loss stops every process of the node at once, and none acts on another's
    death. Killed one after the other, the job's ``srun`` on the job's first node could act:
    measured on this testbed (1 run in 3 of the supervising-node crash), it printed
    ``forcing job termination`` and had Slurm SIGKILL the agent step on every other node. Frozen
    first, it could still be woken: a stopped process whose parent dies is in an orphaned
    process group, and the kernel sends it SIGHUP and SIGCONT (``srun: got SIGCONT``). So the
    kill goes children first: no stopped process outlives its parent.

    Returns the pids killed. Does nothing for a host namespace (see ``pids_in_namespace``).
    """
    frozen: set[int] = set()
    for _ in range(50):  # a process may fork before its SIGSTOP lands: sweep until none is new
        fresh = [p for p in pids_in_namespace(namespace, proc) if p not in frozen]
        if not fresh:
            break
        send_signal(fresh, signal.SIGSTOP)
        frozen.update(fresh)
    killed: list[int] = []
    for _ in range(50):  # a dying slurmstepd may fork once more: sweep until empty
        pids = pids_in_namespace(namespace, proc)
        if not pids:
            return killed
        send_signal(leaves_first(pids, proc), signal.SIGKILL)
        killed += pids
        clock.sleep(0.05)
    raise TestbedError(f"testbed: processes of namespace {namespace} keep appearing after "
                       "50 SIGKILL sweeps; inspect them with `ps -eo pid,comm` and kill them")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def log_tail(path: Path, lines: int = 3) -> str:
    """The last ``lines`` lines of a log file, joined by `` | `` for one-line errors."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail) or f"(empty log {path})"
