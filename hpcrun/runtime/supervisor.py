"""What the node-0 agent decides when an incarnation ends, and how the other agents follow.

The supervisor waits for every node's ``node_exit`` note (or the first fault), then:
- every rank succeeded → the last checkpoint reaches tier 1, the run is SUCCEEDED;
- ranks stopped for a preemption → the checkpoint reaches tier 1 *before* the job ends, the run
  is PREEMPTED, then REQUEUED once (with backoff and quarantine);
- a rank failed → the control plane's retry rules choose: restart the gang inside this allocation
  (a new generation, same nodes), requeue, or FAILED with the reason.
The other agents follow the log: a newer fence for this job start means "restart with it", a
terminal or REQUEUED state means "exit".
"""

from __future__ import annotations

import random
import signal
from typing import TYPE_CHECKING, Any

from hpcrun.control.log import EntryKind
from hpcrun.errors import StaleGenerationError
from hpcrun.runtime.incarnation import EXIT_OK, EXIT_PREEMPTED, EXIT_USER_ERROR, Incarnation
from hpcrun.runtime.logview import is_gang_fault, node_exits

if TYPE_CHECKING:
    from hpcrun.runtime.agent import Agent

NODE_EXIT_WAIT_S = 60.0
FAULT_SETTLE_S = 2.0
TIER1_WAIT_S = 120.0
FOLLOW_WAIT_S = 900.0
_RNG = random.Random()


def conclude(agent: Agent, inc: Incarnation) -> tuple[int, int | None]:
    """Node 0: decide how this incarnation ended and act on it."""
    exits, faults = _gather(agent, inc)
    if faults and not agent.stop.is_set:
        return _on_fault(agent, inc, root_cause(faults))
    # A preemption is pending (the supervisor got the signal): restarting inside this
    # allocation is pointless, so whatever else happened the run commits what it has and
    # requeues; the newest committed checkpoint is the restore point.
    if not faults and exits and all(s == "succeeded" for s in exits.values()):
        _await_tier1(agent, inc)
        _publish(agent, inc, EntryKind.STATE, state="SUCCEEDED", reason="all ranks finished")
        _publish(agent, inc, EntryKind.RESULT, state="SUCCEEDED")
        return EXIT_OK, None
    _await_tier1(agent, inc)
    _publish(agent, inc, EntryKind.STATE, state="PREEMPTED",
             reason="stopped at a step boundary after a preemption signal and committed")
    fault = {"fault": "preemption", "node": None, "rank": None, "step": None,
             "signature": "preemption", "detail": "preemption or time-limit signal"}
    agent.log.append(EntryKind.FAULT, generation=inc.generation, holder=inc.holder,
                     payload=fault)
    if ended_by_slurm(agent):
        # Requeueing here would undo a user's scancel; Slurm requeues a preempted job by
        # itself, and the login node's reconcile pass (`hpcrun status`/`watch`) handles the rest.
        agent.log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
                         payload={"event": "requeue_left_to_slurm",
                                  "detail": "stopped on SIGTERM: Slurm is ending the job"})
        _outlive_allocation(agent)
        return EXIT_OK, None
    return _on_fault(agent, inc, fault, preempted=True)


def ended_by_slurm(agent: Agent) -> bool:
    """Whether the stop came from SIGTERM: Slurm itself is ending the allocation (scancel, a
    preemption's grace period, the time limit) instead of warning with the preemption signal."""
    return (agent.node.backend == "slurm" and agent.stop.signum == signal.SIGTERM
            and agent.preempt_signal != signal.SIGTERM)


def follow(agent: Agent, inc: Incarnation) -> tuple[int, int | None]:
    """Nodes other than 0: wait for the supervisor's decision and follow it."""
    deadline = agent.clock.monotonic() + FOLLOW_WAIT_S
    while agent.clock.monotonic() < deadline:
        agent.view.refresh()
        if agent.view.fence.generation != inc.generation:
            return agent._after_fenced_out(inc)
        states = agent.view.valid_of(inc.generation, inc.holder, EntryKind.STATE)
        last = str(states[-1].payload.get("state")) if states else ""
        if last in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return (EXIT_OK if last == "SUCCEEDED" else EXIT_USER_ERROR), None
        if last == "REQUEUED":
            return _requeued_exit(agent), None
        agent.clock.sleep(0.2)
    return EXIT_USER_ERROR, None


def root_cause(faults: list[dict[str, Any]]) -> dict[str, Any]:
    """The fault to act on: a lost node explains its peers' collective errors, so it comes
    first; then a rank that crashed, hung or failed otherwise, whose peers' collective errors
    surface as user errors (on another node, possibly logged first); otherwise the first
    recorded fault (the rest are its echoes). Pure."""
    lost = [f for f in faults if f.get("fault") == "node_failure"]
    causes = [f for f in faults if f.get("fault") != "user_error"]
    return (lost or causes or faults)[0]


def _gather(agent: Agent, inc: Incarnation) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Wait for every node's exit note or the first fault; a silent node is a node failure.

    After the first fault, nodes still silent get ``FAULT_SETTLE_S`` to report: a lost node's
    ``node_failure`` may land just after its peers' collective errors, and it is the cause.
    """
    deadline = agent.clock.monotonic() + NODE_EXIT_WAIT_S
    nodes = set(agent.node.nodes)
    settle_until: float | None = None
    while True:
        agent.view.refresh()
        if agent.view.fence.generation != inc.generation:
            # Cancelled or superseded: no note of this generation can count any more.
            raise StaleGenerationError(
                f"generation {inc.generation} was fenced out by generation "
                f"{agent.view.fence.generation} while its supervisor gathered node exits; "
                "this incarnation stops")
        exits = node_exits(agent.view.valid_of(inc.generation, inc.holder, EntryKind.NOTE))
        faults = [dict(e.payload)
                  for e in agent.view.valid_of(inc.generation, inc.holder, EntryKind.FAULT)
                  if is_gang_fault(dict(e.payload))]
        if faults and settle_until is None:
            settle_until = agent.clock.monotonic() + FAULT_SETTLE_S
        settled = settle_until is not None and agent.clock.monotonic() >= settle_until
        lost = any(f.get("fault") == "node_failure" for f in faults)
        if nodes <= set(exits) or (faults and (settled or lost)):
            return exits, faults
        if agent.clock.monotonic() > deadline:
            missing = sorted(nodes - set(exits))
            return exits, [{"fault": "node_failure", "node": missing[0], "rank": None,
                            "step": None, "signature": f"node_failure:{missing[0]}",
                            "detail": f"no exit report from {', '.join(missing)} within "
                                      f"{NODE_EXIT_WAIT_S:.0f} s"}]
        agent.clock.sleep(0.2)


def _unexplained(exits: dict[str, str]) -> list[dict[str, Any]]:
    """A node failed but no rank recorded a cause (every failure was a peer-loss echo)."""
    failed = sorted(n for n, s in exits.items() if s == "failed")
    if not failed:
        return []
    return [{"fault": "process_crash", "node": None, "rank": None, "step": None,
             "signature": "gang:peer_lost",
             "detail": f"ranks on {', '.join(failed)} lost their peers; no rank recorded a "
                       "cause (see the ranks' logs)"}]


def _on_fault(agent: Agent, inc: Incarnation, fault: dict[str, Any], *,
              preempted: bool = False) -> tuple[int, int | None]:
    from hpcrun.control.record import read_record
    from hpcrun.control.retry import RetryAction, decide_retry

    record = read_record(agent.run_dir)
    # A lost node cannot host a restart unless the allocation has spare nodes.
    spares = fault.get("fault") != "node_failure" or agent.spec.resources.spare_nodes > 0
    decision = decide_retry(record, _fault_record(record, fault, agent.clock.now()),
                            agent.spec.retry, max_requeues=agent.spec.budgets.max_requeues,
                            spares_available=spares,
                            rng=_RNG if agent.spec.retry.jitter else None, now=agent.clock.now())
    if decision.action == RetryAction.RESTART and not preempted:
        _publish(agent, inc, EntryKind.STATE, state="RECOVERING", reason=decision.reason)
        return EXIT_OK, inc.attempt + 1
    if decision.action == RetryAction.FAIL:
        _publish(agent, inc, EntryKind.STATE, state="FAILED", reason=decision.reason)
        _publish(agent, inc, EntryKind.RESULT, state="FAILED", reason=decision.reason)
        return EXIT_USER_ERROR, None
    if not preempted:
        _publish(agent, inc, EntryKind.STATE, state="RECOVERING", reason=decision.reason)
    return _requeue(agent, inc, decision), None


def _fault_record(record: Any, fault: dict[str, Any], now: float) -> Any:
    from hpcrun.control.record import FaultRecord
    from hpcrun.control.retry import FaultClass

    for known in reversed(record.faults):
        if (known.signature, known.node, known.rank) == (
                fault.get("signature"), fault.get("node"), fault.get("rank")):
            return known
    return FaultRecord(fault=FaultClass(str(fault["fault"])), node=fault.get("node"),
                       rank=fault.get("rank"), step=fault.get("step"),
                       signature=str(fault.get("signature", "")),
                       detail=str(fault.get("detail", "")), ts=now, slot=-1, generation=-1)


def _requeue(agent: Agent, inc: Incarnation, decision: Any) -> int:
    op_id = f"{inc.run_id}.g{inc.generation}.requeue"
    for node in decision.exclude:
        _publish_any(agent, inc, EntryKind.QUARANTINE, node=node, reason=decision.reason)
    agent.log.append(EntryKind.OP, generation=inc.generation, holder=inc.holder,
                     payload={"op_id": op_id, "action": "requeue", "delay_s": decision.delay_s,
                              "exclude": list(decision.exclude), "reason": decision.reason})
    _publish(agent, inc, EntryKind.STATE, state="REQUEUED", reason=decision.reason,
             op_id=op_id, delay_s=decision.delay_s)
    done = agent.requeuer.requeue(delay_s=decision.delay_s, exclude=decision.exclude)
    agent.log.append(EntryKind.NOTE, generation=inc.generation, holder=inc.holder,
                     payload={"event": "requeue_sent", "op_id": op_id, "detail": done})
    if getattr(agent.requeuer, "slurm_requeues", False):
        _outlive_allocation(agent)
    return _requeued_exit(agent)


def _outlive_allocation(agent: Agent) -> None:
    """Stay until Slurm ends the job: one that exits during its preemption's grace time
    completes, and Slurm never requeues it."""
    outlive = getattr(agent.requeuer, "outlive", None)
    if outlive is not None:
        outlive()


def _requeued_exit(agent: Agent) -> int:
    return EXIT_PREEMPTED if agent.node.backend == "local" else EXIT_OK


def _await_tier1(agent: Agent, inc: Incarnation) -> None:
    """Drain until the newest tier-0 commit is committed on tier 1 (bounded wait)."""
    from hpcrun.runtime.drainer import drain_round_safely

    if agent.node.node_local_root is None:
        return
    deadline = agent.clock.monotonic() + TIER1_WAIT_S
    while agent.clock.monotonic() < deadline:
        drain_round_safely(agent._drain_target(inc), agent.log, last=True)
        agent.view.refresh()
        commits = [e for e in agent.view.valid if e.kind == EntryKind.COMMIT]
        local = [e.payload.get("ckpt_id") for e in commits if e.payload.get("tier") == "node_local"]
        shared = {e.payload.get("ckpt_id") for e in commits if e.payload.get("tier") == "shared"}
        if not local or local[-1] in shared:
            return
        agent.clock.sleep(0.5)


def _publish(agent: Agent, inc: Incarnation, kind: str, **payload: Any) -> None:
    agent.log.publish(kind, generation=inc.generation, holder=inc.holder, payload=payload)


def _publish_any(agent: Agent, inc: Incarnation, kind: str, **payload: Any) -> None:
    agent.log.append(kind, generation=inc.generation, holder=inc.holder, payload=payload)
