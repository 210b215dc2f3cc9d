"""What ``hpcrun status`` shows: a pure view built from record facts and observations.

:func:`build_status` takes values (record facts, events, node heartbeats, rank tails, now) and
returns a :class:`StatusView`; :func:`render_text` and :func:`status_json` render it.
:func:`build_status_from_head` builds the same view of a large gang from the run summary's head
(:mod:`hpcrun.observe.statushead`) and the named ranks' rows only, which is all the default text
prints. Finding a run's directory from its id is :mod:`hpcrun.launch.runref`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hpcrun.errors import ArgumentError
from hpcrun.observe.alerts import AlertRule, AlertSignals, default_rules, evaluate_alerts
from hpcrun.observe.ettr import GangStep
from hpcrun.observe.figures import (
    STEPS_NOT_REPORTED,
    AllocationFact,
    RunFigures,
    allocations_at,
    figure_rows,
    fmt_seconds,
    run_figures,
)
from hpcrun.observe.heartbeat import NodeHeartbeat
from hpcrun.observe.metrics import MetricSeries, status_lines
from hpcrun.observe.statushead import (
    SLOWEST_K,
    RankFindings,
    RankRow,
    StatusHead,
    head_findings,
    node_progress_of,
    node_rows,
    rank_findings,
)
from hpcrun.observe.summary import EventSummary, summarize_events, wait_fraction
from hpcrun.protocols import Event
from hpcrun.vocab import TERMINAL

STATUS_SCHEMA_VERSION = 1
ACTIVE_STATES = frozenset({"STARTING", "RUNNING", "RECOVERING"})
ALL_LINES_UP_TO = 16
"""A gang of at most this many ranks (and nodes) gets every rank and node line; a larger one
gets the gang summary and the ranks worth naming (``hpcrun status --ranks all``: every line)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointFact:
    """A committed checkpoint as the record lists it."""

    ckpt_id: str
    """Checkpoint id."""
    step: int
    """Step it captures."""
    tier: str
    """Tier it is committed on."""
    ts: float | None = None
    """Commit wall time, when known."""
    slot: int = -1
    """Log slot of the commit entry."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultFact:
    """A recorded fault."""

    fault: str
    """Fault class."""
    node: str = ""
    """Node, when known."""
    rank: int = -1
    """Rank, when known."""
    step: int = -1
    """Step, when known."""
    signature: str = ""
    """Signature for repeat detection."""
    detail: str = ""
    """One line for people."""
    ts: float | None = None
    """When it was recorded."""
    generation: int = -1
    """Generation it was recorded under (-1: unknown or unfenced)."""

    def describe(self) -> str:
        """One line saying what is known about the fault and leaving out what is not."""
        where = [f"node {self.node}" if self.node else "",
                 f"rank {self.rank}" if self.rank >= 0 else "",
                 f"step {self.step}" if self.step >= 0 else "",
                 f"in generation {self.generation}" if self.generation >= 0 else ""]
        text = " ".join(["fault:", self.fault, *(w for w in where if w)])
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordFacts:
    """The run-record fields status needs, independent of the record's own classes."""

    run_id: str
    """Run id."""
    state: str
    """Run state."""
    generation: int = 0
    """Generation in force."""
    job_ids: tuple[str, ...] = ()
    """Scheduler job ids, oldest first."""
    restarts: int = 0
    """In-allocation restarts."""
    requeues: int = 0
    """Requeues."""
    step: int = 0
    """Last validated step."""
    tokens: int = 0
    """Tokens of validated steps."""
    checkpoints: tuple[CheckpointFact, ...] = ()
    """Committed checkpoints, oldest first."""
    cursor: Mapping[str, Any] = field(default_factory=dict)
    """Data position at the newest committed step."""
    faults: tuple[FaultFact, ...] = ()
    """Recorded faults, oldest first."""
    quarantined: tuple[str, ...] = ()
    """Quarantined nodes."""
    rpo_s: float | None = None
    """The spec's RPO."""
    log_debris: tuple[str, ...] = ()
    """Files in the run's ``log/`` that are not entries (``log/NAME: what was found``)."""
    script_mode: bool = False
    """The ranks run a plain script (``script:``/``command:``): steps only if it reports them."""
    warnings: tuple[str, ...] = ()
    """What the ranks warned about in the run log (``no_restore``: no checkpoint will ever
    be committed), one line each."""
    allocations: tuple[AllocationFact, ...] = ()
    """The allocations the run held, oldest first (what ETTR and node-hours count)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankTail:
    """The last output line of one rank."""

    rank: int
    """Global rank."""
    node: str
    """Its node."""
    line: str
    """Last non-empty line of its output."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusView:
    """Everything ``hpcrun status`` shows."""

    facts: RecordFacts
    """From the record."""
    now: float
    """When the view was built."""
    step_rate: float | None
    """Steps per second over the last ``window`` steps of the current generation (only while
    the run is active)."""
    token_rate: float | None
    """Tokens per second over the same steps (only while the run is active)."""
    checkpoint_age_s: dict[str, float]
    """Age of the newest committed checkpoint per tier."""
    rpo_exposure_s: float | None
    """Work at risk: age of the newest durable (shared-tier, else any) checkpoint."""
    input_wait_ratio: float | None
    """Input wait / step time over recent steps."""
    ettr: float | None
    """ETTR so far (None without events); ``figures.ettr``."""
    waste_s: dict[str, float]
    """Waste seconds by cause so far; ``figures.waste_s``."""
    tails: tuple[RankTail, ...]
    """Last line of every rank (of the named ranks only when ``tails_complete`` is False)."""
    incidents: tuple[str, ...]
    """Open incidents: live hangs, stragglers, recent faults."""
    alerts: tuple[str, ...]
    """Alert rules that fire."""
    nodes: dict[str, dict[str, Any]]
    """Per node: heartbeat age (None without a heartbeat), its slowest rank's step (the newer
    of the heartbeat's and the step events'), and its rank count."""
    figures: RunFigures | None = None
    """ETTR, breakdown and throughputs, as the report computes them (None without events)."""
    metrics: MetricSeries | None = None
    """The training metrics the steps reported (loss first), each step once."""
    reported_step: int = 0
    """The newest step the current generation's ranks reported (the slowest rank's), which
    runs ahead of ``facts.step`` (the newest committed) between commits."""
    steps_reported: bool = True
    """Whether the ranks reported any step; False for a plain script that never does (status
    then shows no step and no ETTR: ``steps not reported by the script``)."""
    named_ranks: tuple[int, ...] = ()
    """The ranks worth naming, in rank order: hung, straggling, failed, and the
    :data:`SLOWEST_K` furthest behind the newest step (what a large gang's text status lists)."""
    rank_lines: int = 0
    """How many ranks have a line (``len(tails)`` when ``tails_complete``)."""
    tails_complete: bool = True
    """Whether ``tails`` holds every rank's line; False for the default view of a large gang
    read from the run summary's head (:func:`build_status_from_head`), which holds the named
    ranks' lines only."""


def recent_rates(all_steps: Sequence[GangStep], *, generation: int,
                 window: int = 20) -> tuple[float | None, float | None]:
    """(steps/s, tokens/s) over the last ``window`` gang steps of ``generation``."""
    steps = [s for s in all_steps if s.generation == generation][-window:]
    if len(steps) < 2:
        return None, None
    span = steps[-1].end - steps[0].end
    if span <= 0:
        return None, None
    return (len(steps) - 1) / span, sum(s.tokens for s in steps[1:]) / span


def checkpoint_ages(checkpoints: Sequence[CheckpointFact], now: float) -> dict[str, float]:
    """Age of the newest committed checkpoint on each tier (tiers without a commit time omitted)."""
    newest: dict[str, float] = {}
    for c in checkpoints:
        if c.ts is not None:
            newest[c.tier] = max(newest.get(c.tier, c.ts), c.ts)
    return {tier: max(0.0, now - ts) for tier, ts in sorted(newest.items())}


def rpo_exposure(ages: Mapping[str, float]) -> float | None:
    """Work at risk on loss of every node: shared-tier age, else the newest of any tier."""
    if "shared" in ages:
        return ages["shared"]
    return min(ages.values()) if ages else None


def input_wait_fraction(events: Sequence[Event], *, window: int = 200) -> float | None:
    """Input wait / step time over the last ``window`` rank step events (None: not measured)."""
    steps = [e for e in events if e.kind == "step"][-window:]
    return wait_fraction((float(e.data.get("dur_s", 0.0) or 0.0),
                          None if e.data.get("input_wait_s") is None
                          else float(e.data["input_wait_s"])) for e in steps)


def live_incidents(facts: RecordFacts, found: RankFindings) -> list[str]:
    """Hangs, stragglers, the last faults and log debris, one line each."""
    out = [f"hang: node {h.node} rank {h.rank} no progress for {h.stalled_s:.0f} s at step "
           f"{h.step}" for h in found.hangs]
    out += [f"straggler: node {s.node} rank {s.rank} score {s.score:.2f}"
            for s in found.stragglers]
    out += [f.describe() for f in facts.faults[-5:]]
    out += [f"log debris: {d} (`hpcrun doctor {facts.run_id}` moves it aside)"
            for d in facts.log_debris]
    return out


def named_ranks(facts: RecordFacts, found: RankFindings) -> set[int]:
    """The ranks worth naming: hung, straggling, failed (the last five faults) and the
    :data:`SLOWEST_K` furthest behind."""
    return ({h.rank for h in found.hangs if h.rank >= 0} | {s.rank for s in found.stragglers}
            | {f.rank for f in facts.faults[-5:] if f.rank >= 0} | found.slowest)


def node_progress(heartbeats: Mapping[str, NodeHeartbeat],
                  last_steps: Mapping[int, tuple[int, str]],
                  now: float) -> dict[str, dict[str, Any]]:
    """Per node: heartbeat age, the slowest rank's step and the rank count.

    Heartbeats are rate-limited, so the last steps of a run may never reach one; the step
    events (``last_steps``: rank → (step, node) of the generation in force) fill that in.
    """
    return node_progress_of(node_rows(heartbeats, last_steps), now)


def fill_tails(tails: Sequence[RankTail],
               last_steps: Mapping[int, tuple[int, str]]) -> tuple[RankTail, ...]:
    """Rank tails in rank order; a rank that printed nothing says what its events say."""
    out = []
    for t in sorted(tails, key=lambda t: t.rank):
        if not t.line.strip():
            step = last_steps.get(t.rank)
            line = (f"(no output) last step {step[0]}" if step is not None
                    else "(no output, no step yet)")
            t = RankTail(rank=t.rank, node=t.node, line=line)
        out.append(t)
    return tuple(out)


def alert_signals(facts: RecordFacts, events: Sequence[Event], now: float, *,
                  ages: Mapping[str, float], worst_straggler_score: float | None,
                  summary: EventSummary | None = None,
                  budget_used_fraction: float | None = None) -> AlertSignals:
    """Measure the alert signals from the record facts and events (or their summary);
    ``budget_used_fraction`` comes from :mod:`hpcrun.observe.campaign`."""
    if summary is not None:
        last_step, wait = summary.last_step_ts, summary.input_wait_fraction()
    else:
        last_step = max((e.ts for e in events if e.kind == "step"), default=None)
        wait = input_wait_fraction(events)
    active = facts.state in ACTIVE_STATES
    exposure = rpo_exposure(ages)
    sigs: dict[str, int] = {}
    for f in facts.faults:
        if f.signature:
            sigs[f.signature] = sigs.get(f.signature, 0) + 1
    return AlertSignals(
        no_progress_s=now - last_step if active and last_step is not None else None,
        worst_straggler_score=worst_straggler_score,
        # a finished run waits for no batch: the alert is for a run that can still act on it
        input_wait_fraction=wait if active else None,
        checkpoint_lag_ratio=(exposure / facts.rpo_s if exposure is not None and facts.rpo_s
                              else None),
        fault_signatures=sigs, budget_used_fraction=budget_used_fraction)


def build_status(facts: RecordFacts, *, events: Sequence[Event],
                 heartbeats: Mapping[str, NodeHeartbeat], tails: Sequence[RankTail],
                 now: float, rules: Sequence[AlertRule] | None = None,
                 hang_threshold_s: float = 900.0, straggler_threshold: float = 1.5,
                 window: int = 20, summary: EventSummary | None = None,
                 straggler_window: int | None = None,
                 budget_used_fraction: float | None = None) -> StatusView:
    """Assemble the status view from every rank's data (pure).

    ``summary``: the events already folded (:mod:`hpcrun.observe.summary`, what ``hpcrun
    status`` passes so it need not re-read every event); ``events`` is then ignored.
    ``straggler_window``: the window straggler scores take over each rank's step times
    (default ``window``); 1 when each rank's times are already its median over ``window``
    steps, as the run summary keeps them (:mod:`hpcrun.observe.runsummary`).
    """
    s = summary if summary is not None else summarize_events(events)
    last_steps = s.last_steps(facts.generation)
    found = rank_findings(heartbeats, last_steps, s.rank_step_times(facts.generation),
                          generation=facts.generation, active=facts.state in ACTIVE_STATES,
                          now=now, hang_threshold_s=hang_threshold_s,
                          straggler_threshold=straggler_threshold,
                          window=window if straggler_window is None else straggler_window)
    return _assemble(facts, s, found, tails=fill_tails(tails, last_steps),
                     rank_lines=len(tails), now=now, rules=rules, window=window,
                     budget_used_fraction=budget_used_fraction)


RankRows = Callable[[Iterable[int]], Sequence[RankRow]]
"""Looks up the rows of some ranks (ranks without a row left out)."""


def build_status_from_head(facts: RecordFacts, *, summary: EventSummary, head: StatusHead,
                           rank_rows: RankRows, now: float,
                           rules: Sequence[AlertRule] | None = None,
                           hang_threshold_s: float = 900.0, straggler_threshold: float = 1.5,
                           window: int = 20,
                           budget_used_fraction: float | None = None) -> StatusView | None:
    """The default view of a large gang from the run summary's head (pure): the same view as
    :func:`build_status` with every rank's data, holding only the named ranks' lines.

    ``summary``: the gang-level fold; ``rank_rows``: the rows of the ranks to name. None
    when the head cannot give that view: a gang small enough to print every line, another
    generation than the record's, or a threshold past a horizon of the head.
    """
    if head.generation != facts.generation or _every_line(head.rank_lines, len(head.nodes)):
        return None
    found = head_findings(head, active=facts.state in ACTIVE_STATES, now=now,
                          hang_threshold_s=hang_threshold_s,
                          straggler_threshold=straggler_threshold)
    if found is None:
        return None
    rows = rank_rows(sorted(named_ranks(facts, found)))
    tails = [RankTail(rank=r.rank, node=r.tail[0], line=r.tail[1]) for r in rows if r.tail]
    return _assemble(facts, summary, found, now=now, rules=rules, window=window,
                     tails=fill_tails(tails, {r.rank: r.last for r in rows if r.last}),
                     rank_lines=head.rank_lines, budget_used_fraction=budget_used_fraction,
                     complete=False)


def _assemble(facts: RecordFacts, s: EventSummary, found: RankFindings, *,
              tails: tuple[RankTail, ...], rank_lines: int, now: float,
              rules: Sequence[AlertRule] | None, window: int,
              budget_used_fraction: float | None, complete: bool = True) -> StatusView:
    step_rate, token_rate = (recent_rates(s.gang_steps(), generation=facts.generation,
                                          window=window)
                             if facts.state in ACTIVE_STATES else (None, None))
    ages = checkpoint_ages(facts.checkpoints, now)
    figures = run_figures(s, allocations=allocations_at(facts.allocations, now))
    signals = alert_signals(facts, (), now, ages=ages, worst_straggler_score=found.worst_score,
                            summary=s, budget_used_fraction=budget_used_fraction)
    alerts = evaluate_alerts(rules if rules is not None else default_rules(), signals)
    return StatusView(
        facts=facts, now=now, step_rate=step_rate, token_rate=token_rate, checkpoint_age_s=ages,
        rpo_exposure_s=rpo_exposure(ages), input_wait_ratio=s.input_wait_fraction(),
        ettr=figures.ettr if figures and figures.steps_reported else None,
        waste_s=figures.waste_s if figures else {}, tails=tails,
        incidents=tuple(live_incidents(facts, found)),
        alerts=tuple(a.message for a in alerts), nodes=found.nodes, figures=figures,
        metrics=s.metric_series(), reported_step=found.reported_step,
        steps_reported=facts.step > 0 or (figures is not None and figures.steps_reported),
        named_ranks=tuple(sorted(named_ranks(facts, found))), rank_lines=rank_lines,
        tails_complete=complete)


def _every_line(ranks: int, nodes: int) -> bool:
    """Whether a gang is small enough for status to print every rank and node line."""
    return ranks <= ALL_LINES_UP_TO and nodes <= ALL_LINES_UP_TO


def status_json(view: StatusView) -> dict[str, Any]:
    """The view as a JSON-ready dict (``hpcrun status --json``); the run state is both under
    ``facts`` and at the top level (``state``)."""
    body = asdict(view)
    body["schema_version"] = STATUS_SCHEMA_VERSION
    body["state"] = view.facts.state  # also under facts; scripts read it at the top level
    body["figures"] = view.figures.to_dict() if view.figures is not None else None
    body["metrics"] = view.metrics.to_dict() if view.metrics is not None else None
    body["data_position"] = describe_cursor(view.facts.cursor)
    return body


def _fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_seconds(seconds)


def _checkpoint_lines(view: StatusView) -> list[str]:
    f = view.facts
    if not f.checkpoints:
        return ["checkpoint  none committed yet"]
    last = f.checkpoints[-1]
    tiers = sorted({c.tier for c in f.checkpoints if c.ckpt_id == last.ckpt_id})
    ages = ", ".join(f"{t} {_fmt_age(a)} ago" for t, a in view.checkpoint_age_s.items())
    rpo = f" (RPO {_fmt_age(f.rpo_s)})" if f.rpo_s else ""
    exposure = f"{_fmt_age(view.rpo_exposure_s)} of work at risk{rpo}"
    if f.state in TERMINAL and last.step >= f.step:
        exposure = "none: the final step is committed"
    return [f"checkpoint  {last.ckpt_id} step {last.step} on {'+'.join(tiers)}"
            + (f"; {ages}" if ages else ""), f"exposure    {exposure}"]


def render_text(view: StatusView, *, all_ranks: bool = False) -> str:
    """The human status block.

    A gang of more than :data:`ALL_LINES_UP_TO` ranks or nodes gets one gang line for its
    nodes and only the ranks worth naming (:attr:`StatusView.named_ranks`) and their nodes;
    ``all_ranks`` (``--ranks all``) prints every node and rank line, which needs a view that
    holds every rank's line (:attr:`StatusView.tails_complete`).

    Raises:
        ArgumentError: ``all_ranks`` of a view that holds only the named ranks' lines.
    """
    if all_ranks and not view.tails_complete:
        raise ArgumentError("every rank line was asked of a status view that holds only the "
                            f"{len(view.tails)} named ranks' lines of {view.rank_lines:,}; "
                            "build it with collect_status(run_dir, every_rank=True)")
    f = view.facts
    lines = [
        f"run         {f.run_id}",
        f"state       {f.state}  generation {f.generation}  job "
        f"{f.job_ids[-1] if f.job_ids else '-'}  restarts {f.restarts}  requeues {f.requeues}",
        _progress_line(view),
        *(f"warning     {w}" for w in f.warnings),
        *status_lines(view.metrics),
        *_checkpoint_lines(view),
        f"data        {describe_cursor(f.cursor)}",
    ]
    if view.figures is None:
        lines.append("ETTR        - (no events yet)")
    else:
        lines += [f"{label:<11} {text}" for label, text in figure_rows(view.figures)]
    if view.input_wait_ratio is not None and f.state in ACTIVE_STATES:
        lines.append(f"input wait  {view.input_wait_ratio:.1%} of step time over the last "
                     "200 rank steps")
    every = all_ranks or _every_line(view.rank_lines, len(view.nodes))
    tails = view.tails if every else _named_tails(view)
    lines += _node_lines(view, every=every, named={t.node for t in tails})
    if f.quarantined:
        lines.append(f"quarantine  {', '.join(f.quarantined)}")
    lines += [f"incident    {i}" for i in view.incidents] or ["incidents   none open"]
    lines += [f"alert       {a}" for a in view.alerts]
    lines += [f"rank {t.rank:>5} {t.node:<12} | {t.line}" for t in tails]
    if not every:
        lines.append(f"ranks       {len(tails)} of {view.rank_lines:,} shown (hung, straggling, "
                     f"failed, the {SLOWEST_K} furthest behind); `--ranks all` for every line")
    return "\n".join(lines)


def _named_tails(view: StatusView) -> tuple[RankTail, ...]:
    named = set(view.named_ranks)
    return tuple(t for t in view.tails if t.rank in named)


def _node_lines(view: StatusView, *, every: bool, named: set[str]) -> list[str]:
    active = view.facts.state in ACTIVE_STATES
    shown = view.nodes if every else {n: d for n, d in view.nodes.items() if n in named}
    lines = [f"node        {n}" + (f" step {d['step']}" if view.steps_reported else "")
             + (f" heartbeat {_fmt_age(d['age_s'])} ago" if active and d["age_s"] is not None
                else "") for n, d in shown.items()]
    if every or not view.nodes:
        return lines
    return [_gang_line(view, active=active), *lines]


def _gang_line(view: StatusView, *, active: bool) -> str:
    """One line for every node: how many, the step range, the oldest heartbeat."""
    nodes = view.nodes.values()
    ranks = sum(int(d["ranks"]) for d in nodes)
    text = f"gang        {len(view.nodes):,} nodes, {ranks:,} ranks"
    if view.steps_reported:
        steps = [int(d["step"]) for d in nodes]
        text += f"; slowest node at step {min(steps)}, fastest at {max(steps)}"
    ages = [d["age_s"] for d in nodes if d["age_s"] is not None]
    if active and ages:
        text += f"; oldest heartbeat {_fmt_age(max(ages))} ago"
    return text


def _progress_line(view: StatusView) -> str:
    return f"progress    {progress_text(view)}"


def progress_text(view: StatusView, *, live: bool = True) -> str:
    """The run's progress in words, as status prints it; ``live=False`` leaves out the recent
    rate and the state's counts (the last line of ``submit --wait``, after the state)."""
    f = view.facts
    rate = _recent_rate(view) if live else ""
    if view.steps_reported and f.step == 0 and view.reported_step > 0:
        return f"step {view.reported_step} reported, none committed" + rate
    if view.steps_reported:
        return f"step {f.step}{'  ' if live else ', '}tokens {f.tokens:,}" + rate
    if f.state in ACTIVE_STATES and not f.script_mode:
        return "no step reported yet"
    counts = (f" (state {f.state}, requeues {f.requeues}, restarts {f.restarts})" if live
              else "")
    return STEPS_NOT_REPORTED + counts


def _recent_rate(view: StatusView) -> str:
    if view.step_rate is None or view.token_rate is None:
        return ""
    return (f"  rate {view.step_rate:.3g} steps/s, {view.token_rate:,.0f} tok/s "
            "(per wall second over the last 20 steps)")


def describe_cursor(cursor: Mapping[str, Any]) -> str:
    """The committed data position in words (never a raw dict)."""
    if not cursor:
        return "no data position committed yet"
    step = cursor.get("step")
    inner = cursor.get("cursor", cursor)  # the record keeps {"step", "cursor": envelope}
    state = inner.get("state", inner) if isinstance(inner, Mapping) else None
    head = f"at step {step}: " if isinstance(step, int) else ""
    if not isinstance(state, Mapping):
        return f"{head}a position of an unknown kind"
    pos = state.get("position")
    if isinstance(pos, Mapping):
        return head + _pipeline_position(pos, state.get("epochs"), inner)
    keys = [k for k in ("epoch", "position", "batch", "samples")
            if isinstance(state.get(k), int | float | str)]
    if keys:
        return head + " ".join(f"{k} {state[k]}" for k in keys)
    return f"{head}a position of an unknown kind"


def _pipeline_position(pos: Mapping[str, Any], epochs: Any, envelope: Any) -> str:
    """A :class:`~hpcrun.data.cursor.DataCursor` position: next batch, draws, epochs."""
    parts = [f"next global batch {pos.get('batch', '?')}"]
    mix = pos.get("mixture")
    if isinstance(mix, Mapping) and isinstance(mix.get("draw"), int):
        counts = mix.get("counts")
        per = (f" ({', '.join(str(c) for c in counts)} per source)"
               if isinstance(counts, list) and len(counts) > 1 else "")
        parts.append(f"{mix['draw']} documents drawn{per}")
    if isinstance(epochs, list) and epochs:
        word = "epoch" if len(epochs) == 1 else "epochs"
        parts.append(f"{word} {', '.join(str(e) for e in epochs)}")
    if isinstance(envelope, Mapping) and isinstance(envelope.get("dataset_id"), str):
        parts.append(f"dataset {envelope['dataset_id'][:15]}")
    return "; ".join(parts)
