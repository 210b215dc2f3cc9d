"""Pure decisions of the testbed: command lines, output parsing, namespace safety, status values.

The effectful shell (:mod:`hpcrun.testbed.daemons`) runs what these functions return and feeds
what it reads back into them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from hpcrun.errors import ArgumentError
from hpcrun.testbed.config import CONTROLLER_HOSTNAME, TestbedConfig

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server", "charliecloud-runtime",
            "openmpi-bin", "libopenmpi-dev")
"""Debian packages ``up`` installs when one of :data:`REQUIRED_BINARIES` is missing
(``charliecloud-runtime``: ``ch-run``, which the container tests start ranks with; the
``charliecloud`` meta package would pull in its image builders and docker.io; ``openmpi-bin``
and ``libopenmpi-dev``: Open MPI for mpi4py and, through ``libpmix-dev``, the PMIx library
Slurm's ``--mpi=pmix`` plugin loads)."""
REQUIRED_BINARIES = ("slurmctld", "slurmd", "munged", "slurmdbd", "mariadbd", "ch-run",
                     "mpiexec")
SBIN_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_PID_FILE = MUNGE_RUN_DIR / "munged.pid"

_READY_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
_STATE_FLAGS = "*~#!%$@^-+"


class Daemon(StrEnum):
    """The processes ``up`` starts; the value is also the process name in ``/proc/PID/comm``."""

    MUNGED = "munged"
    MARIADBD = "mariadbd"
    SLURMDBD = "slurmdbd"
    SLURMCTLD = "slurmctld"
    SLURMD = "slurmd"


def pid_file_name(daemon: Daemon, node: str | None = None) -> str:
    """Name of the testbed's own pid file for ``daemon`` (one per node for slurmd)."""
    if daemon is Daemon.SLURMD:
        if node is None:
            raise ArgumentError("slurmd pid files are per node, and no node was given: pass "
                                "node=<name>")
        return f"slurmd-{node}.pid"
    return f"{daemon.value}.pid"


def detached_argv(argv: Iterable[str], *, pid_file: Path, log_file: Path,
                  prelude: str = "") -> list[str]:
    """Run ``argv`` detached from the caller (new session, reparented), in the foreground mode
    of the daemon, with its own pid written to ``pid_file`` and its output appended to
    ``log_file``. ``prelude`` runs first in the same shell (which ``exec``\\ s the daemon, so the
    recorded pid is the daemon's).
    """
    script = (f'exec >>"$1" 2>&1 </dev/null; {prelude}'
              'echo $$ >"$2.tmp" && mv "$2.tmp" "$2"; shift 2; exec "$@"')
    return ["setsid", "-f", "sh", "-c", script, "sh", str(log_file), str(pid_file), *argv]


def node_prelude(config: TestbedConfig, node: str) -> str:
    """Shell run inside a node's fresh UTS + mount namespace before slurmd starts."""
    local = config.node_local_path
    return (f"hostname {node} && mount --bind {config.hosts_file(node)} /etc/hosts && "
            f"mkdir -p {local} && mount --bind {config.node_local_dir(node)} {local} && ")


def node_argv(config: TestbedConfig, node: str, *, pid_file: Path, log_file: Path) -> list[str]:
    """Start ``node``'s slurmd in its own UTS + mount namespace (private propagation)."""
    inner = detached_argv(slurmd_argv(config, node), pid_file=pid_file, log_file=log_file,
                          prelude=node_prelude(config, node))
    # setsid -f first, then unshare execs the shell in place: the recorded pid is slurmd's.
    return [*inner[:2], "unshare", "--uts", "--mount", "--propagation", "private", *inner[2:]]


def slurmd_argv(config: TestbedConfig, node: str) -> list[str]:
    return ["slurmd", "-D", "-N", node, "-f", str(config.slurm_conf)]


def slurmctld_argv(config: TestbedConfig, *, pid_file: Path, log_file: Path) -> list[str]:
    """slurmctld in its own UTS namespace, where its hostname matches SlurmctldHost."""
    inner = detached_argv(["slurmctld", "-D", "-f", str(config.slurm_conf)],
                          pid_file=pid_file, log_file=log_file,
                          prelude=f"hostname {CONTROLLER_HOSTNAME} && ")
    return [*inner[:2], "unshare", "--uts", *inner[2:]]


def slurmdbd_argv() -> list[str]:
    """slurmdbd reads slurmdbd.conf from the directory of ``$SLURM_CONF``."""
    return ["slurmdbd", "-D"]


def munged_argv() -> list[str]:
    """munged in the foreground as the munge user (setpriv execs, so the pid is munged's)."""
    return ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "munged", "-F"]


def install_db_argv(config: TestbedConfig) -> list[str]:
    return ["mariadb-install-db", "--no-defaults", f"--datadir={config.db_dir}", "--user=root",
            "--auth-root-authentication-method=socket", "--skip-test-db"]


def mariadbd_argv(config: TestbedConfig) -> list[str]:
    """The testbed's own MariaDB: own datadir, socket and port, loopback only."""
    return [
        "mariadbd", "--no-defaults", f"--datadir={config.db_dir}",
        f"--socket={config.db_socket}", f"--port={config.mariadb_port}",
        "--bind-address=127.0.0.1", "--skip-name-resolve", "--user=root",
        f"--init-file={config.db_init_sql}", f"--pid-file={config.state_dir}/run/mariadbd.pid",
        "--innodb-buffer-pool-size=64M", "--innodb-lock-wait-timeout=900", "--skip-log-bin",
    ]


def apt_install_argv() -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]


def sinfo_argv() -> list[str]:
    return ["sinfo", "--noheader", "--Node", "--format=%N|%T"]


def node_ready(state: str) -> bool:
    """True when a node answers and can run jobs (idle, mixed, allocated, completing), for a
    state from :func:`hpcrun.scheduler.slurm.parse_sinfo_nodes` (any case)."""
    state = state.strip().lower()
    return not state.endswith("*") and state.rstrip(_STATE_FLAGS) in _READY_STATES


def is_node_namespace(candidate: str | None, host_namespaces: Iterable[str | None]) -> bool:
    """True only for a known namespace that is none of the host's (pid 1's, ours).

    A sweep of a namespace kills every process in it; sweeping the host's would kill the
    machine's own processes, so an unknown or host namespace is never a node's.
    """
    if not candidate:
        return False
    return candidate not in {ns for ns in host_namespaces if ns}


@dataclass(frozen=True, kw_only=True, slots=True)
class DaemonStatus:
    """One process the testbed runs."""

    name: str
    """Daemon name, ``slurmd@nodeK`` for a node's slurmd."""
    pid: int | None
    """Its pid from the testbed's pid file, None when there is none."""
    running: bool
    """Whether that pid is alive and is that daemon."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TestbedStatus:
    """What ``hpcrun testbed status`` reports."""

    __test__ = False  # not a pytest test class

    state_dir: str
    """The testbed's state directory."""
    slurm_conf: str
    """Path clients put in ``SLURM_CONF``."""
    daemons: tuple[DaemonStatus, ...]
    """Every daemon the testbed would run, in start order."""
    nodes: Mapping[str, str] = field(default_factory=dict)
    """``sinfo`` state per node; empty when slurmctld does not answer."""

    @property
    def up(self) -> bool:
        """All daemons running and every node ready."""
        names = {d.name for d in self.daemons if d.name.startswith("slurmd@")}
        return (all(d.running for d in self.daemons) and bool(names)
                and len(self.nodes) == len(names)
                and all(node_ready(s) for s in self.nodes.values()))

    def to_json(self) -> str:
        body = {
            "schema_version": 1, "up": self.up, "state_dir": self.state_dir,
            "slurm_conf": self.slurm_conf,
            "daemons": [{"name": d.name, "pid": d.pid, "running": d.running}
                        for d in self.daemons],
            "nodes": dict(self.nodes),
        }
        return json.dumps(body, indent=2)

    def to_text(self) -> str:
        lines = [f"testbed {self.state_dir}: {'UP' if self.up else 'DOWN'}"]
        lines += [f"  {d.name:<16} {'running' if d.running else 'stopped':<8} "
                  f"{'pid ' + str(d.pid) if d.running else ''}".rstrip() for d in self.daemons]
        if self.nodes:
            lines.append("  NODE     STATE")
            lines += [f"  {n:<8} {s}" for n, s in sorted(self.nodes.items(), key=_node_key)]
        return "\n".join(lines)


def _node_key(item: tuple[str, str]) -> tuple[int, str]:
    digits = item[0].removeprefix("node")
    return (int(digits) if digits.isdigit() else 0, item[0])


def daemon_plan(config: TestbedConfig) -> tuple[tuple[Daemon, str | None], ...]:
    """Daemons of ``config`` in start order, as ``(daemon, node)``."""
    head: list[tuple[Daemon, str | None]] = [(Daemon.MUNGED, None)]
    if config.accounting:
        head += [(Daemon.MARIADBD, None), (Daemon.SLURMDBD, None)]
    head.append((Daemon.SLURMCTLD, None))
    return (*head, *((Daemon.SLURMD, n) for n in config.node_names))


def display_name(daemon: Daemon, node: str | None) -> str:
    return f"{daemon.value}@{node}" if node else daemon.value
