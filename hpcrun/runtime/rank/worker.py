"""A rank's entry point: ``python -m hpcrun.runtime.rank.worker`` (started by its node's agent).

Reads its identity from the environment once, bootstraps torch.distributed, builds the
:class:`~hpcrun.runtime.rank.context.Context`, runs the user's ``main(ctx)`` and exits with a status
its agent understands (:mod:`hpcrun.runtime.incarnation`), after leaving a short JSON exit report
that names the fault class of a failure.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrun.errors import (
    DataError,
    HpcrunError,
    NonFiniteError,
    SdcEchoError,
    SdcError,
    SpecError,
    StaleGenerationError,
    StorageError,
)
from hpcrun.runtime.incarnation import (
    EXIT_OK,
    EXIT_STALE,
    EXIT_USER_ERROR,
    PROBE_ENV,
    PROBE_REGISTRATION,
    Ending,
    Incarnation,
)
from hpcrun.runtime.rank.startup import StartMarks

if TYPE_CHECKING:
    from hpcrun.checkpoint.peer.read import PeerShards
    from hpcrun.control.log import RunLog
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.signals import StopFlag
    from hpcrun.runtime.rank.context import Context

_FAULT_OF = (
    (StaleGenerationError, "stale"),
    (NonFiniteError, "nonfinite"),
    (DataError, "data_error"),
    (StorageError, "storage_error"),
    (SdcError, "sdc"),
)


def resolve_entrypoint(entrypoint: str, code_path: str | None = None) -> Callable[[Any], Any]:
    """Import ``pkg.module:function``; raise SpecError saying what could not be found."""
    if code_path and code_path not in sys.path:
        sys.path.insert(0, code_path)
    module_name, _, func_name = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"entrypoint module {module_name!r} cannot be imported ({exc}); "
                        "check `entrypoint` in run.yaml and that the code is on the "
                        "compute nodes") from exc
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise SpecError(f"entrypoint {entrypoint!r}: {module_name} has no callable "
                        f"{func_name!r}; expected `module:function` taking ctx")
    return fn  # type: ignore[no-any-return]


HANG = "hang"
"""A collective ran past its timeout: some rank did not arrive."""
_TIMEOUT_MARKS = ("Timed out waiting", "Watchdog caught collective operation timeout",
                  "collective operation timeout", "Connect timeout")
"""A collective's peer did not arrive in time. gloo connects a pair when it first talks
(``hpcrun.launch.dist.GLOO_LAZY_ENV``), so a peer that never arrives at a pair's first
exchange reads as a connect timeout."""
PEER_LOST = "peer_lost"
"""Not a fault class: the rank failed because a peer in a collective went away (an echo)."""
_PEER_LOST_MARKS = ("Connection closed by peer", "Connection reset by peer",
                    "remote worker crashed", "NCCL communicator was aborted")


def classify(exc: BaseException) -> str:
    """Fault class of an exception that ended a rank (pure)."""
    for cls, fault in _FAULT_OF:
        if isinstance(exc, cls):
            return fault
    if isinstance(exc, SdcEchoError) or _is_peer_loss(exc):
        return PEER_LOST
    if _is_collective_timeout(exc):
        return HANG
    return "user_error"


def _is_collective_timeout(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _TIMEOUT_MARKS)


def _is_peer_loss(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return name == "DistNetworkError" or (
        isinstance(exc, RuntimeError) and any(mark in text for mark in _PEER_LOST_MARKS))


def write_exit_report(path: Path, report: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(report), sort_keys=True))
    os.replace(tmp, path)


def cadence_factory(run_dir: Path, policy: Any, log: Any, *,
                    fence_slot: int = -1) -> Callable[[int], Any]:
    """The cadence timer of this incarnation, built at restore time (the step it starts from).

    M starts from the site's ``mtbf_prior_h`` combined with the interruptions and allocated
    time of the run's earlier incarnations, read once from the log here; every rank reads the
    same log, so the ranks agree on the interval.
    """
    from dataclasses import replace

    from hpcrun.checkpoint.cadence import CadenceTimer, as_cadence_policy, interruption_history
    from hpcrun.control.fencing import fold_fences
    from hpcrun.launch.site import load_site_snapshot

    prior = replace(as_cadence_policy(policy),
                    prior_mtbf_s=load_site_snapshot(run_dir).mtbf_prior_h * 3600.0)

    seen: list[Any] = []  # the context builds a timer at start and again at restore

    def build(start: int) -> Any:
        if not seen:
            # the incarnations before this one's fence: the agent's copy holds them all
            seen.append(interruption_history(fold_fences(log.read_before(fence_slot))[1]))
        return CadenceTimer(prior, start_step=start, interruptions=seen[0].interruptions,
                            exposure_s=seen[0].exposure_s)

    return build


def build_context(environ: Mapping[str, str], stop: StopFlag,
                  marks: StartMarks | None = None, dist: DistEnv | None = None) -> Context:
    """Wire a Context from the environment around the process's stop flag.

    ``marks`` records where the start went (imports, process groups, context) and is bound to
    the rank's event writer; ``dist``: this rank's place when its launcher gave it (an MPI
    task, :mod:`hpcrun.runtime.rank.mpitask`), else read from ``environ``.
    """
    from hpcrun.checkpoint import Checkpointer, CheckpointIdentity, Layout, TierLayout
    from hpcrun.control.log import RunLog, read_log_copy
    from hpcrun.control.record import load_run_spec
    from hpcrun.launch.dist import form_groups
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.gpu import GpuSettings
    from hpcrun.launch.signals import signal_number
    from hpcrun.observe.events import EventKind, EventWriter
    from hpcrun.observe.hang import install_stack_dump, stacks_path
    from hpcrun.observe.heartbeat import RankHeartbeat, SeqTicker
    from hpcrun.observe.tracker import rank_tracker
    from hpcrun.runtime import faults
    from hpcrun.runtime.incarnation import rank_events_path
    from hpcrun.runtime.rank.context import Context
    from hpcrun.runtime.rank.script import is_script_rank
    from hpcrun.runtime.sharedtier import site_deadline_s
    from hpcrun.storage import LOCAL_STORAGE, DeadlineStorage

    mark = marks.mark if marks is not None else (lambda name: None)
    mark("imports")
    image_root = check_image(environ)
    env = dist if dist is not None else DistEnv.from_environ(environ)
    inc = Incarnation.from_environ(environ)
    spec = load_run_spec(inc.run_dir)
    preempt = signal_number(environ.get("HPCRUN_PREEMPT_SIGNAL", "USR1"))
    # The agent asks a hung rank for its stacks with DUMP_SIGNAL, whose default action kills.
    install_stack_dump(stacks_path(inc.run_dir, generation=inc.generation, rank=env.rank))
    settings = GpuSettings.from_environ(environ)
    bound = bind_cpus(settings.cpus)
    groups = form_groups(env, settings)
    mark("groups")
    log = RunLog(inc.run_dir)
    log.seed(read_log_copy(inc.log_copy()))  # what the agent read: only newer slots are opened
    layout = Layout(rank=env.rank, world_size=env.world_size, node_rank=env.node_rank,
                    local_rank=env.local_rank, num_nodes=env.num_nodes, node=inc.node)
    policy = spec.checkpoint
    injections = faults.from_environ(environ)
    identity = CheckpointIdentity(
        run_id=inc.run_id, spec_id=spec.spec_id, dataset_id=spec.data.dataset_id or "",
        contract=str(spec.data.contract), generation=inc.generation, holder=inc.holder)
    ckpt = Checkpointer(
        identity=identity,
        tiers=TierLayout(run_dir=inc.run_dir, node_local_root=inc.node_local_root),
        layout=layout, log=log, fence_slot=inc.fence_slot, keep_last=policy.keep_last,
        async_policy=str(policy.async_policy), group=groups.checkpoint_group,
        checksum=str(policy.checksum),
        # A hung shared tier abandons that checkpoint (commit.abandon_on_timeout), never hangs
        # training on a manifest, rename or fsync.
        storage=DeadlineStorage(LOCAL_STORAGE, deadline_s=site_deadline_s(inc.run_dir)),
        fault_hook=faults.checkpoint_hook(
            injections, rank=env.rank, restart=inc.restart_count, attempt=inc.attempt),
        peers=_peers(inc, spec, env.nodes, log),
    )
    tracker = rank_tracker(spec.observe.tracker, rank=env.rank, run_dir=inc.run_dir,
                           run_id=inc.run_id, project=spec.observe.project, log=log,
                           generation=inc.generation, holder=inc.holder)
    events = EventWriter(rank_events_path(inc, env.rank), run_id=inc.run_id,
                         generation=inc.generation, rank=env.rank, node=inc.node,
                         dataset_id=spec.data.dataset_id or "", observer=tracker)
    events.emit(EventKind.RANK_START, 0, backend=groups.backend, launcher=str(env.launcher),
                 device=str(groups.device),
                 cpus=bound, pg_init_timeout_s=settings.timeouts.init_s,
                 step_timeout_s=settings.timeouts.step_s,
                 checkpoint_timeout_s=settings.timeouts.checkpoint_s,
                 **(image_root or {}))
    heartbeat = RankHeartbeat(inc.heartbeat_dir(), rank=env.rank, min_interval_s=0.5,
                              seq=world_seq())
    _TICKERS.append(SeqTicker(heartbeat, interval_s=SEQ_TICK_S).start())
    beat = heartbeat.beat
    ctx = Context(
        env=env, incarnation=inc, spec=spec, log=log, checkpointer=ckpt,
        cadence=cadence_factory(inc.run_dir, policy, log, fence_slot=inc.fence_slot),
        events=events, stop=stop,
        heartbeat=lambda *, step, step_time_s: beat(step, step_time_s),
        device=groups.device, group=groups.host_group, preempt_signal=preempt,
        injections=injections, announce_running=not is_script_rank(environ),
        probe=_registered(inc.exit_report(env.rank), env.rank)
        if environ.get(PROBE_ENV) == PROBE_REGISTRATION else None,
    )
    if marks is not None:
        marks.mark("context")
        marks.bind(events)
    return ctx


SEQ_TICK_S = 1.0
"""How often a rank's ticker reads its collective sequence number (a counter read; it writes
the node-local beat only when the number moved while no step finished)."""
_TICKERS: list[Any] = []  # this process's sequence tickers, stopped before the group goes


def world_seq() -> Callable[[], int | None] | None:
    """The world group's collective sequence number reader (gloo and NCCL count every
    collective issued); None without one."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    get = getattr(dist.group.WORLD, "_get_sequence_number_for_group", None)
    return get if callable(get) else None


def stop_tickers() -> None:
    """Stop this process's sequence tickers (before the process group is destroyed)."""
    while _TICKERS:
        _TICKERS.pop().stop()


def check_image(environ: Mapping[str, str]) -> dict[str, str] | None:
    """In an image (its agent passed its hpcrun's version and digest): refuse a different
    hpcrun before anything else runs, and return what ``rank_start`` records of the rank's
    ``/``: ``image_root``, the directory mounted there (the image's, as its filesystem names
    it), and ``image_root_id``, its ``device:inode`` (the image directory's on the host, however
    the host's mounts name it); None on the host.

    Raises:
        ConfigError: the image's hpcrun is not the agent's (a ``user_error``: not retried).
    """
    from hpcrun.launch.container import (
        HOST_DIGEST_ENV,
        check_same_hpcrun,
        package_digest,
        root_mount,
    )
    from hpcrun.version import __version__

    if HOST_DIGEST_ENV not in environ:
        return None
    check_same_hpcrun(environ, version=__version__, digest=package_digest())
    root = os.stat("/")
    try:
        mounted = root_mount(Path("/proc/self/mountinfo").read_text())
    except OSError:
        mounted = ""
    return {"image_root": mounted, "image_root_id": f"{root.st_dev}:{root.st_ino}"}


def _peers(inc: Incarnation, spec: RunSpec, gang: tuple[str, ...],
           log: RunLog) -> PeerShards | None:
    """The restore's peer tier, in a run whose agents serve their tier 0."""
    from hpcrun.checkpoint.peer.push import serves_peers
    from hpcrun.checkpoint.peer.read import PeerShards

    if inc.node_local_root is None or not serves_peers(spec, inc.node_local_root):
        return None
    return PeerShards(run_dir=inc.run_dir, node=inc.node, gang=gang,
                      node_local_root=inc.node_local_root, log=log, fence_slot=inc.fence_slot)


def bind_cpus(cpus: tuple[int, ...]) -> str | None:
    """Bind this process to ``cpus`` (its GPU's NUMA node); return them as a CPU list.

    None when there is nothing to bind to (no GPU, topology unreadable) or the kernel refuses
    (cores outside this job's cpuset): the rank then runs where the scheduler put it.
    """
    from hpcrun.launch.gpu import format_cpulist

    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return None
    return format_cpulist(cpus)


def _registered(report_path: Path, rank: int) -> Callable[[int], None]:
    """``hpcrun preflight``'s probe end (:data:`PROBE_ENV`): the state is registered, so the
    rank leaves its exit report and exits 0 at once, before its first step."""
    def done(step: int) -> None:
        write_exit_report(report_path, {"rank": rank, "status": Ending.SUCCEEDED, "step": step})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)

    return done


def run(environ: Mapping[str, str], *, dist: DistEnv | None = None) -> int:
    """Run one rank to completion; return its exit status (``dist``: see
    :func:`build_context`)."""
    from hpcrun.launch.dist import destroy_process_group
    from hpcrun.launch.signals import StopFlag, signal_number
    from hpcrun.runtime import preemption

    marks = StartMarks(environ)
    inc = Incarnation.from_environ(environ)
    rank = int(environ.get("HPCRUN_RANK", "0"))
    report_path = inc.exit_report(rank)
    preempt = signal_number(environ.get("HPCRUN_PREEMPT_SIGNAL", "USR1"))
    ctx = None
    stop = StopFlag()
    try:
        with preemption.rank_stop_signals(preempt, stop):
            ctx = build_context(environ, stop, marks, dist)
            fn = resolve_entrypoint(ctx.spec.entrypoint, environ.get("HPCRUN_CODE_PATH"))
            marks.mark("entrypoint")
            marks.emit()
            fn(ctx)
            ctx.close()
            preemption.ignore_late_signals(preempt)
        status, ending = preemption.rank_ending(ctx.stopped)
        write_exit_report(report_path, {"rank": rank, "status": ending, "step": ctx.step})
        return status
    except BaseException as exc:  # every way out leaves a report for the agent
        fault = classify(exc)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        write_exit_report(report_path, {"rank": rank, "status": Ending.FAILED, "fault": fault,
                                        "detail": detail[-2000:],
                                        "step": ctx.step if ctx is not None else None})
        traceback.print_exc()
        if isinstance(exc, StaleGenerationError):
            return EXIT_STALE
        if isinstance(exc, HpcrunError | Exception):
            return EXIT_USER_ERROR
        raise
    finally:
        _leave_group(stop_tickers, destroy_process_group)


def _leave_group(*steps: Callable[[], None]) -> None:
    """The teardown after the exit report: a failure here (a peer already gone) is printed but
    never changes how the rank ended, which the report and the status already say."""
    for step in steps:
        try:
            step()
        except Exception:  # the rank's ending is decided
            traceback.print_exc()


def main() -> None:
    status = run(dict(os.environ))
    # Everything durable is committed and the exit report written; skip interpreter teardown
    # (joining loader threads, torch finalizers), which takes seconds on a loaded node and
    # delays the agent's view of the exit, and so the preemption path.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
