"""The embedded local backend: the same run, with this machine playing the scheduler.

``python -m hpcrun.launch.local --run-dir DIR`` is the "allocation": it starts one agent per
emulated node (each with its own node-local directory), relays the preemption signal it receives
(``hpcrun signal RUN``) to them, and when the supervising agent asks for a requeue (exit
EXIT_PREEMPTED with a requeue operation in the log) it waits the backoff and starts the gang
again with the next restart count, which the agents turn into the next generation. The contracts
are the ones that hold on Slurm; only the scheduler is different.

A node power loss is emulated by SIGKILLing a node's agent and everything it started
(:func:`hpcrun.proctree.crash_process_tree`: the ``nodecrash`` injection,
``hpcrun signal RUN --crash-node``).
The launcher then plays the scheduler noticing a dead node: it records a ``node_failure`` fault
for the incarnation in force, and the node comes back for the next start with an empty node-local
directory, as a replacement node would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import (
    ActionKind,
    EntryKind,
    FaultPayload,
    LogEntry,
    OpPayload,
    PayloadError,
    decode_as,
)
from hpcrun.control.log import RunLog
from hpcrun.exits import EXIT_PREEMPTED
from hpcrun.launch.signals import ignored_from_exec
from hpcrun.safedirs import ensure_private_dir
from hpcrun.vocab import FaultClass

LAUNCHER_FILE = "local/launcher.json"
AGENTS_FILE = "local/agents.json"
AGENT_GRACE_S = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalPlan:
    """What the local backend starts (pure; printed by ``hpcrun submit --dry-run``)."""

    run_dir: Path
    """Run directory."""
    nodes: tuple[str, ...]
    """Emulated node names."""
    node_local: Mapping[str, Path]
    """Each node's node-local (tier 0) directory."""
    tasks_per_node: int
    """Ranks per node."""
    python: str
    """Interpreter for agents and ranks."""

    def describe(self) -> str:
        lines = [f"local backend: {len(self.nodes)} node(s) x {self.tasks_per_node} rank(s)",
                 f"  run dir: {self.run_dir}"]
        lines += [f"  {n}: node-local {self.node_local[n]}" for n in self.nodes]
        return "\n".join(lines)


def plan_local(*, run_dir: Path, nodes: int, tasks_per_node: int, node_local_base: Path,
               python: str = sys.executable) -> LocalPlan:
    """Name the emulated nodes and their node-local directories (pure)."""
    names = tuple(f"local{i}" for i in range(nodes))
    return LocalPlan(run_dir=run_dir, nodes=names,
                     node_local={n: node_local_base / run_dir.name / n for n in names},
                     tasks_per_node=tasks_per_node, python=python)


def agent_environ(plan: LocalPlan, *, node_rank: int, job_id: str, restart_count: int,
                  base: Mapping[str, str]) -> dict[str, str]:
    """The environment of one emulated node's agent (pure)."""
    node = plan.nodes[node_rank]
    env = dict(base)
    env.update({
        "HPCRUN_AGENT_NODE": node, "HPCRUN_AGENT_NODE_RANK": str(node_rank),
        "HPCRUN_AGENT_NODES": ",".join(plan.nodes), "HPCRUN_AGENT_JOB_ID": job_id,
        "HPCRUN_AGENT_RESTART_COUNT": str(restart_count),
        "HPCRUN_AGENT_NODE_LOCAL": str(plan.node_local[node]),
    })
    return env


def requeue_delay(log: RunLog) -> float:
    """Backoff the supervisor asked for in its last requeue operation (0 when none)."""
    ops = [op for op in map(_op_or_none, log.read())
           if op is not None and op.action == ActionKind.REQUEUE]
    delay = ops[-1].delay_s if ops else None
    return delay if delay is not None and delay >= 0 else 0.0


def _op_or_none(entry: LogEntry) -> OpPayload | None:
    """The entry's operation, or None for other kinds and malformed entries."""
    if entry.kind != EntryKind.OP:
        return None
    try:
        return decode_as(entry, OpPayload)
    except PayloadError:
        return None


class LocalLauncher:
    """Runs the allocation loop in the foreground. Only signals processes it started."""

    def __init__(self, plan: LocalPlan, *, environ: Mapping[str, str], max_restarts: int = 100,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.plan = plan
        self.environ = dict(environ)
        self.max_restarts = max_restarts
        self.clock = clock
        self.job_id = local_job_id(os.getpid())
        self.agents: list[subprocess.Popen[bytes]] = []
        self._pending: list[int] = []

    def run(self) -> int:
        self._write_pidfile()
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: self._pending.append(s))
        log = RunLog(self.plan.run_dir)
        for restart in range(self.max_restarts + 1):
            rc = self._run_once(restart)
            if rc != EXIT_PREEMPTED:
                return rc
            if signal.SIGTERM in self._pending:
                return rc
            self.clock.sleep(requeue_delay(log))
        return EXIT_PREEMPTED

    def _run_once(self, restart: int) -> int:
        self._pending.clear()
        self.agents = [self._spawn(i, restart) for i in range(len(self.plan.nodes))]
        self._write_agents()
        supervisor = self.agents[0]
        lost: set[int] = set()
        while supervisor.poll() is None:
            self._relay()
            self._notice_lost_nodes(lost)
            self.clock.sleep(0.1)
        deadline = self.clock.monotonic() + AGENT_GRACE_S
        while any(a.poll() is None for a in self.agents) and self.clock.monotonic() < deadline:
            self._relay()
            self.clock.sleep(0.1)
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        return supervisor.returncode

    def _spawn(self, node_rank: int, restart: int) -> subprocess.Popen[bytes]:
        env = agent_environ(self.plan, node_rank=node_rank, job_id=self.job_id,
                            restart_count=restart, base=self.environ)
        node = self.plan.nodes[node_rank]
        ensure_private_dir(self.plan.node_local[node], what="node-local directory",
                           check_ancestors=True)
        logs = self.plan.run_dir / "logs" / node
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "agent.out", "ab") as out:
            return subprocess.Popen(
                [self.plan.python, "-m", "hpcrun.runtime", "--run-dir",
                 str(self.plan.run_dir)], env=env, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.environ.get("HPCRUN_CODE_PATH") or None,
                preexec_fn=ignored_from_exec([env.get("HPCRUN_PREEMPT_SIGNAL") or "USR1"]))

    def _notice_lost_nodes(self, lost: set[int]) -> None:
        """An agent SIGKILLed is a lost node: record it as the scheduler would (not after a
        cancel, whose SIGTERM may end an agent that is already shutting down)."""
        for i, agent in enumerate(self.agents[1:], start=1):
            rc = agent.poll()
            if i in lost or rc != -signal.SIGKILL or signal.SIGTERM in self._pending:
                continue
            lost.add(i)
            node = self.plan.nodes[i]
            record_node_failure(RunLog(self.plan.run_dir), node=node,
                                detail=f"agent of {node} killed by signal {-rc}")
            # The node comes back empty, as a replacement would: its tier 0 is gone.
            shutil.rmtree(self.plan.node_local[node], ignore_errors=True)

    def _write_agents(self) -> None:
        path = self.plan.run_dir / AGENTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schema_version": 1, "agents": {
            n: a.pid for n, a in zip(self.plan.nodes, self.agents, strict=True)}}))
        os.replace(tmp, path)

    def _relay(self) -> None:
        while self._pending:
            sig = self._pending.pop(0)
            for agent in self.agents:
                if agent.poll() is None:
                    agent.send_signal(sig)
            if sig == signal.SIGTERM:
                self._pending.append(sig)  # remembered: no requeue after a cancel
                return

    def _write_pidfile(self) -> None:
        path = self.plan.run_dir / LAUNCHER_FILE
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        path.write_text(json.dumps({"pid": os.getpid(), "job_id": self.job_id,
                                    "schema_version": 1}))


def local_job_id(pid: int) -> str:
    """The job id of the local launcher with process id ``pid`` (pure)."""
    return f"local-{pid}"


def record_node_failure(log: RunLog, *, node: str, detail: str) -> None:
    """Append a ``node_failure`` fault under the fence in force, so its supervisor sees it."""
    from hpcrun.control.fencing import fold_fences

    fence, _ = fold_fences(log.read())
    log.append_entry(FaultPayload(fault=FaultClass.NODE_FAILURE, node=node,
                                  signature=f"node_failure:{node}", detail=detail),
                     generation=fence.generation, holder=fence.holder)


def read_agents(run_dir: Path) -> dict[str, int]:
    """Node name → agent pid of the local launcher's current start; {} when absent."""
    try:
        raw = json.loads((run_dir / AGENTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    agents = raw.get("agents") if isinstance(raw, dict) else None
    if not isinstance(agents, dict):
        return {}
    return {str(k): v for k, v in agents.items() if isinstance(v, int)}


def read_launcher(run_dir: Path) -> dict[str, Any] | None:
    """The local launcher's pid and job id, validated; None when absent or malformed."""
    try:
        raw = json.loads((run_dir / LAUNCHER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
        return None
    return raw


def launcher_alive(info: Mapping[str, Any]) -> bool:
    """Whether the launcher process recorded in ``info`` is still ours and running."""
    pid = int(info["pid"])
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"hpcrun.launch.local" in cmdline


def main(argv: list[str] | None = None) -> int:
    from hpcrun.control.budget import allocation_cap
    from hpcrun.control.record import load_run_spec
    from hpcrun.launch.site import expand_path, load_site_snapshot

    p = argparse.ArgumentParser(prog="hpcrun-local")
    p.add_argument("--run-dir", required=True)
    a = p.parse_args(argv)
    run_dir = Path(a.run_dir).resolve()
    spec, site = load_run_spec(run_dir), load_site_snapshot(run_dir)
    # the allocation holds the hot spares too, as Slurm's does: each runs an idle agent
    plan = plan_local(run_dir=run_dir, nodes=spec.resources.nodes + spec.resources.spare_nodes,
                      tasks_per_node=spec.resources.tasks_per_node,
                      node_local_base=expand_path(site.node_local_path, os.environ))
    return LocalLauncher(plan, environ={**os.environ, **dict(site.env)},
                         max_restarts=allocation_cap(spec.budgets)).run()


if __name__ == "__main__":
    sys.exit(main())
