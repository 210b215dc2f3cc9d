"""The effectful side of ``hpcrun status``: read a run directory into values.

Reads the record (through the control plane's reader), the event log (through the incremental
summary of :mod:`hpcrun.observe.summary`: only bytes appended since the last status are parsed),
the node heartbeats and the last line of each rank's output, and hands them to the pure
:func:`build_status`. Nothing here writes to the run directory (the summary cache is per user).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from hpcrun.observe.figures import AllocationFact
from hpcrun.observe.heartbeat import read_heartbeats
from hpcrun.observe.runsummary import RunSummary, SummaryHead, read_summary_bytes
from hpcrun.observe.status import (
    ACTIVE_STATES,
    CheckpointFact,
    FaultFact,
    RankTail,
    RecordFacts,
    StatusView,
    build_status,
    build_status_from_head,
)
from hpcrun.observe.statushead import current_heartbeats
from hpcrun.observe.summary import cached_summary

LOGS_DIR = "logs"
_RANK_OUT_RE = re.compile(r"^rank-(\d+)\.out$")
_TAIL_CHUNK = 8192


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a record object or mapping (the record's classes are not imported here)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _num(value: Any, default: float | None = None) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def checkpoint_fact(raw: Any) -> CheckpointFact:
    ts = next((v for k in ("ts", "commit_ts", "committed_ts")
               if (v := _num(_get(raw, k))) is not None), None)
    slot = _get(raw, "slot", -1)
    return CheckpointFact(ckpt_id=str(_get(raw, "ckpt_id", "?")), step=int(_get(raw, "step", -1)),
                          tier=str(_get(raw, "tier", "?")), ts=ts,
                          slot=slot if isinstance(slot, int) else -1)


def with_commit_times(run_dir: Path, checkpoints: tuple[CheckpointFact, ...]
                      ) -> tuple[CheckpointFact, ...]:
    """Fill the commit time of the newest checkpoint of each tier from its log entry."""
    from hpcrun.control.log import LogEntry, slot_name

    newest: dict[str, CheckpointFact] = {}
    for c in checkpoints:
        if c.tier not in newest or (c.step, c.slot) > (newest[c.tier].step, newest[c.tier].slot):
            newest[c.tier] = c
    out = []
    for c in checkpoints:
        if c.ts is None and c.slot >= 0 and newest.get(c.tier) is c:
            try:
                raw = (Path(run_dir) / "log" / slot_name(c.slot)).read_bytes()
                c = replace(c, ts=LogEntry.from_bytes(c.slot, raw).ts)
            except (OSError, ValueError):
                pass
        out.append(c)
    return tuple(out)


def fault_fact(raw: Any) -> FaultFact:
    rank, step, gen = _get(raw, "rank", -1), _get(raw, "step", -1), _get(raw, "generation", -1)
    fault = _get(raw, "fault", "?")
    return FaultFact(fault=str(getattr(fault, "value", fault)),
                     node=str(_get(raw, "node", "") or ""),
                     rank=rank if isinstance(rank, int) else -1,
                     step=step if isinstance(step, int) else -1,
                     signature=str(_get(raw, "signature", "") or ""),
                     detail=str(_get(raw, "detail", "") or ""), ts=_num(_get(raw, "ts")),
                     generation=gen if isinstance(gen, int) and gen >= 0 else -1)


def facts_from_record(record: Any, *, rpo_s: float | None = None) -> RecordFacts:
    """:class:`RecordFacts` from the control plane's run record (object or mapping)."""
    state = _get(record, "state", "UNKNOWN")
    cursor = _get(record, "cursor") or {}
    return RecordFacts(
        run_id=str(_get(record, "run_id", "?")), state=str(getattr(state, "value", state)),
        generation=int(_get(record, "generation", 0) or 0),
        job_ids=tuple(str(j) for j in (_get(record, "job_ids") or ())),
        restarts=int(_get(record, "restarts", 0) or 0),
        requeues=int(_get(record, "requeues", 0) or 0),
        step=int(_get(record, "step", 0) or 0), tokens=int(_get(record, "tokens", 0) or 0),
        checkpoints=tuple(checkpoint_fact(c) for c in (_get(record, "checkpoints") or ())),
        cursor=cursor if isinstance(cursor, Mapping) else _as_mapping(cursor),
        faults=tuple(fault_fact(f) for f in (_get(record, "faults") or ())),
        quarantined=tuple(str(n) for n in (_get(record, "quarantined") or ())), rpo_s=rpo_s,
        log_debris=tuple(f"log/{k}: {v}" for k, v in (_get(record, "log_debris") or {}).items()),
        allocations=tuple(allocation_fact(a) for a in (_get(record, "allocations") or ())))


def allocation_fact(raw: Any) -> AllocationFact:
    """One of the record's allocations (object or mapping) as status reads it."""
    return AllocationFact(start=_num(_get(raw, "start"), 0.0) or 0.0,
                          end=_num(_get(raw, "end")),
                          nodes=int(_get(raw, "nodes", 1) or 1),
                          spares=int(_get(raw, "spares", 0) or 0),
                          queued_s=_num(_get(raw, "queued_s"), 0.0) or 0.0,
                          requeued=_get(raw, "requeued", False) is True)


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    to_dict = getattr(obj, "to_dict", None)
    return to_dict() if callable(to_dict) else {"value": str(obj)}


def tail_lines(path: Path, n: int) -> list[str]:
    """The last ``n`` non-empty lines of a text file, reading only its end."""
    with open(path, "rb") as f:
        return tail_lines_of(f, n)


def tail_lines_of(f: BinaryIO, n: int) -> list[str]:
    """:func:`tail_lines` of a file already open for binary reading (kept open by a caller
    that reads it again and again)."""
    f.seek(0, os.SEEK_END)
    end = f.tell()
    size = min(end, _TAIL_CHUNK)
    while True:
        f.seek(end - size)
        lines = [ln for ln in f.read(size).decode("utf-8", "replace").splitlines() if ln]
        if len(lines) > n or size == end:
            return lines[-n:] if n > 0 else []
        size = min(end, size * 4)


def tail_line(lines: list[str]) -> str:
    """The line status shows for a rank: its last output line, cut to 200 characters."""
    return lines[0][:200] if lines else ""


def rank_log_files(run_dir: Path) -> dict[int, tuple[str, Path]]:
    """Each rank's output file (``logs/<node>/rank-00003.out``) with its node."""
    root = Path(run_dir) / LOGS_DIR
    out: dict[int, tuple[str, Path]] = {}
    for node in sorted(os.listdir(root)) if root.is_dir() else []:
        for name in sorted(os.listdir(root / node)) if (root / node).is_dir() else []:
            m = _RANK_OUT_RE.match(name)
            if m:
                out[int(m.group(1))] = (node, root / node / name)
    return out


def rank_tails(run_dir: Path) -> list[RankTail]:
    """Last output line of every rank."""
    tails = []
    for rank, (node, path) in sorted(rank_log_files(run_dir).items()):
        try:
            last = tail_lines(path, 1)
        except OSError:
            continue
        tails.append(RankTail(rank=rank, node=node, line=tail_line(last)))
    return tails


@dataclass(frozen=True, kw_only=True, slots=True)
class Collected:
    """A status view and how long reading took."""

    view: StatusView
    """The view."""
    read_s: float
    """Seconds spent reading the record, events, heartbeats and tails."""


RecordReader = Callable[[Path], Any]


def default_record_reader(run_dir: Path) -> Any:
    from hpcrun.control.record import read_record

    return read_record(run_dir)


def spec_rpo(run_dir: Path) -> float | None:
    """The spec's RPO, when the spec can be loaded."""
    try:
        from hpcrun.control.record import load_run_spec

        return load_run_spec(run_dir).checkpoint.rpo_s
    except Exception:  # status must still render without the spec
        return None


NO_RESTORE_WARNING = ("no checkpoint will be committed; a preemption will lose all progress "
                      "(step {step} ran with no state registered: call ctx.restore or "
                      "hpcrun.lite.restore before the loop)")


REPLICA_CHECK_OFF_WARNING = ("sdc: no replicas to compare: replica check off (a sharded model "
                             "without replicate dims; the canary and loss checks stay on)")


DDP_REBUILDS_WARNING = ("data.contract bitwise, but the DistributedDataParallel in {modules} "
                        "rebuilds its gradient buckets after its first step: a resume on 3 or "
                        "more ranks will not reproduce the bits; build it with "
                        "hpcrun.integrations.ddp.ddp(ctx, model) (or find_unused_parameters="
                        "True), see docs/recovery.md")


def run_warnings(run_dir: Path) -> tuple[str, ...]:
    """What the ranks noted in the run log that a user must know, one line each: the newest
    ``no_restore`` note (steps ran with no state registered, so no checkpoint will ever be
    committed), a ``replica_check_off`` note (the SDC replica check found no replicas) and a
    ``ddp_rebuilds`` note (a bitwise run's DDP rebuilds its buckets)."""
    from hpcrun.control.fencing import fold_fences
    from hpcrun.control.log import EntryKind, RunLog
    from hpcrun.control.notes import (
        DdpRebuildsNote,
        NoRestoreNote,
        ReplicaCheckOffNote,
        decode_note,
    )
    from hpcrun.control.payload import PayloadError

    try:
        valid = fold_fences(RunLog(run_dir).read())[1]
    except Exception:  # status must still render without the log
        return ()
    newest: dict[type, Any] = {}
    for e in valid:
        if e.kind != EntryKind.NOTE or e.payload.get("event") not in (
                "no_restore", "replica_check_off", "ddp_rebuilds"):
            continue
        try:
            note = decode_note(e.payload)
        except PayloadError:
            continue
        newest[type(note)] = note
    out = []
    if NoRestoreNote in newest:
        out.append(NO_RESTORE_WARNING.format(step=newest[NoRestoreNote].step))
    if ReplicaCheckOffNote in newest:
        out.append(REPLICA_CHECK_OFF_WARNING)
    if DdpRebuildsNote in newest:
        out.append(DDP_REBUILDS_WARNING.format(modules=", ".join(newest[DdpRebuildsNote].modules)))
    return tuple(out)


def spec_script_mode(run_dir: Path) -> bool:
    """Whether the run's ranks run a plain script (False when the spec cannot be loaded)."""
    try:
        from hpcrun.control.record import load_run_spec

        return load_run_spec(run_dir).script_mode
    except Exception:  # status must still render without the spec
        return False


def run_mtbf(run_dir: Path, *, prior_h: float) -> Any:
    """The run's MTBF estimate: its site's ``mtbf_prior_h`` (``prior_h``) combined with the
    interruptions and allocated time of all its incarnations (the same estimate the cadence
    starts from)."""
    from hpcrun.checkpoint.cadence import MtbfEstimate, interruption_history
    from hpcrun.control.fencing import fold_fences
    from hpcrun.control.log import RunLog

    history = interruption_history(fold_fences(RunLog(run_dir).read())[1])
    return MtbfEstimate(prior_s=prior_h * 3600.0, history=history)


def run_markers(run_dir: Path) -> tuple[Any, ...]:
    """The run log's requeues, restarts and restores (:func:`~hpcrun.observe.metrics.
    markers_from_log` of its valid entries)."""
    from hpcrun.control.fencing import fold_fences
    from hpcrun.control.log import RunLog
    from hpcrun.observe.metrics import markers_from_log

    return markers_from_log(fold_fences(RunLog(run_dir).read())[1])


def collect_status(run_dir: Path, *, now: float | None = None,
                   read_record: RecordReader | None = None,
                   rpo_s: float | None = None, use_run_summary: bool = True,
                   every_rank: bool = True, **options: Any) -> Collected:
    """Read a run directory and build its status view.

    Reads the record and the run summary the node-0 agent keeps (O(1) files whatever the
    gang size). Without a summary that covers the run's state (an older run, a node-0 agent
    that died before its last write, ``use_run_summary=False``) it folds every event file,
    node heartbeat and rank output itself: the same view from O(nodes + ranks) files.

    ``every_rank=False``: a view whose ``tails`` may hold only the named ranks' lines (what
    the default text status prints); from a summary's head it parses no rank's row but the
    named ranks', and every other field is the full view's.
    """
    t0 = time.perf_counter()
    record = (read_record or default_record_reader)(run_dir)
    facts = facts_from_record(record, rpo_s=rpo_s)
    facts = replace(facts, checkpoints=with_commit_times(run_dir, facts.checkpoints),
                    script_mode=spec_script_mode(run_dir), warnings=run_warnings(run_dir))
    at = time.time() if now is None else now
    with _no_cycle_collection():
        data = read_summary_bytes(run_dir) if use_run_summary else None
        view = None if data is None else _view_from_summary(
            data, facts, now=at, every_rank=every_rank, **options)
    if view is None:
        view = build_status(facts, events=(), summary=cached_summary(run_dir),
                            heartbeats=current_heartbeats(read_heartbeats(run_dir),
                                                          facts.generation),
                            tails=rank_tails(run_dir), now=at, **options)
    return Collected(view=view, read_s=time.perf_counter() - t0)


def _view_from_summary(data: bytes, facts: RecordFacts, *, now: float, every_rank: bool,
                       **options: Any) -> StatusView | None:
    """The view from the run summary's bytes: from its head when that suffices, else from
    every rank's line; None when the summary does not cover the run (or does not parse)."""
    head = None if every_rank else SummaryHead.from_bytes(data)
    if head is not None and options.get("window", head.window) == head.window and \
            head.covers(facts.state, active_states=ACTIVE_STATES):
        view = build_status_from_head(facts, summary=head.events, head=head.status,
                                      rank_rows=head.rank_rows, now=now, **options)
        if view is not None:
            return view
    rs = RunSummary.from_bytes(data)
    if rs is None or options.get("window", rs.window) != rs.window or \
            not rs.covers(facts.state, active_states=ACTIVE_STATES):
        return None
    return build_status(facts, events=(), summary=rs.events,
                        heartbeats=current_heartbeats(rs.heartbeats, facts.generation),
                        tails=[RankTail(rank=r, node=n, line=line)
                               for r, (n, line) in rs.tails.items()],
                        now=now, straggler_window=1, **options)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large summary becomes objects.

    Parsing tens of thousands of per-rank rows allocates no reference cycles, but it makes
    the collector walk every live object again and again (it more than doubled status's
    time at 16,384 ranks); reference counting still frees everything.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileOutcome:
    """What the bounded reconcile pass did."""

    ok: bool
    """Whether it finished in time without error."""
    seconds: float
    """How long it ran (or waited)."""
    detail: str
    """Its result or why it did not finish."""


def run_bounded(fn: Callable[[], Any], *, timeout_s: float) -> ReconcileOutcome:
    """Run ``fn`` in a daemon thread and stop waiting for it after ``timeout_s``."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:  # reported, never fatal to status
            result["error"] = _one_line(f"{type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    worker = threading.Thread(target=target, name="hpcrun-reconcile", daemon=True)
    worker.start()
    worker.join(timeout_s)
    took = time.perf_counter() - t0
    if worker.is_alive():
        return ReconcileOutcome(ok=False, seconds=took,
                                detail=f"timed out after {timeout_s:g} s; showing the record only")
    if "error" in result:
        return ReconcileOutcome(ok=False, seconds=took, detail=result["error"])
    return ReconcileOutcome(ok=True, seconds=took, detail=_short(result.get("value")))


def _short(value: Any) -> str:
    if value is None:
        return "no action needed"
    if callable(getattr(value, "summary", None)):
        return _one_line(value.summary())
    if isinstance(value, list | tuple):
        return f"{len(value)} action(s): " + _one_line("; ".join(str(v) for v in value))
    return _one_line(str(value))


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]
