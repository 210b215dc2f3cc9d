"""Shared-filesystem metadata operations of one run, counted at the storage seam.

    python -m benchmarks.scale --only metaops [--ranks 64 1024 16384]

Every count comes from the real code a run executes, each node's parts behind their own
:class:`~hpcrun.storage.CountingStorage` (open, stat, listdir, mkdir, rename, unlink and fsync
as :data:`~hpcrun.storage.META_COST` prices each seam call), on a real run directory:

1. **steady training**, per node per second, over :data:`WINDOW_S` of a fake clock: the agent's
   follower of the run log at its watch tick (``LogView.follow``; beside it the listing every
   tick it replaced), the node heartbeat file (``HeartbeatAggregator``), and, in a run with
   hot spares, the liveness file each agent replaces every ``FILE_EVERY_S`` (the fallback of
   the network beat, ``LivenessBeat``) and the watchers' read of the files they watch
   (``read_liveness``: a watcher every node's, every other agent the watchers'), and node 0's
   run summary every 5 s (a gang without spares beats on the network only, no file:
   ``node_liveness(files=False)``);
2. **a checkpoint**: save metadata ops per rank and per node, from the scale benchmark's real
   Checkpointer (:func:`benchmarks.scale.__main__.run_one`), with a handful of tensors;
3. **a restart**: what each rank's start reads of the log (one ``RunLog`` per rank, read three
   times: cadence and restore up to its fence, partner copies whole) on a log of
   :data:`LOG_ENTRIES` entries, plus its restore's shard and manifest opens (the same run_one);
4. **a spare swap**: the supervisor's decision and new fence (real ``RunLog.claim`` and
   ``publish``) plus the restart of every rank.

Each phase's total at N nodes is per node x N plus node 0's part. The operations that bypass
the seam (shard bytes through h5py, the node event stream kept open for appends) are not here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcrun.control.log import EntryKind, RunLog, read_log_copy, write_log_copy
from hpcrun.observe.heartbeat import HeartbeatAggregator, write_rank_heartbeat
from hpcrun.runtime.node.logview import LogView
from hpcrun.runtime.node.membership import FILE_EVERY_S, LivenessBeat, read_liveness
from hpcrun.runtime.node.netbeat import WATCHERS
from hpcrun.runtime.node.observations import SUMMARY_INTERVAL_S
from hpcrun.storage import LOCAL_STORAGE, CountingStorage
from hpcrun.testing.fakes import FakeClock

MDS_BUDGET_OPS_S = 500.0
"""The metadata load one run may put on the shared filesystem in steady training (the
metadata server serves every job of the cluster: a Lustre MDS sustains some 10^4-10^5 ops/s
in all)."""
RESTART_TARGET_PER_RANK = 4.0
"""Metadata operations each rank's restart may cost."""
WINDOW_S = 600.0
"""Fake-clock seconds of steady training measured."""
TICK_S = 0.2
"""The agent's watch tick (``hpcrun.runtime.agent.POLL_S``)."""
LOG_ENTRIES = 60
"""Entries in the run log a restart reads (a run a few hours and checkpoints in)."""


def _rate(run: Callable[[CountingStorage, FakeClock], None]) -> float:
    """Metadata ops per second of ``run`` ticking a fake clock through :data:`WINDOW_S`."""
    st, clock = CountingStorage(LOCAL_STORAGE), FakeClock()
    while clock.monotonic() < WINDOW_S:
        run(st, clock)
        clock.sleep(TICK_S)
    return st.total_meta_ops() / WINDOW_S


def _ops(run: Callable[[CountingStorage], object]) -> int:
    st = CountingStorage(LOCAL_STORAGE)
    run(st)
    return st.total_meta_ops()


def build_log(run_dir: Path, entries: int = LOG_ENTRIES) -> RunLog:
    """A run log of ``entries`` entries: a fence, states, commits and progress."""
    (run_dir / "log").mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir)
    fence = log.claim("job1.r0.a0")
    pub = {"generation": fence.generation, "holder": fence.holder}
    log.publish(EntryKind.STATE, payload={"state": "RUNNING"}, **pub)
    for i in range(max(0, entries - 2) // 2):
        log.append(EntryKind.COMMIT, payload={"ckpt_id": f"c{i}", "step": i, "tier": "shared",
                                              "manifest": f"ckpt/c{i}/manifest.json"}, **pub)
        log.append(EntryKind.PROGRESS, payload={"step": i, "tokens": i}, **pub)
    return log


def steady(root: Path, nodes: int) -> dict[str, float]:
    """Per node per second in steady training (the log quiet), and node 0's extra."""
    run_dir = root / "steady"
    build_log(run_dir)

    def follower(st: CountingStorage, clock: FakeClock, *, backoff: bool) -> None:
        key = (id(st), backoff)
        if key not in views:  # the agent read the log at its start: not steady load
            views[key] = LogView(RunLog(run_dir, storage=st), clock=clock)
            views[key].refresh()
            st.reset()
        view = views[key]
        view.follow() if backoff else view.refresh()

    views: dict[tuple[int, bool], LogView] = {}

    def spare(st: CountingStorage) -> None:
        """A hot spare idling: it lists the log every tick, to start within one of a swap."""
        key = (id(st), False)
        if key not in views:
            views[key] = LogView(RunLog(run_dir, storage=st))
            views[key].refresh()
            st.reset()
        views[key].refresh()

    aggs: dict[int, HeartbeatAggregator] = {}

    def heartbeat(st: CountingStorage, clock: FakeClock, *, progress: bool) -> None:
        """The node's 8 ranks step every second (``progress``), or stopped stepping."""
        hb_dir = root / f"hb-{progress}"
        if progress or not hb_dir.exists():
            for rank in range(8):
                write_rank_heartbeat(hb_dir, rank=rank, step=int(clock.monotonic()),
                                     ts=clock.now(), step_time_s=1.0, pid=rank + 1)
        aggs.setdefault(id(st), HeartbeatAggregator(run_dir, node="n00000", hb_dir=hb_dir,
                                                    clock=clock, storage=st)).poll()

    beat = _ops(lambda st: _one_beat(run_dir, st)) - _ops(
        lambda st: st.makedirs(run_dir / "alive"))  # the directory is made once, at start
    for n in range(nodes):  # every node's liveness file, for the watchers' read
        with LivenessBeat(run_dir, f"n{n:05d}", file_every_s=3600):
            pass
    names = [f"n{n:05d}" for n in range(nodes)]
    liveness_read = _ops(lambda st: read_liveness(run_dir, names[1:], storage=st))
    watchers_read = _ops(lambda st: read_liveness(run_dir, names[:WATCHERS], storage=st))
    summary = _ops(lambda st: st.write_atomic(run_dir / "run-summary.json", b"{}"))
    return {"log_follow": _rate(lambda st, c: follower(st, c, backoff=True)),
            "log_list_every_tick": _rate(lambda st, c: follower(st, c, backoff=False)),
            "heartbeat": _rate(lambda st, c: heartbeat(st, c, progress=True)),
            "heartbeat_stalled": _rate(lambda st, c: heartbeat(st, c, progress=False)),
            "spare_idle": _rate(lambda st, c: spare(st)),
            # every node heard on the network: no liveness file is read
            "liveness_beat": beat / FILE_EVERY_S,
            # the network silent: an agent reads the watchers' files, a watcher every file
            "liveness_read_silent": watchers_read / FILE_EVERY_S,
            "node0_liveness_read": liveness_read / FILE_EVERY_S,
            "node0_summary": summary / SUMMARY_INTERVAL_S}


def _one_beat(run_dir: Path, st: CountingStorage) -> None:
    with LivenessBeat(run_dir, "beat-probe", file_every_s=3600, storage=st):
        pass


def log_reads(root: Path, *, reads: int = 3) -> dict[str, int]:
    """One rank's start reads the log three times: its cadence history, its restore and its
    partner-copy lookup, each what precedes its incarnation's fence
    (``RunLog.read_before``). Counted from nothing (every read lists the log and opens what it
    has not read) and seeded from the node-local copy its agent leaves (``write_log_copy``)."""
    run_dir = root / "restart"
    fence = build_log(run_dir).claim("job1.r0.a1")  # the restart's fence
    copy = root / "node-local" / "logcopy.json"
    write_log_copy(copy, RunLog(run_dir).read())  # the agent's view, already read
    out = {"reads": reads}
    for name, seeded in (("cold", False), ("seeded", True)):
        st = CountingStorage(LOCAL_STORAGE)
        log = RunLog(run_dir, storage=st)
        if seeded:
            log.seed(read_log_copy(copy))
        for i in range(reads):
            log.read_before(fence.slot)  # cadence, restore, partner copies
            if i == 0:
                out[f"{name}_first"] = st.total_meta_ops()
        out[f"{name}_total"] = st.total_meta_ops()
    return out


def decision(root: Path) -> int:
    """The supervisor's swap: a new fence and the start entries it publishes."""
    run_dir = root / "decision"
    build_log(run_dir)
    st = CountingStorage(LOCAL_STORAGE)
    log = RunLog(run_dir, storage=st)
    fence = log.claim("job1.r0.a1")
    for kind in (EntryKind.STATE, EntryKind.NOTE):
        log.publish(kind, generation=fence.generation, holder=fence.holder,
                    payload={"state": "RECOVERING"} if kind == EntryKind.STATE else {})
    return st.total_meta_ops()


def checkpoint_rows(ranks: list[int], tensors: int) -> dict[int, dict[str, Any]]:
    """Save and restore metadata ops per rank and node from the real Checkpointer."""
    from benchmarks.scale.__main__ import ScaleConfig, run_one

    out = {}
    for n in ranks:
        with tempfile.TemporaryDirectory(prefix="hpcrun-metaops-") as tmp:
            out[n] = run_one(ScaleConfig(ranks=n, tensors=tensors), Path(tmp))
    return out


def project(ranks: int, *, per_node: int, rates: dict[str, float], reads: dict[str, int],
            swap_decision: int, ckpt: dict[str, Any]) -> dict[str, Any]:
    """Every phase at ``ranks`` ranks: per node, per rank, in total (pure)."""
    nodes = -(-ranks // per_node)
    node = rates["log_follow"] + rates["heartbeat"]
    spare_node = node + rates["liveness_beat"]
    node0 = rates["node0_summary"]
    spares = spares_of(nodes)
    # the network silent: each of the WATCHERS reads every other node's file (node 0 among
    # them), every other agent the watchers' files
    silent = (spare_node + rates["liveness_read_silent"]) * nodes + node0 + \
        WATCHERS * rates["node0_liveness_read"] * nodes / max(1, _probe_nodes(rates))
    log_restart = reads["seeded_total"]
    restore = ckpt["restore_metadata_ops_per_rank"] - ckpt["log_ops"]
    restart_rank = log_restart + restore
    return {
        "ranks": ranks, "nodes": nodes,
        "steady_per_node_s": node, "steady_total_s": node * nodes + node0,
        # before: a listing every tick and the heartbeat file every 5 s
        "steady_before_per_node_s": rates["log_list_every_tick"] + rates["heartbeat_stalled"],
        "steady_before_total_s": (rates["log_list_every_tick"] + rates["heartbeat_stalled"])
        * nodes + node0,
        "steady_stalled_total_s": (rates["log_follow"] + rates["heartbeat_stalled"]) * nodes
        + node0,
        "spares": spares,
        "steady_spares_per_node_s": spare_node,
        "steady_spares_total_s": spare_node * nodes + node0 + spares * rates["spare_idle"],
        "steady_spares_silent_total_s": silent + spares * rates["spare_idle"],
        "checkpoint_per_rank": ckpt["save_metadata_ops_per_rank"],
        "checkpoint_per_node": ckpt["save_metadata_ops_per_node"],
        "checkpoint_total": ckpt["save_metadata_ops_per_rank"] * ranks,
        "restart_per_rank": restart_rank, "restart_per_node": restart_rank * per_node,
        "restart_log_per_rank": log_restart, "restart_restore_per_rank": restore,
        "restart_before_per_rank": reads["cold_first"] * reads["reads"] + restore,
        "restart_total": restart_rank * ranks,
        "swap_total": restart_rank * ranks + swap_decision,
    }


SPARE_EVERY = 128
"""Hot spares counted in the projection: one per this many nodes."""


def spares_of(nodes: int) -> int:
    """The hot spares a run of ``nodes`` nodes is projected with."""
    return max(1, nodes // SPARE_EVERY)


def _probe_nodes(rates: dict[str, float]) -> int:
    return int(rates.get("probe_nodes", 1))


def run(ranks: list[int], *, per_node: int = 8, tensors: int = 8) -> dict[str, Any]:
    """Measure once (the liveness read at the largest gang), project each gang size."""
    with tempfile.TemporaryDirectory(prefix="hpcrun-metaops-") as tmp:
        root = Path(tmp)
        probe = -(-max(ranks) // per_node)
        rates = {**steady(root, probe), "probe_nodes": float(probe)}
        reads = log_reads(root)
        swap = decision(root)
    ckpts = checkpoint_rows(ranks, tensors)
    rows = [project(n, per_node=per_node, rates=rates, reads=reads, swap_decision=swap,
                    ckpt=ckpts[n]) for n in ranks]
    return {"rates": rates, "log_reads": reads, "swap_decision_ops": swap, "rows": rows,
            "budget_ops_s": MDS_BUDGET_OPS_S, "restart_target_per_rank": RESTART_TARGET_PER_RANK,
            "log_entries": LOG_ENTRIES}


def render(result: dict[str, Any]) -> str:
    """The counts as a Markdown table, with the targets under it."""
    r, rows = result["rates"], result["rows"]
    lines = ["| ranks / nodes | steady ops/s per node (before) | steady ops/s total (before) | "
             "steady total, a rank stalled | with hot spares, total (network silent) | "
             "checkpoint ops per rank / node / total | "
             "restart ops per rank (log + restore; before) / node / total | spare swap total |",
             "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(
            f"| {x['ranks']:,} / {x['nodes']:,} | {x['steady_per_node_s']:.2f} "
            f"({x['steady_before_per_node_s']:.2f}) | {x['steady_total_s']:,.0f} "
            f"({x['steady_before_total_s']:,.0f}) | {x['steady_stalled_total_s']:,.0f} | "
            f"{x['steady_spares_total_s']:,.0f} with {x['spares']} "
            f"({x['steady_spares_silent_total_s']:,.0f}) | "
            f"{x['checkpoint_per_rank']:.2f} / {x['checkpoint_per_node']:.1f} / "
            f"{x['checkpoint_total']:,.0f} | {x['restart_per_rank']:.1f} "
            f"({x['restart_log_per_rank']} + {x['restart_restore_per_rank']:.1f}; "
            f"{x['restart_before_per_rank']:.0f}) / "
            f"{x['restart_per_node']:.0f} / {x['restart_total']:,.0f} | {x['swap_total']:,.0f} |")
    big = rows[-1]
    budget, target = result["budget_ops_s"], result["restart_target_per_rank"]
    reads = result["log_reads"]
    return "\n".join([*lines, "",
        f"- per node per second: log follower {r['log_follow']:.2f} (listing every "
        f"{TICK_S:g} s tick: {r['log_list_every_tick']:.2f}), heartbeat file "
        f"{r['heartbeat']:.2f} while every rank steps ({r['heartbeat_stalled']:.2f} while one "
        f"stalls), liveness file {r['liveness_beat']:.2f} (hot spares only); each hot spare "
        f"idling {r['spare_idle']:.1f}; node 0: run summary {r['node0_summary']:.1f}; with the "
        f"network silent, every agent's read of the watchers' files "
        f"{r['liveness_read_silent']:.2f} and each of the {WATCHERS} watchers' read of "
        f"{int(r['probe_nodes']) - 1:,} files {r['node0_liveness_read']:,.0f}",
        f"- a rank's start reads a {result['log_entries']}-entry log {reads['reads']} times: "
        f"{reads['cold_total']} ops from nothing ({reads['cold_first']} the first read; "
        f"{reads['cold_first'] * reads['reads']} before reads reused entries), "
        f"{reads['seeded_total']} seeded from the agent's node-local copy",
        f"- steady load at {big['nodes']:,} nodes ≤ {budget:g} ops/s: "
        f"{'met' if big['steady_total_s'] <= budget else 'NOT met'} "
        f"({big['steady_total_s']:,.0f} ops/s; {big['steady_spares_total_s']:,.0f} with "
        f"{big['spares']} hot spares)",
        f"- restart ≤ {target:g} ops per rank: "
        f"{'met' if big['restart_per_rank'] <= target else 'NOT met'} "
        f"({big['restart_per_rank']:.1f})"])


__all__ = ["MDS_BUDGET_OPS_S", "project", "render", "run"]
