"""The :class:`Testbed`: bring a single-machine Slurm cluster up, inspect it, crash and boot
nodes, and tear it down. This is the imperative shell over :mod:`hpcrun.testbed.config` and
:mod:`hpcrun.testbed.plan`; process-level effects live in :mod:`hpcrun.testbed.daemons`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.errors import ConfigError, HpcrunError, TestbedError
from hpcrun.runner import CommandResult, CommandRunner, SubprocessRunner
from hpcrun.scheduler.slurm import parse_sinfo_nodes
from hpcrun.testbed import daemons as d
from hpcrun.testbed.config import (
    TESTBED_FILE,
    TestbedConfig,
    accounting_setup_argvs,
    client_env,
    config_from_json,
    config_to_json,
    node_index,
    render_db_init_sql,
    render_hosts,
    render_mpi_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
    sibling_lane_dirs,
)
from hpcrun.testbed.plan import (
    MUNGE_KEY,
    MUNGE_PID_FILE,
    MUNGE_RUN_DIR,
    REQUIRED_BINARIES,
    SBIN_DIRS,
    Daemon,
    DaemonStatus,
    TestbedStatus,
    apt_install_argv,
    daemon_plan,
    detached_argv,
    display_name,
    install_db_argv,
    mariadbd_argv,
    munged_argv,
    node_argv,
    node_ready,
    pid_file_name,
    sinfo_argv,
    slurmctld_argv,
    slurmdbd_argv,
)

_STATE_ENTRIES = ("etc", "run", "pids", "spool", "mariadb", "nodes", "shared", TESTBED_FILE)
"""What ``down`` wipes inside the state dir (by name: never a recursive delete of the dir)."""
_START_TIMEOUT = 60.0
_NODES_TIMEOUT = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class UpResult:
    """What ``up`` did."""

    started: tuple[str, ...]
    """Daemons it started (empty when the testbed was already up)."""
    cold: bool
    """True when it wiped the state dir and started from nothing."""
    seconds: float
    """Wall time of the call."""
    status: TestbedStatus
    """Status once up."""


class Testbed:
    """A real Slurm cluster on this machine: munged, MariaDB + slurmdbd, slurmctld, N slurmd.

    Each slurmd runs in its own UTS + mount namespace (hostname ``nodeK``, a private
    ``/etc/hosts``, its node-local directory bound at ``config.node_local_path``). Clients on the
    host add :attr:`env` to their environment.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, config: TestbedConfig, *, runner: CommandRunner | None = None,
                 clock: Clock = SYSTEM_CLOCK, proc: Path = d.PROC,
                 euid: Callable[[], int] = os.geteuid, search_path: str | None = None) -> None:
        self.config = config
        self._runner = runner if runner is not None else SubprocessRunner()
        self._clock = clock
        self._proc = proc
        self._euid = euid
        self._search_path = search_path

    @classmethod
    def from_state_dir(cls, state_dir: Path, **kwargs: object) -> Testbed:
        """The testbed recorded in ``state_dir/testbed.json`` (default config when absent)."""
        path = state_dir / TESTBED_FILE
        if path.exists():
            config = config_from_json(path.read_text(), source=str(path))
        else:
            config = TestbedConfig(state_dir=state_dir)
        return cls(config, **kwargs)  # type: ignore[arg-type]

    # -- what clients need ------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """Entries to add to a client's environment (``SLURM_CONF``); PATH stays as it is."""
        return client_env(self.config)

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.config.node_names

    @property
    def shared_dir(self) -> Path:
        """The shared ("parallel filesystem") directory, same path on host and nodes."""
        return self.config.shared_dir

    @property
    def node_local_path(self) -> str:
        """Where a job sees its node's node-local directory (same path on every node)."""
        return self.config.node_local_path

    def node_local_dir(self, node: str) -> Path:
        """Host path of ``node``'s node-local directory."""
        return self.config.node_local_dir(node)

    # -- up -------------------------------------------------------------------------------------

    def up(self) -> UpResult:
        """Start whatever is not running (all of it from a wiped state when nothing runs), then
        wait until every node is ready. Idempotent: on a running testbed it only verifies.
        """
        t0 = self._clock.monotonic()
        self._require_root("up")
        self._ensure_packages()
        cold = not any(s.running for s in self._daemon_states(with_external=False))
        if cold:
            self._prepare_state_dir()
        else:
            self._check_running_config()
        started = self._start_missing()
        restarted = [] if cold else [n for n in started if n.startswith("slurmd@")]
        self._wait_nodes_ready(resume=restarted)
        if cold and self.config.accounting:
            self._set_up_accounting()
        return UpResult(started=tuple(started), cold=cold,
                        seconds=self._clock.monotonic() - t0, status=self.status())

    def _require_root(self, what: str) -> None:
        if self._euid() != 0:
            raise TestbedError(f"`hpcrun testbed {what}` needs root (it starts munged, MariaDB "
                               "and slurmd in namespaces), found uid "
                               f"{self._euid()}; run it as root or with sudo")

    def _missing_binaries(self) -> list[str]:
        path = self._search_path
        if path is None:
            path = os.pathsep.join([*SBIN_DIRS, os.environ.get("PATH", "")])
        return [b for b in REQUIRED_BINARIES if shutil.which(b, path=path) is None]

    def _ensure_packages(self) -> None:
        missing = self._missing_binaries()
        if not missing:
            return
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update"], apt_install_argv()):
            result = self._run(argv, env=env, timeout=900)
            if result.returncode != 0:
                raise TestbedError(
                    f"testbed needs {', '.join(missing)} but `{' '.join(argv)}` exited "
                    f"{result.returncode}: {_last_line(result)}; install slurm-wlm munge "
                    "slurmdbd mariadb-server by hand and retry")
        still = self._missing_binaries()
        if still:
            raise TestbedError(f"testbed: {', '.join(still)} still missing after apt-get install;"
                               " check that the Debian packages provide them")

    def _prepare_state_dir(self) -> None:
        c = self.config
        self._wipe(include_logs=True)
        for sub in ("etc", "run", "pids", "logs", "spool/ctld", "shared", "mariadb"):
            (c.state_dir / sub).mkdir(parents=True, exist_ok=True)
        for node in c.node_names:
            c.node_local_dir(node).mkdir(parents=True, exist_ok=True)
            (c.node_dir(node) / "spool").mkdir(parents=True, exist_ok=True)
            d.write_text(c.hosts_file(node), render_hosts(c, node))
        Path(c.node_local_path).mkdir(parents=True, exist_ok=True)  # the mount point
        d.write_text(c.slurm_conf, render_slurm_conf(c))
        d.write_text(c.mpi_conf, render_mpi_conf(c))
        d.write_text(c.slurmdbd_conf, render_slurmdbd_conf(c), mode=0o600)
        d.write_text(c.db_init_sql, render_db_init_sql(c), mode=0o600)
        d.write_text(c.testbed_json, config_to_json(c))

    def _check_running_config(self) -> None:
        path = self.config.testbed_json
        try:
            running = config_from_json(path.read_text(), source=str(path))
        except (OSError, ConfigError) as exc:
            raise TestbedError(f"testbed daemons run but {path} is unreadable ({exc}); run "
                               "`hpcrun testbed down` and `up` again") from exc
        if running != self.config:
            raise TestbedError(f"a testbed with another config is up ({running.nodes} nodes, "
                               f"accounting={running.accounting}); requested {self.config.nodes} "
                               f"nodes, accounting={self.config.accounting}; run "
                               "`hpcrun testbed down` first")

    def _start_missing(self) -> list[str]:
        started = []
        for daemon, node in daemon_plan(self.config):
            if not self._running(daemon, node):
                self._start(daemon, node)
                started.append(display_name(daemon, node))
        return started

    def _start(self, daemon: Daemon, node: str | None) -> None:
        starters: Mapping[Daemon, Callable[[], None]] = {
            Daemon.MUNGED: self._start_munged, Daemon.MARIADBD: self._start_mariadbd,
            Daemon.SLURMDBD: self._start_slurmdbd, Daemon.SLURMCTLD: self._start_slurmctld,
        }
        if daemon is Daemon.SLURMD:
            assert node is not None
            self._start_node(node)
        else:
            starters[daemon]()

    def _start_munged(self) -> None:
        if self._munge_works():  # a munged this testbed did not start: use it, never stop it
            return
        if not MUNGE_KEY.exists() or MUNGE_KEY.stat().st_size == 0:
            self._run_checked(["mungekey", "--create", "--force", f"--keyfile={MUNGE_KEY}"],
                              "create the munge key")
            shutil.chown(MUNGE_KEY, "munge", "munge")
            MUNGE_KEY.chmod(0o400)
        MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
        MUNGE_RUN_DIR.chmod(0o755)
        self._spawn(Daemon.MUNGED, None, munged_argv(), ready=self._munge_works)

    def _munge_works(self) -> bool:
        cred = self._runner.run(["munge", "-n"], timeout=10)
        if cred.returncode != 0:
            return False
        return self._runner.run(["unmunge"], input=cred.stdout, timeout=10).returncode == 0

    def _start_mariadbd(self) -> None:
        c = self.config
        if not (c.db_dir / "mysql").is_dir():
            self._run_checked(install_db_argv(c), "initialise the MariaDB datadir")
        self._spawn(Daemon.MARIADBD, None, mariadbd_argv(c),
                    ready=lambda: d.port_open(c.mariadb_port))

    def _start_slurmdbd(self) -> None:
        self._spawn(Daemon.SLURMDBD, None, slurmdbd_argv(),
                    ready=lambda: d.port_open(self.config.slurmdbd_port))

    def _start_slurmctld(self) -> None:
        c = self.config
        pid_file, log_file = self._pid_path(Daemon.SLURMCTLD, None), self._log_path("slurmctld")
        argv = slurmctld_argv(c, pid_file=pid_file, log_file=log_file)
        self._launch(Daemon.SLURMCTLD, None, argv, ready=lambda: d.port_open(c.slurmctld_port))

    def _start_node(self, node: str) -> None:
        pid_file, log_file = self._pid_path(Daemon.SLURMD, node), self._log_path(f"slurmd-{node}")
        argv = node_argv(self.config, node, pid_file=pid_file, log_file=log_file)
        self._launch(Daemon.SLURMD, node, argv, ready=lambda: True)
        pid = d.read_pid(pid_file)
        namespace = d.uts_namespace(pid, self._proc) if pid else None
        if not d.is_node_namespace(namespace, d.host_namespaces(self._proc)):
            raise TestbedError(f"testbed: slurmd of {node} is not in its own UTS namespace "
                               f"(found {namespace}); check that `unshare --uts` works here")
        d.write_text(self._ns_path(node), f"{namespace}\n")

    def _spawn(self, daemon: Daemon, node: str | None, argv: Sequence[str],
               ready: Callable[[], bool]) -> None:
        pid_file, log_file = self._pid_path(daemon, node), self._log_path(daemon.value)
        self._launch(daemon, node, detached_argv(argv, pid_file=pid_file, log_file=log_file),
                     ready=ready)

    def _launch(self, daemon: Daemon, node: str | None, argv: Sequence[str],
                ready: Callable[[], bool]) -> None:
        name = display_name(daemon, node)
        pid_file = self._pid_path(daemon, node)
        pid_file.unlink(missing_ok=True)
        self._run_checked(argv, f"start {name}")
        log = self._log_path(daemon.value if node is None else f"slurmd-{node}")

        def started() -> bool:
            pid = d.read_pid(pid_file)
            if pid is not None and not d.is_alive(pid, proc=self._proc):
                raise TestbedError(f"testbed: {name} exited right after start; "
                                   f"last lines of {log}: {d.log_tail(log)}")
            return d.is_alive(pid, daemon.value, self._proc) and ready()

        d.wait_until(started, timeout=_START_TIMEOUT, clock=self._clock, what=f"{name} start",
                     hint=f"last lines of {log}: {d.log_tail(log)}")

    def _wait_nodes_ready(self, resume: Sequence[str]) -> None:
        for name in resume:
            self._resume(name.removeprefix("slurmd@"))
        expected = set(self.nodes)

        def ready() -> bool:
            states = self._sinfo()
            return expected <= states.keys() and all(node_ready(states[n]) for n in expected)

        d.wait_until(ready, timeout=_NODES_TIMEOUT, clock=self._clock, interval=0.2,
                     what=f"{len(expected)} nodes ready in sinfo",
                     hint=f"sinfo shows {self._sinfo()}; see {self.config.log_dir}/slurmd-*.log")

    def _set_up_accounting(self) -> None:
        """The QoS with limits the admission tests ask about (root's association must exist:
        slurmctld registers the cluster with slurmdbd at its start, so wait for it)."""
        argvs = accounting_setup_argvs()
        d.wait_until(lambda: self._root_association(), timeout=_NODES_TIMEOUT, clock=self._clock,
                     interval=0.2, what="root's association in slurmdbd",
                     hint=f"see {self.config.log_dir}/slurmdbd.log")
        for argv in argvs:
            result = self._run(argv, timeout=30)
            # an add of an existing QoS fails; the modify after it sets the same limits
            if result.returncode != 0 and argv[2] != "add":
                raise TestbedError(f"testbed: `{' '.join(argv)}` exited {result.returncode}: "
                                   f"{_last_line(result)}")

    def _root_association(self) -> bool:
        result = self._run(["sacctmgr", "--noheader", "--parsable2", "show", "associations",
                            "user=root", "format=Account"], timeout=15)
        return result.returncode == 0 and bool(result.stdout.strip())

    def _resume(self, node: str) -> None:
        # Fails harmlessly ("Invalid node state specified") when the node is already idle.
        self._run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=15)

    def _sinfo(self) -> dict[str, str]:
        try:
            result = self._run(sinfo_argv(), timeout=10)
        except HpcrunError:
            return {}
        return parse_sinfo_nodes(result.stdout) if result.returncode == 0 else {}

    # -- down, crash, boot --------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop what ``up`` started (by pid file, node namespaces swept) and wipe job state.

        Returns the names of the daemons it stopped. While another lane of this testbed runs,
        munged (the machine's, which the lanes share) stays up and its pid file, if this lane
        started it, moves to that lane: the last lane down stops it. Idempotent.
        """
        self._require_root("down")
        lanes_up = self._other_lanes_up()
        stopped = [s.name for s in self._daemon_states(with_external=False) if s.running
                   and not (lanes_up and s.name == Daemon.MUNGED.value)]
        for pid_file in sorted(self.config.pid_dir.glob("slurmd-*.pid")):
            self._kill_node(pid_file.name.removeprefix("slurmd-").removesuffix(".pid"))
        if lanes_up:  # they share this machine's munged: the last lane down stops it
            self._hand_munge_to(lanes_up[0])
        for daemon in (Daemon.SLURMCTLD, Daemon.SLURMDBD, Daemon.MARIADBD, Daemon.MUNGED):
            if daemon is Daemon.MUNGED and lanes_up:
                continue
            pid = d.read_pid(self._pid_path(daemon, None))
            if d.is_alive(pid, daemon.value, self._proc):
                assert pid is not None
                d.stop_pids([pid], clock=self._clock, grace=10, proc=self._proc)
        self._wipe(include_logs=False)
        return stopped

    def _other_lanes_up(self) -> list[Path]:
        """State directories of this testbed's other lanes whose slurmctld runs."""
        return [lane for lane in sibling_lane_dirs(self.config.state_dir)
                if d.is_alive(d.read_pid(lane / self.config.pid_dir.name /
                                         pid_file_name(Daemon.SLURMCTLD, None)),
                              Daemon.SLURMCTLD.value, self._proc)]

    def _hand_munge_to(self, lane: Path) -> None:
        """Give the munged this lane started to ``lane``: its pid file moves there, so that
        lane's ``down`` (or the last one's after it) stops it."""
        pid_file = self._pid_path(Daemon.MUNGED, None)
        if d.is_alive(d.read_pid(pid_file), Daemon.MUNGED.value, self._proc):
            (lane / self.config.pid_dir.name / pid_file.name).write_text(pid_file.read_text())

    def crash(self, node: str) -> list[int]:
        """Power loss of ``node``: SIGKILL its slurmd and every process in its namespace.

        Returns the pids killed.
        """
        self._require_root("crash")
        node_index(self.config, node)
        return self._kill_node(node)

    def boot(self, node: str) -> None:
        """Start ``node``'s slurmd in a fresh namespace and return the node to service."""
        self._require_root("boot")
        node_index(self.config, node)
        if not self._running(Daemon.SLURMCTLD, None):
            raise TestbedError("testbed is not up (slurmctld is not running); run "
                               "`hpcrun testbed up` instead of boot")
        if not self._running(Daemon.SLURMD, node):
            self._start_node(node)
        self._wait_registered(node)
        self._resume(node)
        d.wait_until(lambda: node_ready(self._sinfo().get(node, "")), timeout=_NODES_TIMEOUT,
                     clock=self._clock, interval=0.2, what=f"{node} ready after boot",
                     hint=f"sinfo shows {self._sinfo().get(node)}")

    def _wait_registered(self, node: str) -> None:
        d.wait_until(lambda: not self._sinfo().get(node, "*").endswith("*"),
                     timeout=_NODES_TIMEOUT, clock=self._clock, interval=0.2,
                     what=f"{node} registered with slurmctld")

    def _kill_node(self, node: str) -> list[int]:
        pid_file, ns_file = self._pid_path(Daemon.SLURMD, node), self._ns_path(node)
        pid = d.read_pid(pid_file)
        namespaces = {ns_file.read_text().strip()} if ns_file.exists() else set()
        if d.is_alive(pid, Daemon.SLURMD.value, self._proc):
            assert pid is not None
            namespaces.add(d.uts_namespace(pid, self._proc) or "")
        killed: list[int] = []
        for namespace in sorted(namespaces - {""}):
            killed += d.kill_namespace(namespace, clock=self._clock, proc=self._proc)
        if d.is_alive(pid, Daemon.SLURMD.value, self._proc):  # never left the host namespace
            assert pid is not None
            d.stop_pids([pid], clock=self._clock, grace=0, proc=self._proc)
            killed.append(pid)
        pid_file.unlink(missing_ok=True)
        ns_file.unlink(missing_ok=True)
        return killed

    def _wipe(self, *, include_logs: bool) -> None:
        names = (*_STATE_ENTRIES, "logs") if include_logs else _STATE_ENTRIES
        for name in names:
            path = self.config.state_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()

    # -- status ---------------------------------------------------------------------------------

    def status(self) -> TestbedStatus:
        """Daemons with pids, and each node's sinfo state when slurmctld runs."""
        daemons = self._daemon_states(with_external=True)
        ctld = next(s for s in daemons if s.name == Daemon.SLURMCTLD.value)
        return TestbedStatus(state_dir=str(self.config.state_dir),
                             slurm_conf=str(self.config.slurm_conf), daemons=daemons,
                             nodes=self._sinfo() if ctld.running else {})

    def _daemon_states(self, *, with_external: bool) -> tuple[DaemonStatus, ...]:
        states = []
        for daemon, node in daemon_plan(self.config):
            pid = d.read_pid(self._pid_path(daemon, node))
            running = d.is_alive(pid, daemon.value, self._proc)
            if daemon is Daemon.MUNGED and not running and with_external:
                pid = d.read_pid(MUNGE_PID_FILE)
                running = d.is_alive(pid, daemon.value, self._proc)
            states.append(DaemonStatus(name=display_name(daemon, node),
                                       pid=pid if running else None, running=running))
        return tuple(states)

    def _running(self, daemon: Daemon, node: str | None) -> bool:
        pid = d.read_pid(self._pid_path(daemon, node))
        return d.is_alive(pid, daemon.value, self._proc)

    # -- small helpers --------------------------------------------------------------------------

    def _pid_path(self, daemon: Daemon, node: str | None) -> Path:
        return self.config.pid_dir / pid_file_name(daemon, node)

    def _ns_path(self, node: str) -> Path:
        return self.config.pid_dir / f"{node}.uts"

    def _log_path(self, stem: str) -> Path:
        return self.config.log_dir / f"{stem}.out"

    def _run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
             timeout: float = 60, input: str | None = None) -> CommandResult:
        return self._runner.run(argv, env={**self.env, **(env or {})}, timeout=timeout,
                                input=input)

    def _run_checked(self, argv: Sequence[str], what: str) -> CommandResult:
        try:
            result = self._run(argv, timeout=120)
        except HpcrunError as exc:
            raise TestbedError(f"testbed: could not {what}: {exc}") from exc
        if result.returncode != 0:
            raise TestbedError(f"testbed: could not {what}: `{' '.join(argv[:3])} ...` exited "
                               f"{result.returncode}: {_last_line(result)}")
        return result


def _last_line(result: CommandResult) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else "no output"
