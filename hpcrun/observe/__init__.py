"""hpcrun.observe: events, heartbeats, hang and straggler detection, ETTR, status, reports.

Light modules only are re-exported here, so ``import hpcrun.observe`` stays cheap on a login
node; the report (matplotlib) and the post-run manifest are imported from their modules.
"""

from __future__ import annotations

from hpcrun.observe.ettr import Allocation, Bucket, EttrReport, compute_ettr
from hpcrun.observe.events import EventKind, EventWriter, event_path, read_events, sorted_events
from hpcrun.observe.hang import (
    DUMP_SIGNAL,
    Hang,
    capture_stacks,
    detect_hangs,
    install_stack_dump,
    learned_threshold,
    respond_to_hang,
)
from hpcrun.observe.heartbeat import (
    HeartbeatAggregator,
    NodeHeartbeat,
    RankBeat,
    RankHeartbeat,
    read_heartbeats,
    write_rank_heartbeat,
)
from hpcrun.observe.stragglers import Straggler, find_stragglers, quarantine_candidates

__all__ = [
    "DUMP_SIGNAL",
    "Allocation",
    "Bucket",
    "EttrReport",
    "EventKind",
    "EventWriter",
    "Hang",
    "HeartbeatAggregator",
    "NodeHeartbeat",
    "RankBeat",
    "RankHeartbeat",
    "Straggler",
    "capture_stacks",
    "compute_ettr",
    "detect_hangs",
    "event_path",
    "find_stragglers",
    "install_stack_dump",
    "learned_threshold",
    "quarantine_candidates",
    "read_events",
    "read_heartbeats",
    "respond_to_hang",
    "sorted_events",
    "write_rank_heartbeat",
]
