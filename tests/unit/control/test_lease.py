"""Operation leases: passes interleaved in every order submit a run's job at most once.

The property test plays N reconcile passes against one in-memory log and a simulated Slurm.
Each pass reads the record, plans with the pure ``reconcile``, and for each action logs its
intent (with a lease), sends it (a submission is slow: it returns on a later step), and logs
``done``; whether an intent claims the run is decided by the record fold
(``hpcrun.control.lease``), exactly as ``watch.execute`` decides it. Hypothesis picks which pass
moves next, how far the clock moves, and which passes crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrun.control.entries import ActionKind, OpPayload, OpPhase
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.lease import Lease, OpClaims, claims_run, live_lease, note_op_entry
from hpcrun.control.log import EntryKind, LogEntry
from hpcrun.control.reconcile import (
    Action,
    MarkFailed,
    MarkState,
    ReconcilePolicy,
    RecordFault,
    Submit,
    reconcile,
)
from hpcrun.control.record import RunRecord, continue_fold, fold_record
from hpcrun.control.spec import RetryPolicy
from hpcrun.control.states import RunState
from hpcrun.scheduler.slurm import Observation, SlurmJobState

NOW = 1_700_000_000.0
TIMEOUT_S = 60.0
LEASE_S = 2 * TIMEOUT_S + 30
POLICY = ReconcilePolicy(retry=RetryPolicy(jitter=False), max_requeues=5)


# ---------------------------------------------------------------- the pure claim rule


def _intent(pass_id: str, *, base: int, until: float, op_id: str = "op-1") -> OpPayload:
    return OpPayload(op_id=op_id, action=ActionKind.SUBMIT, phase=OpPhase.INTENT,
                     pass_id=pass_id, base=base, lease_until=until)


def test_an_intent_while_another_pass_holds_a_live_lease_is_void() -> None:
    claims, counts = note_op_entry(OpClaims(), _intent("A", base=4, until=NOW + 100),
                                   slot=5, ts=NOW)
    assert counts and claims.lease == Lease(op_id="op-1", action="submit", pass_id="A", slot=5,
                                            until=NOW + 100)
    assert not claims_run(claims, _intent("B", base=5, until=NOW + 150), slot=6, ts=NOW + 50)
    assert live_lease(claims, NOW + 99) is not None and live_lease(claims, NOW + 100) is None
    # expired: a pass that planned after the intent takes over
    assert claims_run(claims, _intent("B", base=5, until=NOW + 250), slot=6, ts=NOW + 101)


def test_a_pass_that_planned_before_another_pass_acted_is_void() -> None:
    claims, _ = note_op_entry(OpClaims(), _intent("A", base=4, until=NOW + 1), slot=5, ts=NOW)
    claims, _ = note_op_entry(claims, OpPayload(op_id="op-1", action=ActionKind.SUBMIT,
                                                    phase=OpPhase.DONE, pass_id="A"),
                              slot=6, ts=NOW)
    assert claims.lease is None
    assert not claims_run(claims, _intent("B", base=4, until=NOW + 10), slot=7, ts=NOW + 5)
    assert claims_run(claims, _intent("B", base=6, until=NOW + 10), slot=7, ts=NOW + 5)
    assert claims_run(claims, _intent("A", base=4, until=NOW + 10, op_id="op-2"), slot=7,
                      ts=NOW + 5)  # its own entries never stop a pass


# ---------------------------------------------------------------- interleavings


@dataclass
class Sim:
    """One run's log and a Slurm that knows jobs by comment."""

    entries: list[LogEntry] = field(default_factory=list)
    now: float = NOW
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> comment
    sbatch_calls: list[str] = field(default_factory=list)  # op ids

    def append(self, kind: str, payload: dict[str, Any], *, generation: int = UNFENCED,
               holder: str = "") -> LogEntry:
        e = LogEntry(slot=len(self.entries), kind=kind, generation=generation, holder=holder,
                     ts=self.now, writer="sim", payload=payload)
        self.entries.append(e)
        return e

    def record(self) -> RunRecord:
        return fold_record(self.entries, run_id="r", spec_id="s")

    def observe(self, record: RunRecord) -> Observation | None:
        jobs = record.slurm_job_ids()
        if not jobs:
            return None
        state = SlurmJobState.PENDING if jobs[-1] in self.jobs else SlurmJobState.VANISHED
        return Observation(job_id=jobs[-1], state=state, source="squeue")


def _start() -> Sim:
    """A RUNNING run whose job 101 vanished: the next pass records, requeues, resubmits."""
    sim = Sim()
    sim.append(EntryKind.NOTE, {"event": "created"})
    sim.append(EntryKind.JOB, {"job_id": "101", "backend": "slurm"})
    sim.append(EntryKind.FENCE, {}, generation=1, holder="agent")
    for state in ("STARTING", "RUNNING"):
        sim.append(EntryKind.STATE, {"state": state}, generation=1, holder="agent")
    return sim


@dataclass
class Pass:
    """One reconcile pass as ``watch.execute`` runs it, one log write per step."""

    name: str
    record: RunRecord | None = None
    base: int = -1
    todo: list[Action] = field(default_factory=list)
    resumed: bool = False
    sending: bool = False  # a submission has been sent and not yet returned
    sent_at: float = 0.0
    job: str | None = None
    done: bool = False

    def step(self, sim: Sim) -> None:
        if self.record is None:  # read the record and plan
            self.record = sim.record()
            self.base = self.record.last_slot
            self.todo = reconcile(self.record, sim.observe(self.record), sim.now, POLICY)
        elif not self.todo:
            self.done = True
        elif self.sending:
            self._finish(sim)
        else:
            self._intent(sim)

    def _payload(self, action: Action, phase: str, **extra: Any) -> dict[str, Any]:
        return {**action.payload(), **extra, "action": action.kind.value, "phase": phase,
                "pass": self.name}

    def _intent(self, sim: Sim) -> None:
        action = self.todo[0]
        assert self.record is not None
        if self.record.op_done(action.op_id):
            self.todo.pop(0)
            return
        self.resumed = action.op_id in self.record.ops
        mine = sim.append(EntryKind.OP, self._payload(action, "intent", base=self.base,
                                                      lease_until=sim.now + LEASE_S))
        self.record = continue_fold(self.record, sim.entries[self.record.last_slot + 1:])
        lease = self.record.op_claims.lease
        if lease is None or (lease.pass_id, lease.slot) != (self.name, mine.slot):
            self.done, self.todo = True, []  # elsewhere: leave the run to the other pass
            return
        self._send(sim, action)

    def _send(self, sim: Sim, action: Action) -> None:
        if isinstance(action, Submit):
            comment = f"hpcrun:{action.op_id}"
            found = [j for j, c in sim.jobs.items() if c == comment] if self.resumed else []
            if found:
                self.job = found[-1]
            else:
                sim.sbatch_calls.append(action.op_id)
                self.sending, self.sent_at = True, sim.now  # returns on a later step
            if not self.sending:
                self._finish(sim)
            return
        if isinstance(action, MarkState | MarkFailed):
            current = sim.record()
            holder = f"watch-{self.name}"
            sim.append(EntryKind.FENCE, {}, generation=current.generation + 1, holder=holder)
            state = action.state.value if isinstance(action, MarkState) else "FAILED"
            sim.append(EntryKind.STATE, {"state": state}, generation=current.generation + 1,
                       holder=holder)
        elif isinstance(action, RecordFault):
            sim.append(EntryKind.FAULT, {"fault": action.fault.value, "op_id": action.op_id})
        self._finish(sim)

    def _finish(self, sim: Sim) -> None:
        action = self.todo.pop(0)
        if isinstance(action, Submit):
            if self.job is None:
                self.job = str(200 + len(sim.jobs))
                sim.jobs[self.job] = f"hpcrun:{action.op_id}"
            sim.append(EntryKind.JOB, {"job_id": self.job, "backend": "slurm"})
            self.sending = False
        sim.append(EntryKind.OP, self._payload(action, "done"))


def _return_overdue_submissions(sim: Sim, passes: list[Pass], later: float) -> None:
    """A sent ``sbatch`` has returned (or was killed) within the command timeout: the job
    exists in Slurm by then, whether or not its pass lives to log it."""
    for p in passes:
        if p.sending and p.job is None and later >= p.sent_at + TIMEOUT_S:
            p.job = str(200 + len(sim.jobs))
            sim.jobs[p.job] = f"hpcrun:{p.todo[0].op_id}"


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=2, max_value=5), data=st.data())
def test_interleaved_passes_submit_at_most_once(n: int, data: st.DataObject) -> None:
    sim = _start()
    passes = [Pass(name=f"p{i}") for i in range(n)]
    for _ in range(data.draw(st.integers(min_value=1, max_value=60), label="moves")):
        live = [p for p in passes if not p.done]
        if not live:
            break
        move = data.draw(st.sampled_from(["step", "step", "step", "crash", "wait", "new"]))
        if move == "wait":
            later = sim.now + data.draw(st.sampled_from([0.4, 1.5, 30.0, LEASE_S + 1]))
            _return_overdue_submissions(sim, passes, later)
            sim.now = later
        elif move == "new":
            passes.append(Pass(name=f"p{len(passes)}"))
        else:
            chosen = data.draw(st.sampled_from(live))
            if move == "crash":
                chosen.done = True
            else:
                chosen.step(sim)
        assert len(sim.jobs) <= 1, f"{len(sim.jobs)} jobs for one run: {sim.sbatch_calls}"
    # whatever happened, later passes finish the job once the leases have expired
    later = sim.now + LEASE_S + TIMEOUT_S + 1
    _return_overdue_submissions(sim, passes, later)
    sim.now = later
    for i in range(3):
        final = Pass(name=f"final{i}")
        while not final.done:
            final.step(sim)
    record = sim.record()
    assert len(sim.jobs) == 1 and len(sim.sbatch_calls) <= 1
    assert record.state == RunState.REQUEUED and record.job_ids[-1] in sim.jobs
    assert live_lease(record.op_claims, sim.now) is None
