"""ETTR, goodput and the waste breakdown (pure over the event log and the run's allocations).

ETTR (effective training time ratio) = productive time on accepted optimizer steps / allocated
time. Every second of every allocation is charged to exactly one bucket, so nothing is hidden:

- the gang's timeline of each allocation is built from its events (per-rank events of the same
  step or span are merged into one gang interval: the gang moves at its slowest rank);
- overlapping intervals are resolved by priority: recovery > checkpoint exposure > replay >
  input wait > productive > startup > stall;
- time no event covers is *startup* (grant to the first event: scheduling the job step,
  starting the agents and ranks) before the first event, *recovery* between one generation's
  last event and the next generation's first inside the same allocation (a restart), and
  *idle* after the last event.

An allocation runs from the scheduler's start (Slurm's ``Start``, logged by the agent on
STARTING) to the state that gave it back: the run record's allocations
(:attr:`~hpcrun.control.record.RunRecord.allocations`) carry them, and every generation that
ran inside one is charged to it. The wait before an allocation (queue, requeue backoff) is
shown as ``queue_s`` and stays outside ETTR: no node was held.

A step is *replayed* when an earlier generation already completed the same step index (work
recomputed after a restore); the first completion of each index is the accepted one. Checkpoint
writes, commits and drains count as exposure only when their event says ``blocking``; the stage
(host copy) always pauses training.

Without the record's allocations (a bare event log), allocations come from events: a
``state`` event with ``data.state == "STARTING"`` marks a generation's start (and
``data.nodes`` its size), and it ends at the end of the generation's last event; time outside
the events (start-up before them, restart gaps) is then not seen.

Tokens: a ``step`` event's ``data.tokens`` are the tokens that rank consumed; a step's gang tokens
are the sum over ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hpcrun.errors import ArgumentError
from hpcrun.observe.events import span_bounds
from hpcrun.protocols import Event


class Bucket(StrEnum):
    """Where allocated time went (productive first, then the waste causes)."""

    PRODUCTIVE = "productive"
    RECOVERY = "recovery"
    CHECKPOINT = "checkpoint"
    REPLAY = "replay"
    INPUT_WAIT = "input_wait"
    STARTUP = "startup"
    STALL = "stall"
    IDLE = "idle"


PRIORITY: tuple[Bucket, ...] = (Bucket.RECOVERY, Bucket.CHECKPOINT, Bucket.REPLAY,
                                Bucket.INPUT_WAIT, Bucket.PRODUCTIVE, Bucket.STARTUP,
                                Bucket.STALL)
"""Which bucket wins where intervals overlap, highest first."""

_SPAN_BUCKET = {"recovery": Bucket.RECOVERY, "restore": Bucket.RECOVERY,
                "ckpt_stage": Bucket.CHECKPOINT, "admission": Bucket.STARTUP,
                "collective": Bucket.STALL, "input_wait": Bucket.INPUT_WAIT}
_BLOCKING_ONLY = {"ckpt_write": Bucket.CHECKPOINT, "ckpt_commit": Bucket.CHECKPOINT,
                  "drain": Bucket.CHECKPOINT}


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """One allocation: the time a job held nodes (or one generation's, from events alone)."""

    generation: int | None = None
    """Generation that ran in it; None: every generation whose events fall inside it."""
    start: float
    """Wall time the nodes were granted."""
    end: float
    """Wall time they were released."""
    nodes: int
    """Nodes held, hot spares included."""
    spares: int = 0
    """Of those, hot spares."""
    queued_s: float = 0.0
    """Wait before it (queue, requeue backoff); outside ETTR."""
    requeued: bool = False
    """Given back for the run to go on in another allocation: the time after its last charged
    interval (the stop, the decision, the requeue, the teardown) is recovery, not idle."""

    def __post_init__(self) -> None:
        if self.end < self.start or self.nodes < 1:
            raise ArgumentError(f"allocation of generation {self.generation} needs end >= "
                                f"start and nodes >= 1, got {self.start}..{self.end}, "
                                f"{self.nodes} nodes")

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def node_hours(self) -> float:
        return self.seconds * self.nodes / 3600.0

    @property
    def spare_node_hours(self) -> float:
        return self.seconds * self.spares / 3600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Interval:
    """A stretch of the gang's time charged to one bucket."""

    start: float
    """Begin (wall s)."""
    end: float
    """End (wall s)."""
    bucket: Bucket
    """What it is charged to."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GangStep:
    """One optimizer step of the gang, merged over ranks."""

    generation: int
    """Generation that computed it."""
    step: int
    """Global step index."""
    start: float
    """Earliest rank start."""
    end: float
    """Latest rank end."""
    input_wait_s: float
    """Longest rank input wait within the step."""
    tokens: int
    """Tokens consumed by all ranks."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EttrReport:
    """ETTR, goodput, cost and the waste breakdown of a run so far."""

    allocated_s: float
    """Allocated wall time summed over allocations (gang seconds)."""
    seconds: Mapping[str, float]
    """Seconds charged to each :class:`Bucket` (they sum to ``allocated_s``)."""
    wall_s: float
    """End-to-end wall time (submission or first allocation to the last event)."""
    accepted_steps: int
    """Distinct step indices completed."""
    replayed_steps: int
    """Steps recomputed after a restore."""
    accepted_tokens: int
    """Tokens of accepted steps."""
    node_hours: float
    """Allocated node-hours, hot spares included."""
    cost_per_token: float | None
    """Price per accepted token, when a node-hour price is known."""
    spare_node_hours: float = 0.0
    """Of ``node_hours``, the hours hot spares were held."""
    queue_s: float = 0.0
    """Seconds waited for allocations (outside ``allocated_s`` and ETTR)."""
    allocations: tuple[Allocation, ...] = field(default_factory=tuple)
    """The allocations the figures cover."""

    @property
    def productive_s(self) -> float:
        return self.seconds.get(Bucket.PRODUCTIVE, 0.0)

    @property
    def ettr(self) -> float:
        """Productive / allocated, 0 when nothing was allocated."""
        return self.productive_s / self.allocated_s if self.allocated_s > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Accepted tokens per end-to-end wall second."""
        return self.accepted_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def waste_s(self) -> dict[str, float]:
        """Seconds per waste cause (everything but productive)."""
        return {k: v for k, v in self.seconds.items() if k != Bucket.PRODUCTIVE}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ettr": self.ettr, "allocated_s": self.allocated_s, "wall_s": self.wall_s,
            "seconds": dict(self.seconds), "accepted_steps": self.accepted_steps,
            "replayed_steps": self.replayed_steps, "accepted_tokens": self.accepted_tokens,
            "throughput_tokens_per_s": self.throughput, "node_hours": self.node_hours,
            "spare_node_hours": self.spare_node_hours, "queue_s": self.queue_s,
            "cost_per_token": self.cost_per_token,
        }


def gang_steps(events: Iterable[Event]) -> list[GangStep]:
    """Merge per-rank ``step`` events into gang steps, ordered by (generation, step)."""
    acc: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events:
        if e.kind == "step":
            acc[(e.generation, e.step)].append(e)
    out = []
    for (gen, step), evs in sorted(acc.items()):
        bounds = [span_bounds(e) for e in evs]
        waits = [e.data.get("input_wait_s", 0.0) for e in evs]
        toks = [e.data.get("tokens", 0) for e in evs]
        out.append(GangStep(
            generation=gen, step=step, start=min(b[0] for b in bounds),
            end=max(b[1] for b in bounds),
            input_wait_s=max((float(w) for w in waits if isinstance(w, int | float)), default=0.0),
            tokens=sum(int(t) for t in toks if isinstance(t, int | float))))
    return out


def split_replays(steps: Sequence[GangStep]) -> tuple[list[GangStep], list[GangStep]]:
    """(accepted, replayed): a step is replayed when an earlier generation completed its index."""
    seen_before: set[int] = set()
    accepted: list[GangStep] = []
    replayed: list[GangStep] = []
    by_gen: dict[int, list[GangStep]] = defaultdict(list)
    for s in steps:
        by_gen[s.generation].append(s)
    for gen in sorted(by_gen):
        for s in by_gen[gen]:
            (replayed if s.step in seen_before else accepted).append(s)
        seen_before.update(s.step for s in by_gen[gen])
    return accepted, replayed


def allocations_from_events(events: Sequence[Event]) -> list[Allocation]:
    """Allocations inferred from events (see the module docstring), by generation."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    sizes: dict[int, int] = {}
    nodes: dict[int, set[str]] = defaultdict(set)
    for e in events:
        b0, b1 = span_bounds(e)
        g = e.generation
        starts[g], ends[g] = min(starts.get(g, b0), b0), max(ends.get(g, b1), b1)
        if e.node:
            nodes[g].add(e.node)
        if e.kind == "state" and e.data.get("state") == "STARTING":
            starts[g] = min(starts[g], e.ts)
            if isinstance(e.data.get("nodes"), int) and e.data["nodes"] >= 1:
                sizes[g] = e.data["nodes"]
    return [Allocation(generation=g, start=starts[g], end=ends[g],
                       nodes=sizes.get(g, max(1, len(nodes[g])))) for g in sorted(starts)]


def span_bucket(event: Event) -> Bucket | None:
    """The bucket a non-step event's span is charged to, None when it charges nothing."""
    bucket = _SPAN_BUCKET.get(event.kind)
    if bucket is None and event.data.get("blocking") is True:
        bucket = _BLOCKING_ONLY.get(event.kind)
    return bucket


def span_intervals(events: Iterable[Event]) -> dict[int, list[Interval]]:
    """The charged spans of non-step events, by generation."""
    out: dict[int, list[Interval]] = defaultdict(list)
    for e in events:
        if (bucket := span_bucket(e)) is not None:
            b0, b1 = span_bounds(e)
            out[e.generation].append(Interval(start=b0, end=b1, bucket=bucket))
    return out


def gang_intervals(events: Sequence[Event], accepted: Sequence[GangStep],
                   replayed: Sequence[GangStep], *,
                   spans: Mapping[int, Sequence[Interval]] | None = None,
                   ) -> dict[int, list[Interval]]:
    """Every charged interval of the gang, by generation (overlaps not yet resolved).

    ``spans`` may pass :func:`span_intervals` of the events when the caller already has them.
    """
    out: dict[int, list[Interval]] = defaultdict(list)
    for s in accepted:
        cut = min(s.end, s.start + s.input_wait_s)
        out[s.generation] += [Interval(start=s.start, end=cut, bucket=Bucket.INPUT_WAIT),
                              Interval(start=cut, end=s.end, bucket=Bucket.PRODUCTIVE)]
    for s in replayed:
        out[s.generation].append(Interval(start=s.start, end=s.end, bucket=Bucket.REPLAY))
    for gen, ivs in (span_intervals(events) if spans is None else spans).items():
        out[gen].extend(ivs)
    return out


def resolve_timeline(alloc: Allocation, intervals: Sequence[Interval]) -> list[Interval]:
    """Cut ``alloc`` into non-overlapping segments, each charged to one bucket (a sweep)."""
    rank = {b: i for i, b in enumerate(PRIORITY)}
    points: list[tuple[float, int, Bucket]] = []
    for iv in intervals:
        a, b = max(iv.start, alloc.start), min(iv.end, alloc.end)
        if b > a:
            points += [(a, 1, iv.bucket), (b, -1, iv.bucket)]
    points.sort(key=lambda p: (p[0], p[1]))
    out: list[Interval] = []
    active: dict[Bucket, int] = defaultdict(int)
    cursor, seen_any = alloc.start, False
    for t, delta, bucket in [*points, (alloc.end, 0, Bucket.IDLE)]:
        if t > cursor:
            live = [b for b, n in active.items() if n > 0]
            gap = Bucket.IDLE if seen_any else Bucket.STARTUP
            _extend(out, cursor, t, min(live, key=rank.__getitem__) if live else gap)
            cursor = t
        active[bucket] += delta
        seen_any = seen_any or delta != 0
    return out


def _extend(out: list[Interval], start: float, end: float, bucket: Bucket) -> None:
    if out and out[-1].bucket == bucket and out[-1].end == start:
        out[-1] = Interval(start=out[-1].start, end=end, bucket=bucket)
    else:
        out.append(Interval(start=start, end=end, bucket=bucket))


def charge(alloc: Allocation, intervals: Sequence[Interval]) -> dict[Bucket, float]:
    """Seconds of ``alloc`` charged to each bucket; they sum to the allocation's length."""
    totals: dict[Bucket, float] = defaultdict(float)
    for seg in resolve_timeline(alloc, intervals):
        totals[seg.bucket] += seg.end - seg.start
    return dict(totals)


def allocation_intervals(alloc: Allocation,
                         by_gen: Mapping[int, Sequence[Interval]]) -> list[Interval]:
    """What ``alloc`` is charged from: its generation's intervals, or, for an allocation of
    the record, those of every generation inside it and the restart gaps between them; and
    for one given back to a requeue, its tail after the last of them as recovery."""
    if alloc.generation is not None:
        out = list(by_gen.get(alloc.generation, ()))
    else:
        inside = {g: [iv for iv in ivs if iv.end > alloc.start and iv.start < alloc.end]
                  for g, ivs in by_gen.items()}
        inside = {g: ivs for g, ivs in inside.items() if ivs}
        out = [iv for ivs in inside.values() for iv in ivs] + restart_gaps(inside)
    last = max((iv.end for iv in out), default=None)
    if alloc.requeued and last is not None and last < alloc.end:
        out.append(Interval(start=last, end=alloc.end, bucket=Bucket.RECOVERY))
    return out


def restart_gaps(by_gen: Mapping[int, Sequence[Interval]]) -> list[Interval]:
    """Recovery from one generation's last interval to the next one's first (a restart:
    the gang was torn down, the fault handled and a new gang started)."""
    bounds = sorted((min(iv.start for iv in ivs), max(iv.end for iv in ivs))
                    for ivs in by_gen.values() if ivs)
    out: list[Interval] = []
    reach = bounds[0][1] if bounds else 0.0
    for first, last in bounds[1:]:
        if first > reach:
            out.append(Interval(start=reach, end=first, bucket=Bucket.RECOVERY))
        reach = max(reach, last)
    return out


Timeline = list[tuple[Allocation, list[Interval]]]
"""Each allocation with its resolved, non-overlapping segments."""


def timeline(events: Iterable[Event], *,
             allocations: Sequence[Allocation] | None = None) -> Timeline:
    """Each allocation with its resolved segments (for plots)."""
    evs = list(events)
    allocs = list(allocations) if allocations is not None else allocations_from_events(evs)
    return timeline_from_parts(allocs, gang_steps(evs), span_intervals(evs))


def timeline_from_parts(allocs: Sequence[Allocation], steps: Sequence[GangStep],
                        spans: Mapping[int, Sequence[Interval]]) -> Timeline:
    """:func:`timeline` from the reduced inputs :func:`ettr_from_parts` charges from.

    The segments of an allocation sum, per bucket, to exactly what ETTR charges it.
    """
    accepted, replayed = split_replays(steps)
    by_gen = gang_intervals((), accepted, replayed, spans=spans)
    return [(a, resolve_timeline(a, allocation_intervals(a, by_gen))) for a in allocs]


def bin_segments(segments: Sequence[Interval], *, start: float, width: float,
                 bins: int) -> list[dict[Bucket, float]]:
    """Seconds of each bucket inside each of ``bins`` equal bins from ``start`` (for plots).

    A plot that paints each bin as a stack of its buckets' shares shows every bucket with an
    area proportional to its seconds, however short the segments are; painting thousands of
    sub-pixel segments instead shows whichever colour is drawn last.
    """
    if bins < 1 or width <= 0:
        raise ArgumentError(f"timeline needs bins >= 1 and width > 0, found bins={bins}, "
                            f"width={width}")
    step = width / bins
    out: list[dict[Bucket, float]] = [defaultdict(float) for _ in range(bins)]
    for seg in segments:
        a = max(seg.start, start)
        b = min(seg.end, start + width)
        i = min(bins - 1, max(0, int((a - start) // step)))
        while a < b and i < bins:
            edge = b if i == bins - 1 else min(b, start + (i + 1) * step)
            out[i][seg.bucket] += max(0.0, edge - a)
            a, i = edge, i + 1
    return [dict(d) for d in out]


def compute_ettr(events: Iterable[Event], *, allocations: Sequence[Allocation] | None = None,
                 submitted_ts: float | None = None, node_hour_price: float | None = None,
                 steps: Sequence[GangStep] | None = None) -> EttrReport:
    """ETTR, goodput, cost and waste of a run from its events (and allocations when known).

    ``steps`` may pass :func:`gang_steps` of the same events when the caller already has them.
    """
    evs = list(events)
    allocs = list(allocations) if allocations is not None else allocations_from_events(evs)
    return ettr_from_parts(allocs, gang_steps(evs) if steps is None else steps,
                           span_intervals(evs), submitted_ts=submitted_ts,
                           node_hour_price=node_hour_price)


def ettr_from_parts(allocs: Sequence[Allocation], steps: Sequence[GangStep],
                    spans: Mapping[int, Sequence[Interval]], *,
                    submitted_ts: float | None = None,
                    node_hour_price: float | None = None) -> EttrReport:
    """:func:`compute_ettr` from its reduced inputs (allocations, gang steps, charged spans).

    This is what an incremental event summary keeps, so status need not re-read every event.
    """
    accepted, replayed = split_replays(steps)
    by_gen = gang_intervals((), accepted, replayed, spans=spans)
    seconds = {b.value: 0.0 for b in Bucket}
    for alloc in allocs:
        for bucket, s in charge(alloc, allocation_intervals(alloc, by_gen)).items():
            seconds[bucket.value] += s
    node_hours = sum(a.node_hours for a in allocs)
    tokens = sum(s.tokens for s in accepted)
    first = min((a.start for a in allocs), default=0.0)
    origin = submitted_ts if submitted_ts is not None else first
    wall = max((a.end for a in allocs), default=origin) - origin
    cost = node_hours * node_hour_price / tokens if node_hour_price is not None and tokens else None
    return EttrReport(allocated_s=sum(a.seconds for a in allocs), seconds=seconds,
                      wall_s=max(0.0, wall), accepted_steps=len(accepted),
                      replayed_steps=len(replayed), accepted_tokens=tokens,
                      node_hours=node_hours, cost_per_token=cost,
                      spare_node_hours=sum(a.spare_node_hours for a in allocs),
                      queue_s=sum(a.queued_s for a in allocs), allocations=tuple(allocs))
