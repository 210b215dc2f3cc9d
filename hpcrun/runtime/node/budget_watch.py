"""The agents' side of a run's wall-hour and node-hour budgets: stop at the budget's end.

The budget runs out, in this order:

1. **Deadline.** When an incarnation starts, each agent reads what the run has used (the
   record's allocated time, :mod:`hpcrun.control.budget`) and fixes the moment the budget runs
   out (:meth:`BudgetWatch.start`).
2. **Stop.** Past it, the rank watch (``node/rankwatch.py``, step 1) sets its stop flag as a
   preemption signal would (:meth:`BudgetWatch.check`).
3. **Boundary.** Its relay tells the ranks; they agree to stop at the next step boundary and
   commit (``preemption.py``, steps 2 to 4).
4. **Decision.** The supervisor's decision
   (:func:`hpcrun.runtime.supervise.decide.within_budget`) ends the run FAILED with the reason;
   no requeue outlives the budget either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.budget import allocated_nodes, remaining_s, usage_of
from hpcrun.control.record import read_record

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec
    from hpcrun.launch.signals import StopFlag

BUDGET_STOP_REASON = "run budget spent"
"""The stop flag's reason when the budget, not a signal, stopped the run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetWatch:
    """The monotonic moment this incarnation's run budget runs out (None: no budget)."""

    deadline: float | None
    """``clock.monotonic()`` value past which the agent stops the gang."""
    clock: Clock = SYSTEM_CLOCK
    """The agent's clock."""

    @classmethod
    def start(cls, run_dir: Path, spec: RunSpec, *, clock: Clock = SYSTEM_CLOCK) -> BudgetWatch:
        """Read the run's usage now and fix the deadline."""
        b = spec.budgets
        if b.max_wall_hours is None and b.max_node_hours is None:
            return cls(deadline=None, clock=clock)
        usage = usage_of(read_record(run_dir), nodes=allocated_nodes(spec), now=clock.now())
        left = remaining_s(usage, b)
        return cls(deadline=None if left is None else clock.monotonic() + left, clock=clock)

    def check(self, flag: StopFlag) -> bool:
        """Set ``flag`` once the budget ran out; return whether this call set it."""
        if self.deadline is None or flag.is_set or self.clock.monotonic() < self.deadline:
            return False
        flag.set(reason=BUDGET_STOP_REASON)
        return True
