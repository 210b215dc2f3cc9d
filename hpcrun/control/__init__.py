"""hpcrun.control: run spec, run record (a fold over the log), states, retry, reconcile, cancel.

See ``hpcrun/control/README.md`` and ``docs/control-plane.md``.
"""

from __future__ import annotations

from hpcrun.control.cancel import CancelResult, cancel_run
from hpcrun.control.fencing import UNFENCED, Fence, fold_fences, is_effective
from hpcrun.control.fold import (
    CheckpointRef,
    FaultRecord,
    RunRecord,
    fold_record,
    latest_checkpoint,
)
from hpcrun.control.log import EntryKind, LogEntry, RunLog, new_holder
from hpcrun.control.reconcile import Action, ReconcilePolicy, reconcile
from hpcrun.control.record import create_run, load_run_spec, read_record
from hpcrun.control.retry import (
    RetryAction,
    RetryDecision,
    backoff_delay,
    classify_exit,
    decide_retry,
    quarantine_candidates,
)
from hpcrun.control.spec import (
    Budgets,
    CheckpointPolicy,
    CodeVersion,
    DataSpec,
    Membership,
    MembershipMode,
    Resources,
    RetryPolicy,
    RunSpec,
    freeze_spec,
    load_spec,
)
from hpcrun.control.states import is_terminal, transition
from hpcrun.control.watch import WatchResult, execute, watch_once
from hpcrun.vocab import AsyncPolicy, CadenceKind, FaultClass, ResumeContract, RunState

__all__ = [
    "UNFENCED", "Action", "AsyncPolicy", "Budgets", "CadenceKind", "CancelResult",
    "CheckpointPolicy", "CheckpointRef", "CodeVersion", "DataSpec", "EntryKind", "FaultClass",
    "FaultRecord", "Fence", "LogEntry", "Membership", "MembershipMode", "ReconcilePolicy",
    "Resources", "ResumeContract", "RetryAction", "RetryDecision", "RetryPolicy", "RunLog",
    "RunRecord",
    "RunSpec", "RunState", "WatchResult", "backoff_delay", "cancel_run", "classify_exit",
    "create_run", "decide_retry", "execute", "fold_fences", "fold_record", "freeze_spec",
    "is_effective", "is_terminal", "latest_checkpoint", "load_run_spec", "load_spec",
    "new_holder", "quarantine_candidates", "read_record", "reconcile", "transition",
    "watch_once",
]
