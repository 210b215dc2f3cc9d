"""What a testbed is, and the files that describe it: pure values in, text out.

:class:`TestbedConfig` fixes everything about one testbed (node count, ports, paths, grace time);
the ``render_*`` functions turn it into ``slurm.conf``, ``slurmdbd.conf``, the MariaDB init SQL,
each node's private hosts file and the persisted ``testbed.json``. Nothing here touches the OS, so
every rendered file is unit-tested byte for byte.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.errors import ConfigError

TESTBED_SCHEMA_VERSION = 1
DEFAULT_STATE_DIR = Path("/var/lib/hpcrun-testbed")
STATE_DIR_ENV = "HPCRUN_TESTBED_DIR"
DEFAULT_NODE_LOCAL_PATH = "/scratch/local"
CONTROLLER_HOSTNAME = "head"
"""Hostname slurmctld sees inside its own UTS namespace; slurm.conf names it as SlurmctldHost."""
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
DB_PASSWORD = "hpcrun-testbed"  # loopback-only database of a throwaway testbed

_MAX_NODES = 64
_MAX_FIRST_JOB_ID = 0x03FF0000  # Slurm's default MaxJobId is 0x03FF0000 (67043328)

TESTBED_FILE = "testbed.json"
"""What a testbed's state directory records of it (written by ``hpcrun testbed up``)."""
LANE_ENV = "HPCRUN_TESTBED_LANE"
MAX_LANES = 4
"""Testbeds that may run side by side on one machine (``hpcrun testbed up --lane K``)."""
LANE_PORT_STRIDE = 100
LANE_JOB_ID_STRIDE = 1_000_000


@dataclass(frozen=True, kw_only=True, slots=True)
class TestbedConfig:
    """One single-machine Slurm cluster: N nodes in namespaces, a controller, accounting."""

    __test__ = False  # not a pytest test class

    state_dir: Path = DEFAULT_STATE_DIR
    """Directory holding configs, pid files, logs, spool dirs, the database and node dirs."""
    nodes: int = 4
    """Number of compute nodes, named node1..nodeN."""
    cpus_per_node: int = 4
    """CPUs each node advertises (not enforced: all nodes share the machine's cores)."""
    accounting: bool = True
    """Run MariaDB + slurmdbd so that ``sacct`` works; False uses accounting_storage/none."""
    grace_time: int = 15
    """Seconds between the preemption signal and the kill, on the preemptible partition."""
    node_local_path: str = DEFAULT_NODE_LOCAL_PATH
    """Absolute path where each node sees its own node-local directory (same path, own content)."""
    cluster_name: str = "hpcrun"
    """ClusterName in slurm.conf and in the accounting database."""
    slurmctld_port: int = 6817
    """TCP port of slurmctld on 127.0.0.1."""
    slurmdbd_port: int = 6819
    """TCP port of slurmdbd on 127.0.0.1."""
    slurmd_base_port: int = 6820
    """nodeK's slurmd listens on slurmd_base_port + K (all nodes share 127.0.0.1)."""
    mariadb_port: int = 3307
    """TCP port of the testbed's own MariaDB on 127.0.0.1 (not the system's 3306)."""
    first_job_id: int = 1
    """Slurm's ``FirstJobId``: testbeds side by side (:func:`lane_config`) number their jobs
    apart, so nothing keyed by a job id (rendezvous ports, node-local paths) is shared."""

    def __post_init__(self) -> None:
        if not self.state_dir.is_absolute():
            raise ConfigError(f"testbed state_dir must be absolute, found {self.state_dir!s}; "
                              "pass a full path such as /var/lib/hpcrun-testbed")
        if not 1 <= self.nodes <= _MAX_NODES:
            raise ConfigError(f"testbed nodes must be 1..{_MAX_NODES}, found {self.nodes}; "
                              "pass --nodes within that range")
        if self.cpus_per_node < 1:
            raise ConfigError(f"cpus_per_node must be >= 1, found {self.cpus_per_node}")
        if not 1 <= self.first_job_id <= _MAX_FIRST_JOB_ID:
            raise ConfigError(f"first_job_id must be 1..{_MAX_FIRST_JOB_ID}, found "
                              f"{self.first_job_id}")
        if not 0 <= self.grace_time <= 3600:
            raise ConfigError(f"grace_time must be 0..3600 s, found {self.grace_time}")
        if not (self.node_local_path.startswith("/") and self.node_local_path != "/"):
            raise ConfigError("node_local_path must be an absolute path below /, found "
                              f"{self.node_local_path!r}; use e.g. /scratch/local")
        self._check_ports()

    def _check_ports(self) -> None:
        ports = [self.slurmctld_port, self.slurmdbd_port, self.mariadb_port,
                 *(self.slurmd_port(n) for n in self.node_names)]
        if any(not 1024 <= p <= 65535 for p in ports):
            raise ConfigError(f"testbed ports must be 1024..65535, found {sorted(ports)}")
        if len(set(ports)) != len(ports):
            raise ConfigError(f"testbed ports must be distinct, found {sorted(ports)}; "
                              "move slurmd_base_port away from the other ports")

    @property
    def node_names(self) -> tuple[str, ...]:
        """``("node1", ..., "nodeN")``."""
        return tuple(f"node{k}" for k in range(1, self.nodes + 1))

    def slurmd_port(self, node: str) -> int:
        """The port ``node``'s slurmd listens on."""
        return self.slurmd_base_port + node_index(self, node)

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def mpi_conf(self) -> Path:
        """Slurm reads ``mpi.conf`` beside ``slurm.conf``."""
        return self.state_dir / "etc" / "mpi.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.state_dir / "etc" / "slurmdbd.conf"

    @property
    def shared_dir(self) -> Path:
        """The "parallel filesystem": one directory seen identically by host and nodes."""
        return self.state_dir / "shared"

    def node_dir(self, node: str) -> Path:
        """Host directory of ``node`` (its hosts file, spool and node-local storage)."""
        node_index(self, node)
        return self.state_dir / "nodes" / node

    def node_local_dir(self, node: str) -> Path:
        """Host path of ``node``'s node-local storage (seen as ``node_local_path`` on the node)."""
        return self.node_dir(node) / "local"

    def hosts_file(self, node: str) -> Path:
        return self.node_dir(node) / "hosts"

    @property
    def pid_dir(self) -> Path:
        """Pid files of the processes ``up`` started (the only ones ``down`` stops)."""
        return self.state_dir / "pids"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def db_dir(self) -> Path:
        return self.state_dir / "mariadb"

    @property
    def db_socket(self) -> Path:
        return self.state_dir / "run" / "mariadb.sock"

    @property
    def db_init_sql(self) -> Path:
        return self.state_dir / "etc" / "mariadb-init.sql"

    @property
    def testbed_json(self) -> Path:
        return self.state_dir / TESTBED_FILE


def node_index(config: TestbedConfig, node: str) -> int:
    """K for ``nodeK``; raise ConfigError for a name that is not one of the testbed's nodes."""
    if node not in config.node_names:
        raise ConfigError(f"unknown testbed node {node!r}; expected one of "
                          f"{', '.join(config.node_names)}")
    return int(node.removeprefix("node"))


LIMITED_PARTITION = "small"
"""The testbed's partition with limits: its first two nodes, ``MaxTime`` 5 min, ``MaxNodes`` 2."""
LIMITED_MAX_TIME_MIN = 5
LIMITED_QOS = {"short": ("MaxWall=10", "MaxTRESPerJob=node=2")}
"""QoS the testbed creates when it has accounting (root may use them), with their limits."""


def accounting_setup_argvs() -> list[list[str]]:
    """``sacctmgr`` calls that create :data:`LIMITED_QOS` and let root use them (idempotent:
    an existing QoS is modified to the same limits)."""
    out = []
    for name, limits in LIMITED_QOS.items():
        out.append(["sacctmgr", "-i", "add", "qos", name, *limits])
        out.append(["sacctmgr", "-i", "modify", "qos", "where", f"name={name}", "set", *limits])
    out.append(["sacctmgr", "-i", "modify", "user", "where", "name=root", "set",
                f"qos+={','.join(LIMITED_QOS)}"])
    return out


def node_range(config: TestbedConfig) -> str:
    """The Slurm hostlist of all nodes, e.g. ``node[1-4]`` (or ``node1`` for one node)."""
    return "node1" if config.nodes == 1 else f"node[1-{config.nodes}]"


def _header(what: str) -> list[str]:
    return [f"# {what} of the hpcrun testbed, rendered from TestbedConfig; edits are overwritten.",
            f"# hpcrun-testbed schema_version={TESTBED_SCHEMA_VERSION}"]


def _daemon_lines(config: TestbedConfig) -> list[str]:
    s = config.state_dir
    return [
        f"ClusterName={config.cluster_name}",
        f"FirstJobId={config.first_job_id}",
        f"SlurmctldHost={CONTROLLER_HOSTNAME}(127.0.0.1)",
        f"SlurmctldPort={config.slurmctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # A requeued job may start again only cred_expire+1 s later; 5 is the smallest accepted.
        "AuthInfo=cred_expire=5",
        f"StateSaveLocation={s}/spool/ctld",
        f"SlurmdSpoolDir={s}/nodes/%n/spool",
        f"SlurmctldPidFile={s}/run/slurmctld.pid",
        f"SlurmdPidFile={s}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={config.log_dir}/slurmctld.log",
        f"SlurmdLogFile={config.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]


def _behaviour_lines(config: TestbedConfig) -> list[str]:
    return [
        "ProctrackType=proctrack/linuxproc",  # no cgroups on the machine
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",  # nodes claim more CPUs than the machine has
        "MpiDefault=none",
        "MailProg=/bin/true",
        "JobRequeue=1",
        "ReturnToService=1",
        "SlurmdTimeout=10",
        "InactiveLimit=0",
        "KillWait=5",
        "Waittime=0",
        "MinJobAge=300",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        # Without it the victim's --signal waits for the grace time to run out.
        "SlurmctldParameters=preempt_send_user_signal",
        "ScronParameters=enable",  # `hpcrun watch --install` schedules its pass with scrontab
        "JobAcctGatherType=jobacct_gather/none",
        *_accounting_lines(config),
    ]


def _accounting_lines(config: TestbedConfig) -> list[str]:
    if not config.accounting:
        return ["AccountingStorageType=accounting_storage/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={config.slurmdbd_port}",
    ]


def _node_lines(config: TestbedConfig) -> list[str]:
    nodes = [
        f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={config.slurmd_port(n)} "
        f"CPUs={config.cpus_per_node} State=UNKNOWN"
        for n in config.node_names
    ]
    hosts = node_range(config)
    return [
        *nodes,
        f"PartitionName=batch Nodes={hosts} Default=YES MaxTime=INFINITE State=UP "
        f"PriorityTier=1 PreemptMode=REQUEUE GraceTime={config.grace_time}",
        f"PartitionName=high Nodes={hosts} Default=NO MaxTime=INFINITE State=UP "
        "PriorityTier=2 PreemptMode=off",
        # a partition with limits, for admission's checks against MaxTime, MaxNodes and size
        f"PartitionName={LIMITED_PARTITION} Nodes={','.join(config.node_names[:2])} Default=NO "
        f"MaxTime={LIMITED_MAX_TIME_MIN} MaxNodes=2 State=UP PriorityTier=1 PreemptMode=off",
    ]


def render_slurm_conf(config: TestbedConfig) -> str:
    """The testbed's ``slurm.conf``: controller, N nodes, a preemptible and a high partition."""
    lines = [*_header("slurm.conf"), *_daemon_lines(config), *_behaviour_lines(config),
             *_node_lines(config)]
    return "\n".join(lines) + "\n"


def render_mpi_conf(config: TestbedConfig) -> str:
    """The testbed's ``mpi.conf``: each PMIx step's client directory on the node's own
    node-local path. The nodes share ``/tmp``, where two nodes' tasks of one ``srun --mpi=pmix``
    step would both create ``spmix_appdir_<uid>_<step>`` and the second node's launch fail."""
    return "\n".join([*_header("mpi.conf"),
                      f"PMIxCliTmpDirBase={config.node_local_path}"]) + "\n"


def render_slurmdbd_conf(config: TestbedConfig) -> str:
    """The testbed's ``slurmdbd.conf`` (slurmdbd refuses it unless it is mode 0600)."""
    s = config.state_dir
    lines = [
        *_header("slurmdbd.conf"),
        "AuthType=auth/munge",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={config.slurmdbd_port}",
        "SlurmUser=root",
        "DebugLevel=info",
        f"LogFile={config.log_dir}/slurmdbd.log",
        f"PidFile={s}/run/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={config.mariadb_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={DB_PASSWORD}",
        f"StorageLoc={DB_NAME}",
    ]
    return "\n".join(lines) + "\n"


def render_db_init_sql(config: TestbedConfig) -> str:
    """SQL MariaDB runs at each start (``--init-file``): the slurmdbd user and its grants."""
    del config  # same SQL for every testbed; kept for symmetry with the other renderers
    user = f"'{DB_USER}'@'127.0.0.1'"
    return (
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{DB_PASSWORD}';\n"
        f"GRANT ALL PRIVILEGES ON {DB_NAME}.* TO {user};\n"
        "FLUSH PRIVILEGES;\n"
    )


def render_hosts(config: TestbedConfig, node: str) -> str:
    """The private ``/etc/hosts`` of ``node``: itself first, then every node and the controller."""
    node_index(config, node)
    names = [node, *(n for n in config.node_names if n != node), CONTROLLER_HOSTNAME]
    lines = ["127.0.0.1\tlocalhost", *(f"127.0.0.1\t{n}" for n in names),
             "::1\tlocalhost ip6-localhost ip6-loopback"]
    return "\n".join(lines) + "\n"


def client_env(config: TestbedConfig) -> dict[str, str]:
    """Environment entries a Slurm client on the host needs, to add to its own environment."""
    return {"SLURM_CONF": str(config.slurm_conf)}


def render_env_exports(config: TestbedConfig) -> str:
    """``export`` lines for ``eval "$(hpcrun testbed env)"``."""
    values = {
        **client_env(config),
        STATE_DIR_ENV: str(config.state_dir),
        "HPCRUN_TESTBED_SHARED": str(config.shared_dir),
        "HPCRUN_TESTBED_NODE_LOCAL": config.node_local_path,
    }
    return "".join(f"export {k}={_sh_quote(v)}\n" for k, v in values.items())


def _sh_quote(value: str) -> str:
    if value and all(c.isalnum() or c in "/._-+:=," for c in value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def config_to_json(config: TestbedConfig) -> str:
    """The persisted ``testbed.json`` that ``down``/``status``/``crash``/``boot`` read back."""
    body: dict[str, Any] = {"schema_version": TESTBED_SCHEMA_VERSION}
    for name in TestbedConfig.__slots__:  # type: ignore[attr-defined]
        value = getattr(config, name)
        body[name] = str(value) if isinstance(value, Path) else value
    return json.dumps(body, sort_keys=True, indent=2) + "\n"


_FIELD_TYPES: Mapping[str, type] = {
    "state_dir": str, "nodes": int, "cpus_per_node": int, "accounting": bool,
    "grace_time": int, "node_local_path": str, "cluster_name": str, "slurmctld_port": int,
    "slurmdbd_port": int, "slurmd_base_port": int, "mariadb_port": int, "first_job_id": int,
}


def config_from_json(text: str, *, source: str = TESTBED_FILE) -> TestbedConfig:
    """Parse a persisted config; raise ConfigError naming the problem for anything malformed."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON ({exc}); run `hpcrun testbed down` "
                          "and `up` again to rewrite it") from exc
    if not isinstance(body, dict) or body.get("schema_version") != TESTBED_SCHEMA_VERSION:
        raise ConfigError(f"{source} has no schema_version {TESTBED_SCHEMA_VERSION}; it was "
                          "written by another hpcrun version: bring the testbed down and up")
    kwargs: dict[str, Any] = {}
    for name, kind in _FIELD_TYPES.items():
        value = body.get(name)
        if type(value) is not kind:  # bool is an int subclass: demand the exact type
            raise ConfigError(f"{source}: field {name!r} should be {kind.__name__}, found "
                              f"{value!r}; bring the testbed down and up to rewrite it")
        kwargs[name] = value
    kwargs["state_dir"] = Path(kwargs["state_dir"])
    return TestbedConfig(**kwargs)


def lane_config(state_dir: Path, lane: int = 0, **fields: Any) -> TestbedConfig:
    """Lane ``lane`` of up to :data:`MAX_LANES` testbeds side by side on one machine.

    Lane 0 is the plain testbed in ``state_dir``. Lane K > 0 is a cluster of its own: state
    directory ``<state_dir>-laneK``, every port ``K * 100`` above lane 0's, cluster name
    ``hpcrunK`` and job ids from ``K * 1,000,000 + 1``. All lanes share the machine's munged
    (the first lane up starts it, the last one down stops it). ``fields`` sets the
    other fields (nodes, accounting, grace time).
    """
    if not 0 <= lane < MAX_LANES:
        raise ConfigError(f"testbed lane must be 0..{MAX_LANES - 1}, found {lane}; pass "
                          f"--lane (or ${LANE_ENV}) within that range")
    if lane == 0:
        return TestbedConfig(state_dir=state_dir, **fields)
    base = TestbedConfig()
    shift = lane * LANE_PORT_STRIDE
    return TestbedConfig(
        state_dir=state_dir.with_name(f"{state_dir.name}-lane{lane}"),
        cluster_name=f"{base.cluster_name}{lane}", slurmctld_port=base.slurmctld_port + shift,
        slurmdbd_port=base.slurmdbd_port + shift, slurmd_base_port=base.slurmd_base_port + shift,
        mariadb_port=base.mariadb_port + shift, first_job_id=lane * LANE_JOB_ID_STRIDE + 1,
        **fields)


def sibling_lane_dirs(state_dir: Path) -> list[Path]:
    """The state directories of the other lanes of ``state_dir``'s testbed (lane 0's is the
    base, lane K's ``<base>-laneK``), whether or not they exist."""
    base, _, lane = state_dir.name.rpartition("-lane")
    if not (base and lane.isdigit() and 0 < int(lane) < MAX_LANES):
        base = state_dir.name
    dirs = [lane_config(state_dir.with_name(base), k).state_dir for k in range(MAX_LANES)]
    return [d for d in dirs if d != state_dir]


def default_lane(env: Mapping[str, str]) -> int:
    """``$HPCRUN_TESTBED_LANE`` if set, else 0.

    Raises:
        ConfigError: the value is not a lane number.
    """
    raw = env.get(LANE_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise ConfigError(f"${LANE_ENV} must be a lane number 0..{MAX_LANES - 1}, found "
                          f"{raw!r}; unset it or set a number")
    return int(raw)


def state_dir_of_slurm_conf(slurm_conf: str) -> Path | None:
    """The state directory of the testbed whose ``slurm.conf`` is ``slurm_conf`` (its
    ``etc/slurm.conf`` beside a ``testbed.json``), None for any other file."""
    if not slurm_conf:
        return None
    conf = Path(slurm_conf)
    state_dir = conf.parent.parent
    if conf.name != "slurm.conf" or conf.parent.name != "etc":
        return None
    return state_dir if (state_dir / TESTBED_FILE).is_file() else None


def default_state_dir(env: Mapping[str, str]) -> Path:
    """``$HPCRUN_TESTBED_DIR`` if set, else ``/var/lib/hpcrun-testbed``."""
    raw = env.get(STATE_DIR_ENV, "")
    return Path(os.path.abspath(raw)) if raw else DEFAULT_STATE_DIR
