"""The per-node agent: ``python -m hpcrun.runtime --run-dir DIR`` (one per node).

Each agent spawns its node's ranks, relays the preemption signal to them, folds their heartbeats
into one file and their events into one stream per node (:mod:`hpcrun.runtime.node.observations`),
runs the node's drain in its own process, and reports how its ranks ended in the run log. The node-0
agent also supervises: it claims each incarnation's generation, reads every node's outcome, and
decides between success, an in-allocation restart, a requeue and failure
(:mod:`hpcrun.runtime.supervise.supervisor`); in a run with hot spares, a surviving agent takes that
role over when node 0 is lost (:mod:`hpcrun.runtime.supervise.takeover`). Agents coordinate only
through the run log: the other agents find their incarnation by its fence's holder key, and a newer
fence tells them to stop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.elastic import initial_gang, survives_node_loss
from hpcrun.control.entries import (
    JobPayload,
    QuarantinePayload,
    StatePayload,
)
from hpcrun.control.log import EntryKind, RunLog, new_holder, write_log_copy
from hpcrun.control.states import RunState
from hpcrun.control.sweep import ARRAY_TASK_ENV, array_task_run_dir, point_environ
from hpcrun.errors import ConfigError, EnvError, HpcrunError, StaleGenerationError
from hpcrun.launch.ranklaunch import rank_launcher
from hpcrun.launch.signals import StopFlag, ignored_from_exec, signal_number
from hpcrun.runtime import preemption
from hpcrun.runtime.incarnation import (
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_STALE,
    EXIT_USER_ERROR,
    AgentExit,
    Ending,
    Incarnation,
    RankExit,
    node_logs_dir,
)
from hpcrun.runtime.node.drainproc import DrainProcess
from hpcrun.runtime.node.faultlog import FaultLog
from hpcrun.runtime.node.gang import Gang, RankGang, node_ending
from hpcrun.runtime.node.gpus import NodeGpus, diagnostics_dir
from hpcrun.runtime.node.image import rank_argv, rank_image, rank_python
from hpcrun.runtime.node.info import NodeInfo
from hpcrun.runtime.node.logview import LogView, decoded
from hpcrun.runtime.node.membership import node_liveness, watches_liveness
from hpcrun.runtime.node.rankwatch import FAULT_KILL_GRACE_S, RankWatch, Watched
from hpcrun.runtime.node.requeue import Requeuer, requeuer_for
from hpcrun.runtime.node.stepio import detach_stdio
from hpcrun.runtime.node.upstream import cancel_if_upstream_broken
from hpcrun.runtime.rank import script
from hpcrun.runtime.supervise.decisions import Fail
from hpcrun.runtime.supervise.supervisor import Supervisor
from hpcrun.vocab import Backend, RankLauncher

if TYPE_CHECKING:
    from hpcrun.control.log import LogEntry
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.fabric import FabricChoice
    from hpcrun.launch.site import SiteConfig
    from hpcrun.runtime.node.mpigang import AdoptedGang, MpiStep
    from hpcrun.runtime.node.observations import NodeObserver
    from hpcrun.runtime.rank.warm import WarmPool

POLL_S = 0.2
FENCE_WAIT_S = 300.0
CANCEL_WAIT_S = 30.0
"""How long the supervising agent of a cancelled run waits for the scancel that follows the
cancel's fence before it cancels its job itself (:meth:`Agent._end_job_as_cancelled`)."""


class Agent:
    """One node's agent. Constructed with its parts; :meth:`run` does the work."""

    def __init__(self, *, run_dir: Path, node: NodeInfo, spec: RunSpec, site: SiteConfig,
                 log: RunLog, requeuer: Requeuer, environ: Mapping[str, str],
                 clock: Clock = SYSTEM_CLOCK, python: str = sys.executable) -> None:
        self.run_dir = run_dir
        self.node = node
        self.spec = spec
        self.site = site
        self.log = log
        self.view = LogView(log, clock=clock)
        self.faults = FaultLog(log=log, view=self.view, node=node.node, nodes=node.nodes,
                               script_mode=spec.script_mode, clock=clock)
        self.requeuer = requeuer
        self.environ = dict(environ)
        self.clock = clock
        self.python = python
        self.preempt_signal = signal_number(site.preempt_signal)
        # what the ranks are sent on a stop: a script's own choice in script mode
        self.rank_signal = script.rank_signal(spec) if spec.script_mode else self.preempt_signal
        self.stop = StopFlag(clock=clock)
        self.rank_launcher = RankLauncher.AGENT if spec.script_mode else rank_launcher(spec, site)
        self.gpus = NodeGpus(spec=spec, site=site, environ=self.environ)
        self.image = rank_image(site.container, spec, run_dir=run_dir,
                                node_local_root=node.node_local_root, environ=self.environ,
                                python=python)
        self.warm = self._warm_pool()
        self.drains = DrainProcess(run_dir=run_dir, node=node, spec=spec, log=log,
                                   environ=self.environ, python=python)
        self.supervisor = Supervisor(run_dir=run_dir, node=node, spec=spec, log=log,
                                     view=self.view, requeuer=requeuer, stop=self.stop,
                                     preempt_signal=self.preempt_signal, clock=clock,
                                     drain=self.drains.target,
                                     grace_s=float(site.preempt_lead_s))
        self.watch = RankWatch(run_dir=run_dir, node=node.node, spec=spec, site=site,
                               stop=self.stop, rank_signal=self.rank_signal, faults=self.faults,
                               warm=self.warm, environ=self.environ, clock=clock)

    # -- lifecycle ----------------------------------------------------------------------------
    def run(self) -> int:
        """Run incarnations until the run ends here; return the agent's exit status."""
        with contextlib.ExitStack() as stack:
            if self.warm is not None:
                stack.callback(self.warm.close)
            stack.callback(self.drains.reap)
            try:
                fabric = self._fabric()
            except ConfigError as exc:
                return self._refuse_fabric(exc)
            if watches_liveness(self.spec, self.node.backend):
                if self.node.backend == Backend.SLURM:
                    detach_stdio(node_logs_dir(self.run_dir, self.node.node))
                # every agent beats from its start, whatever its incarnation does, so the
                # supervisor tells a vanished node from a busy one
                board, watched = stack.enter_context(node_liveness(
                    self.run_dir, self.node, host=fabric.address if fabric is not None else None,
                    files=survives_node_loss(self.spec)))
                self.supervisor.watch_nodes(board, watched)
            if self._serves_peers:
                stack.enter_context(self._partner_server(fabric))
            status = self._run_incarnations()
            self._end_job_as_cancelled()
            return status

    def _end_job_as_cancelled(self) -> None:
        """A cancelled run's job ends CANCELLED, as the run did. ``hpcrun cancel`` fences,
        records CANCELLED, then scancels; agents that see the fence first would all exit 0
        and Slurm would say COMPLETED. The supervising agent keeps its task (so the job) alive
        until the scancel lands, and cancels the job itself when none comes within
        :data:`CANCEL_WAIT_S` (a run an agent cancelled: its upstream can never succeed)."""
        if self.node.backend != Backend.SLURM or not self.supervisor.supervising:
            return
        self.view.refresh()
        if self.view.terminal() != RunState.CANCELLED:
            return
        if not self.supervisor.requeuer.outlive(timeout_s=CANCEL_WAIT_S, poll_s=0.5):
            print(f"hpcrun agent {self.node.node}: {self.supervisor.requeuer.release()}",
                  file=sys.stderr)

    @property
    def _serves_peers(self) -> bool:
        from hpcrun.checkpoint.peer.push import serves_peers

        return serves_peers(self.spec, self.node.node_local_root)

    def _fabric(self) -> FabricChoice | None:
        """The address this node's partner server and beat socket bind to (the site's
        ``fabric_interface``, else NodeAddr's interface), chosen once for both; None when the
        run has neither or, with nothing configured, no address is known (both then fall back
        to the node name's, and say so when it fails).

        Raises:
            ConfigError: the configured interface is not on this node; :meth:`run` stops
                (:meth:`_refuse_fabric`) before either starts, rather than send the run's
                checkpoints over another network.
        """
        if not (self._serves_peers or survives_node_loss(self.spec)):
            return None  # no partner copies and no network beats: the setting is not used
        from hpcrun.launch.fabric import resolve_fabric
        from hpcrun.runner import slurm_runner

        who = f"hpcrun agent {self.node.node}"
        try:
            choice = resolve_fabric(self.node.node, backend=self.node.backend,
                                    configured=self.site.fabric_interface, environ=self.environ,
                                    runner=slurm_runner(self.environ))
        except (EnvError, OSError) as exc:
            print(f"{who}: no fabric address ({exc}); the node name's address stands in",
                  file=sys.stderr)
            return None
        print(f"{who}: talks to the other agents on {choice.describe()}", file=sys.stderr)
        return choice

    def _refuse_fabric(self, exc: ConfigError) -> int:
        """This node lacks the configured fabric interface: the supervising agent ends the run
        FAILED with the reason, before a partner server or a beat starts; any other agent exits
        with it (its node is then lost to the supervisor, like any node that fails to start)."""
        print(f"hpcrun agent {self.node.node}: error: {exc}", file=sys.stderr)
        if not self.supervisor.supervising:
            return exc.exit_code
        fence = self.log.claim(new_holder(self.node.incarnation_key(0)))
        inc = self._incarnation(fence.generation, fence.holder, fence.slot, 0,
                                tuple(self.node.nodes))
        return self.supervisor.carry_out(inc, Fail(reason=str(exc))).status

    def _partner_server(self, fabric: FabricChoice | None
                        ) -> contextlib.AbstractContextManager[object]:
        """This node's partner server (holds its partner's copies, serves its tier 0 and those
        copies to the gang's restores) on the fabric address; a node that cannot serve keeps
        running, its partner's copies then fail and say so, and restores read tier 1 instead."""
        from hpcrun.checkpoint.peer.server import PartnerServer, node_address

        assert self.node.node_local_root is not None
        try:
            host = (fabric.address if fabric is not None
                    else node_address(self.node.node, self.node.backend))
            return PartnerServer(self.run_dir, node=self.node.node, host=host,
                                 node_local_root=self.node.node_local_root, log=self.log,
                                 fabric=fabric.record() if fabric is not None else None)
        except (HpcrunError, OSError) as exc:
            print(f"hpcrun agent {self.node.node}: no partner server: {exc}", file=sys.stderr)
            return contextlib.nullcontext()

    def _run_incarnations(self) -> int:
        attempt = 0
        with preemption.agent_stop_signals(self.preempt_signal, self.stop):
            while True:
                try:
                    inc = self._establish(attempt)
                    if inc is None:
                        return EXIT_OK
                    ended = self._run_incarnation(inc)
                except StaleGenerationError as exc:
                    print(f"hpcrun agent {self.node.node}: {exc}", file=sys.stderr)
                    return EXIT_STALE
                if ended.next_attempt is None:
                    return ended.status
                attempt = ended.next_attempt

    def _establish(self, attempt: int) -> Incarnation | None:
        key = self.node.incarnation_key(attempt)
        if self.supervisor.supervising:
            claimed = self.log.claim(new_holder(key))
            if attempt == 0 and cancel_if_upstream_broken(
                    self.run_dir, self.log, generation=claimed.generation,
                    holder=claimed.holder):
                return None
            if attempt == 0 and self.node.restart_count > 0:
                self.supervisor.record_slurm_requeue(claimed.generation, claimed.holder)
            self.drains.commit_previous(claimed.generation, claimed.holder)
            gang = self._plan_gang()
            restore_point = self._publish_start(claimed.generation, claimed.holder, attempt,
                                                gang)
            return self._incarnation(claimed.generation, claimed.holder, restore_point, attempt,
                                     gang)
        deadline = self.clock.monotonic() + FENCE_WAIT_S
        while self.clock.monotonic() < deadline:
            self.view.refresh()
            fence = self.view.fence_with_prefix(key)
            start = self._start_of(fence) if fence is not None else None
            if fence is not None and start is not None:
                slot, gang = start
                return self._incarnation(fence.generation, fence.holder, slot, attempt, gang)
            if self.view.terminal():
                return None
            if attempt > 0 and self._take_over_between(attempt):
                return self._establish(attempt)  # now this agent fences the restart
            self.clock.sleep(POLL_S)
        raise HpcrunError(f"node {self.node.node}: no fence for {key} appeared within "
                          f"{FENCE_WAIT_S:.0f} s; the node-0 agent did not start the gang")

    def _take_over_between(self, attempt: int) -> bool:
        """The supervisor decided a restart and was lost before fencing it: take over when
        this agent is its successor (the claim goes under the fence still in force)."""
        fence = self.view.fence
        return self.supervisor.take_over_if_lost(
            self._plan_gang(), generation=fence.generation, holder=fence.holder,
            attempt=attempt - 1)

    def _start_of(self, fence: LogEntry) -> tuple[int, tuple[str, ...]] | None:
        """Slot of the STARTING entry under ``fence`` (the incarnation's restore point) and
        the gang it names (the whole allocation when it names none)."""
        for e in self.view.valid_of(fence.generation, fence.holder, EntryKind.STATE):
            for p in decoded([e], StatePayload):
                if p.state == RunState.STARTING:
                    return e.slot, tuple(p.nodes or self.node.nodes)
        return None

    def _plan_gang(self) -> tuple[str, ...]:
        """The gang of this allocation's next incarnation: the membership the last decision in
        this job start named (a spare swapped in, an elastic gang shrunk), else its first
        ``resources.nodes`` usable nodes (the supervisor's own always among them; the rest are
        hot spares), else every node Slurm granted (an elastic job may get fewer)."""
        self.view.refresh()  # the decision that named the gang was published after the view
        prefix = self.node.job_start_key
        states = [e for e in self.view.valid
                  if e.kind == EntryKind.STATE and e.holder.startswith(prefix)]
        for p in reversed(decoded(states, StatePayload)):
            if p.nodes:
                return tuple(p.nodes)
        size = self.spec.resources.nodes
        if len(self.node.nodes) <= size:
            return tuple(self.node.nodes)
        quarantined = {q.node for q in decoded(self.view.valid, QuarantinePayload)}
        return initial_gang(self.node.nodes, size, quarantined - {self.node.node})

    def _publish_start(self, generation: int, holder: str, attempt: int,
                       gang: tuple[str, ...]) -> int:
        """Publish the job and the STARTING state; return STARTING's slot (the restore point)."""
        if attempt == 0:
            self.log.publish_entry(
                JobPayload(job_id=self.node.job_id, backend=self.node.backend,
                           restart_count=self.node.restart_count, nodes=tuple(self.node.nodes)),
                generation=generation, holder=holder)
        return self.log.publish_entry(
            StatePayload(state=RunState.STARTING, attempt=attempt,
                         reason=f"job {self.node.job_id} restart {self.node.restart_count} "
                                f"attempt {attempt}",
                         nodes=gang if gang != tuple(self.node.nodes) else None,
                         alloc_start=self.node.job_started if attempt == 0 else None,
                         held=len(self.node.nodes)),
            generation=generation, holder=holder).slot

    def _incarnation(self, generation: int, holder: str, slot: int, attempt: int,
                     gang: tuple[str, ...]) -> Incarnation:
        return Incarnation(
            run_dir=self.run_dir, run_id=self.run_dir.name, generation=generation, holder=holder,
            fence_slot=slot, job_id=self.node.job_id, restart_count=self.node.restart_count,
            attempt=attempt, node=self.node.node, node_local_root=self.node.node_local_root,
            gang=gang)

    # -- one incarnation ---------------------------------------------------------------------
    def _run_incarnation(self, inc: Incarnation) -> AgentExit:
        if inc.gang and self.node.node not in inc.gang:
            # a hot spare: idle warm (beating, its ranks pre-started) until a decision names
            # this node or ends the run
            if self.warm is not None:
                self.warm.fill()
            return self.supervisor.follow(inc, wait_s=None)
        gang = self._gang(inc)
        short = self.gpus.shortfall(self.node.node)
        if short is None:
            gang.start()
            if self.spec.script_mode and self.supervisor.supervising:
                self.log.publish_entry(script.running_payload(), generation=inc.generation,
                                       holder=inc.holder)
        drainer = self.drains.start(inc)
        # The end of an incarnation (preemption: commit, drain, requeue) is the critical path;
        # pay the checkpoint plane's import (torch, h5py) now, while the ranks start.
        import hpcrun.checkpoint.drain  # noqa: F401
        obs = self._observer(inc, gang)
        outcome: Watched | AgentExit | None = None
        try:
            if short is None:
                outcome = self.watch.watch(inc, gang, obs, self._moved_on)
            else:
                self.faults.gpu_shortfall(inc, short)
                outcome = Watched.FAILED
        finally:
            failed = outcome in (Watched.FAILED, Watched.PEER_FAILED)
            grace = float(self.environ.get("HPCRUN_KILL_GRACE_S", "5"))
            gang.kill(grace_s=min(grace, FAULT_KILL_GRACE_S) if failed else grace)
            self.drains.end(drainer, failed=failed, wait_s=self.supervisor.time_left())
            obs.close()  # the node stream's last lines, once the ranks are gone
        if isinstance(outcome, AgentExit):
            obs.finish()
            return outcome
        status = node_ending(gang.exits.values()) if outcome is Watched.DONE else Ending.FAILED
        if status is not Ending.FAILED and drainer is not None:
            self.drains.final_round(inc, time_left=self.supervisor.time_left,
                                    clock=self.clock)
        self.faults.node_exit(inc, status)
        ended = (self.supervisor.conclude(inc) if self.supervisor.supervising
                 else self.supervisor.follow(inc))
        obs.finish()  # decided, every node's last lines are in: the final run summary
        return ended

    def _moved_on(self, inc: Incarnation) -> Watched | AgentExit | None:
        return self.supervisor.moved_on(inc, peer_faulted=self.faults.peer_faulted)

    def _observer(self, inc: Incarnation, gang: RankGang) -> NodeObserver:
        from hpcrun.runtime.node.observations import NodeObserver

        # the run summary is node rank 0's duty: it moves with that position, a swap included
        return NodeObserver(self.run_dir, inc=inc, ranks=gang.ranks, nodes=self.node.nodes,
                            supervisor=self.node.placed(inc.gang).node_rank == 0, clock=self.clock)

    # -- processes ---------------------------------------------------------------------------
    def _gang(self, inc: Incarnation) -> RankGang:
        # one reader of the log per node: the ranks start from what this view already read
        write_log_copy(inc.log_copy(), self.view.entries)
        k = self.spec.resources.tasks_per_node
        first = self.node.placed(inc.gang).node_rank * k
        if self.rank_launcher is RankLauncher.PMIX:
            return self._mpi_gang(inc, list(range(first, first + k)))
        scripted = self.spec.script_mode
        argv = (script.rank_argv(self.spec, rank_python(self.image, self.python)) if scripted
                else ["-m", "hpcrun.runtime.rank.worker"])
        return Gang(ranks=list(range(first, first + k)), env_for=lambda r: self._rank_env(inc, r),
                    log_dir=inc.logs_dir(), exit_report_for=inc.exit_report,
                    cwd=self.environ.get("HPCRUN_CODE_PATH") or None,
                    preempt_signal=self.rank_signal, warm=self.warm,
                    argv=self._rank_argv(argv),
                    read_exit=self._script_exit if scripted else None)

    def _mpi_gang(self, inc: Incarnation, ranks: list[int]) -> AdoptedGang:
        """This node's ranks as tasks of the incarnation's ``srun --mpi=pmix`` step, which the
        supervising agent starts (:mod:`hpcrun.runtime.node.mpigang`)."""
        from hpcrun.launch.gpu import resolve_timeouts
        from hpcrun.runtime.node.mpigang import AdoptedGang
        from hpcrun.runtime.rank.mpitask import pid_path, rank_env_path

        # the rendezvous' own wait, plus an interpreter's start on a loaded node
        wait_s = resolve_timeouts(self.spec, self.site).init_s + 60.0
        return AdoptedGang(
            ranks=ranks, env_for=lambda r: self._rank_env(inc, r),
            env_path_for=lambda r: rank_env_path(self.run_dir, self.node.node,
                                                 generation=inc.generation,
                                                 attempt=inc.attempt, rank=r),
            exit_report_for=inc.exit_report, pid_path_for=lambda r: pid_path(inc, r),
            start_wait_s=wait_s,
            step=self._mpi_step(inc, wait_s) if self.supervisor.supervising else None)

    def _mpi_step(self, inc: Incarnation, wait_s: float) -> MpiStep:
        from hpcrun.launch.ranklaunch import mpi_step_argv
        from hpcrun.runtime.node.mpigang import MpiStep

        held = signal.Signals(self.preempt_signal).name.removeprefix("SIG")
        argv = mpi_step_argv(
            job_id=self.node.job_id, nodes=self.node.placed(inc.gang).nodes,
            tasks_per_node=self.spec.resources.tasks_per_node,
            # each task starts with the preemption signal ignored until its handler holds it
            python=["/bin/sh", "-c", f'trap "" {held}; exec "$@"', "hpcrun-rank", self.python],
            run_dir=str(self.run_dir), generation=inc.generation, attempt=inc.attempt,
            output=str(self.run_dir / "logs" / "%N" / "rank-%5t.out"), wait_s=wait_s)
        return MpiStep(argv=argv, env=self.environ,
                       log=inc.logs_dir() / f"mpi-step-g{inc.generation:04d}.a{inc.attempt}.out",
                       cwd=self.environ.get("HPCRUN_CODE_PATH") or None)

    def _rank_argv(self, argv: list[str]) -> list[str]:
        return rank_argv(self.image, self.python, argv)

    def _script_exit(self, ex: RankExit) -> RankExit:
        return script.script_exit(ex, stopping=self.stop.is_set)

    def _warm_pool(self) -> WarmPool | None:
        """One warm process per local rank where the cores allow it (:func:`warm_fits`;
        ``HPCRUN_WARM=1`` always, ``0`` never)."""
        from hpcrun.runtime.rank.warm import ENTRYPOINT_ENV, WARM_ENV, WarmPool, warm_fits

        setting = self.environ.get(WARM_ENV, "")
        if setting == "0" or self.spec.script_mode or self.rank_launcher is RankLauncher.PMIX:
            return None  # a script's imports are its own; an MPI launcher starts its own tasks
        # the local backend's emulated nodes all run on this machine's cores
        sharing = len(self.node.nodes) if self.node.backend == Backend.LOCAL else 1
        if setting != "1" and not warm_fits(
                ranks=self.spec.resources.tasks_per_node * sharing,
                cores=len(os.sched_getaffinity(0))):
            return None
        env = {**self._base_env(), ENTRYPOINT_ENV: self.spec.entrypoint}
        return WarmPool(slots=self.spec.resources.tasks_per_node, env=env,
                        argv=self._rank_argv(["-m", "hpcrun.runtime.rank.warm"]),
                        log_dir=self.run_dir / "logs" / self.node.node,
                        cwd=self.environ.get("HPCRUN_CODE_PATH") or None,
                        preexec=ignored_from_exec([self.preempt_signal]))

    def _base_env(self) -> dict[str, str]:
        """What every rank's environment starts from (the incarnation's variables come next)."""
        env = {k_: v for k_, v in self.environ.items() if not k_.startswith("HPCRUN_AGENT_")}
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.image is not None:
            env.update(self.image.env)
        if self.node.backend == Backend.LOCAL:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        return env

    def _rank_env(self, inc: Incarnation, rank: int) -> dict[str, str]:
        from hpcrun.launch.env import DistEnv, derive_master_port

        k = self.spec.resources.tasks_per_node
        place = self.node.placed(inc.gang)  # world size counts the gang's nodes, never the spares
        dist = DistEnv(
            rank=rank, local_rank=rank % k, node_rank=place.node_rank,
            world_size=k * len(place.nodes), local_world_size=k,
            num_nodes=len(place.nodes), nodes=place.nodes,
            master_addr=place.master_addr,
            master_port=derive_master_port(self.node.job_id, self.node.restart_count,
                                           inc.attempt),
            job_id=self.node.job_id, restart_count=self.node.restart_count, attempt=inc.attempt)
        env = self._base_env()
        env.update(dist.to_environ())
        env.update(inc.to_environ())
        env["HPCRUN_PREEMPT_SIGNAL"] = self.site.preempt_signal
        if self.spec.script_mode:
            env.update(script.rank_environ(dist, self.spec, run_id=inc.run_id))
            for key, value in script.tracker_environ(rank, run_id=inc.run_id, spec=self.spec,
                                                     run_dir=self.run_dir,
                                                     environ=self.environ).items():
                env.setdefault(key, value)  # the user's own WANDB_RUN_ID wins
        env.update(self.gpus.rank_environ(rank % k, diagnostics_dir=diagnostics_dir(inc)))
        return env

def slurm_start_of(node: NodeInfo, environ: Mapping[str, str]) -> NodeInfo:
    """``node`` with Slurm's start of the allocation when the job's environment does not carry
    it (``SLURM_JOB_START_TIME`` is newer than Slurm 22.05): one ``scontrol show job`` by the
    supervising agent, the one that logs STARTING; on any error the STARTING entry's own time
    stands in."""
    if node.backend != Backend.SLURM or node.job_started is not None or not node.is_supervisor:
        return node
    from hpcrun.runner import slurm_runner
    from hpcrun.scheduler.slurm import SlurmClient, parse_slurm_time

    try:
        fields = SlurmClient(slurm_runner(environ)).scontrol_show_job(node.job_id)
    except HpcrunError:
        return node
    return replace(node, job_started=parse_slurm_time(fields.get("StartTime", "")))


def build_agent(run_dir: Path, environ: Mapping[str, str]) -> Agent:
    """Wire an agent from the run directory and this process's environment."""
    from hpcrun.control.record import load_run_spec
    from hpcrun.launch.site import load_site_snapshot
    from hpcrun.safedirs import ensure_private_dir

    spec = load_run_spec(run_dir)
    site = load_site_snapshot(run_dir)
    node = slurm_start_of(NodeInfo.from_environ(environ, node_local_template=site.node_local_path),
                          environ)
    if node.node_local_root is not None:
        ensure_private_dir(node.node_local_root, what="node-local directory",
                           check_ancestors=True)
    ensure_private_dir(run_dir, what="run directory", mode=0o750)
    (run_dir / "logs" / node.node).mkdir(parents=True, exist_ok=True)
    return Agent(run_dir=run_dir, node=node, spec=spec, site=site, log=RunLog(run_dir),
                 requeuer=requeuer_for(node, spec, environ), environ=environ)


def agent_main(run_dir: str) -> int:
    """Entry for submitit and the job script: run this node's agent; return its status."""
    try:
        environ = dict(os.environ)
        task = environ.get(ARRAY_TASK_ENV, "")
        if task.isdigit():
            environ = point_environ(environ, int(task))
        return build_agent(array_task_run_dir(Path(run_dir), environ), environ).run()
    except HpcrunError as exc:
        print(f"hpcrun agent: error: {exc}", file=sys.stderr)
        return exc.exit_code


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="hpcrun agent", description="Run this node's hpcrun agent.")
    p.add_argument("--run-dir", required=True, help="run directory on the shared filesystem")
    a = p.parse_args(argv)
    sys.exit(agent_main(a.run_dir))


if __name__ == "__main__":
    main()

__all__ = ["EXIT_PREEMPTED", "EXIT_USER_ERROR", "Agent", "agent_main", "build_agent"]
