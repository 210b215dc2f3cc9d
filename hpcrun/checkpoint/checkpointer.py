"""The :class:`Checkpointer`: one rank's handle on the checkpoint plane (the effectful shell).

``save`` stages a host copy on the training thread (the exposed pause), writes the shard in one
background thread, and finalizes on the training thread at the next ``save``/``poll``/``wait``:
each node's leader gathers its ranks' shard reports and writes the node's sub-manifest, rank 0
gathers the leaders' summaries and commits (:mod:`hpcrun.checkpoint.hierarchy`), every rank
learns the verdict. Collectives are only
ever called from the training thread. One checkpoint is in flight; a newer save waits for it
(``block``) or is skipped (``skip``), so host memory for staging stays bounded by one buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrun.checkpoint import commit as protocol
from hpcrun.checkpoint import hierarchy
from hpcrun.checkpoint.collective import Collectives
from hpcrun.checkpoint.identity import CheckpointIdentity, TierLayout
from hpcrun.checkpoint.keys import RNG_FIELD
from hpcrun.checkpoint.readplan import need_of
from hpcrun.checkpoint.restore import as_state_values
from hpcrun.checkpoint.restorer import Loaded, PeerSource, RestoreShell
from hpcrun.checkpoint.retention import collect_run, restorable
from hpcrun.checkpoint.sharded import wrap_sharded
from hpcrun.checkpoint.shards import CHECKSUMS, ShardHeader, shard_relpath, write_shard
from hpcrun.checkpoint.stage import (
    Piece,
    StageProgress,
    StagingBuffer,
    copy_staged,
    has_device,
    nonfinite_keys,
    plan_pieces,
    prepare,
)
from hpcrun.checkpoint.state import (
    FlatState,
    Layout,
    RestoreResult,
    SaveResult,
    TensorLeaf,
    capture_rng,
    decode_tree,
    flatten_state,
    load_into,
    prepare_restore,
    restore_rng,
)
from hpcrun.checkpoint.tiers import Tier, checkpoint_id
from hpcrun.clock import SYSTEM_CLOCK, Clock
from hpcrun.control.entries import RestoreFellBackNote
from hpcrun.control.log import RunLog
from hpcrun.control.payload import canonical_json
from hpcrun.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    HpcrunError,
    NonFiniteError,
    StaleGenerationError,
    StorageTimeoutError,
)
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import AsyncPolicy

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class _InFlight:
    info: protocol.CheckpointInfo
    pause_s: float
    future: Future[protocol.ShardReport]
    staging_bytes: int


class Checkpointer:
    """Save and restore one rank's share of a run's checkpoints. See the package README."""

    def __init__(self, *, identity: CheckpointIdentity, tiers: TierLayout, layout: Layout,
                 log: RunLog, fence_slot: int = -1, keep_last: int = 2,
                 async_policy: str = "block", checksum: str = "xxh3",
                 group: ProcessGroup | None = None, clock: Clock = SYSTEM_CLOCK,
                 fault_hook: Callable[[str, int], None] | None = None,
                 staging_limit: int | None = None, storage: Storage = LOCAL_STORAGE,
                 peers: PeerSource | None = None) -> None:
        """Args:
            identity: run, spec, dataset, contract and fencing token of every checkpoint.
            tiers: where this node's tiers are.
            layout: this rank's place in the gang.
            log: the run log (commits are entries in it).
            fence_slot: restore point: restores choose among commits before this slot (-1: all).
            keep_last: committed checkpoints retention keeps (>= 2).
            async_policy: ``block`` or ``skip`` a save while the previous one is writing.
            checksum: shard checksum algorithm.
            group: host (CPU) process group of the gang (None: the default group, or a single
                process), or a :class:`Collectives` to use as is.
            clock: time source.
            fault_hook: called with each stage's name and the step of the save reaching it
                (fault injection for drills and tests; an asynchronous save reaches its later
                stages while training is steps further on).
            staging_limit: most bytes the staging buffer may hold (None: no limit).
            storage: filesystem seam.
            peers: the restore's peer tier (a shard's copies on the gang's other nodes), or
                None to read only this node's tier 0 and tier 1.
        """
        if keep_last < 2:
            raise ConfigError(f"keep_last is {keep_last}; keep at least 2 committed checkpoints "
                              "so a failed save never leaves none")
        if checksum not in CHECKSUMS or async_policy not in set(AsyncPolicy):
            raise ConfigError(f"checksum {checksum!r} / async_policy {async_policy!r} unknown; "
                              f"expected one of {CHECKSUMS} / {[str(p) for p in AsyncPolicy]}")
        self.id = identity
        self.tiers = tiers
        self.fence_slot = fence_slot
        self.keep_last = keep_last
        self.checksum = checksum
        self.policy = AsyncPolicy(async_policy)
        self.layout = layout
        self._log, self._clock, self._storage = log, clock, storage
        self._fault_hook = fault_hook or (lambda stage, step: None)
        self._comm = group if isinstance(group, Collectives) else Collectives(
            group, layout.world_size, rank=layout.rank, node=layout.node)
        self._known_keys = ""  # key-table digest the coordinator holds (nodes elide it)
        self._key_tables: dict[str, tuple[tuple[str, ...], Any]] = {}  # rank 0: by digest
        self._buffer = StagingBuffer(max_bytes=staging_limit)
        self._restorer = RestoreShell(identity=identity, tiers=tiers, layout=layout, log=log,
                                      comm=self._comm, storage=storage, buffer=self._buffer,
                                      peers=peers)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcrun-ckpt")
        # retention on its own thread: deleting an old checkpoint must not delay the next
        # save's writer (a blocking save right after a commit, as at a preemption)
        self._gc = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcrun-gc")
        self._inflight: _InFlight | None = None
        self._parent: str | None = None
        self._closed = False
        self.results: list[SaveResult] = []
        self.skipped_steps: list[int] = []

    @property
    def write_tier(self) -> Tier:
        """Tier a save commits on first: node-local when there is one."""
        return self.tiers.write_tier

    @property
    def staging_bytes(self) -> int:
        """Host memory this rank holds for staging (one reused buffer)."""
        return self._buffer.capacity

    def _ckpt_dir(self, ckpt_id: str) -> Path:
        paths = self.tiers.paths(ckpt_id, run_id=self.id.run_id)
        return paths.node_local or paths.shared

    # -- save ------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None,
             progress: protocol.CommitProgress | None = None,
             blocking: bool = False) -> SaveResult | None:
        """COLLECTIVE: checkpoint ``state`` at ``step``; see the module docstring.

        ``progress`` (rank 0's) is published with the COMMIT: PROGRESS and the data CURSOR at
        ``step``, whenever the commit lands (at once, or at a later poll, wait or save).

        Returns:
            The result when ``blocking``; else None (results arrive from poll/wait/next save).

        Raises:
            NonFiniteError: finalizing found NaN/Inf (the save was refused, a fault recorded).
            StaleGenerationError: a newer generation fenced this one out.
        """
        self._check_open()
        if self._inflight is not None:
            if self.policy is AsyncPolicy.SKIP and not self._comm.all_true(
                    self._inflight.future.done()):
                self.skipped_steps.append(step)
                _log.info("checkpoint at step %d skipped: previous save still writing", step)
                return None
            self._finalize()
        t0 = self._clock.monotonic()
        info = self._info(step, extra, progress)
        flat = flatten_state(wrap_sharded(state))
        meta = {**flat.meta, RNG_FIELD: capture_rng()}
        pieces = plan_pieces(flat, rank=self.layout.rank, world_size=self.layout.world_size)
        future = self._stage_writing(info, flat, pieces, canonical_json(meta), overlap=blocking)
        pause = self._clock.monotonic() - t0
        self._inflight = _InFlight(info=info, pause_s=pause, future=future,
                                   staging_bytes=self._buffer.capacity)
        return self._finalize() if blocking else None

    def _stage_writing(self, info: protocol.CheckpointInfo, flat: FlatState,
                       pieces: list[Piece], meta_json: bytes, *,
                       overlap: bool) -> Future[protocol.ShardReport]:
        """Stage this rank's share and start its writer; the shard is sealed only once staging
        (and its fault stage) is over.

        ``overlap`` (a blocking save, the whole of which holds the caller, as the final save
        before a requeue does): the writer starts first and writes each piece as it lands, so
        the copy of piece k+1 overlaps the write of piece k and the save ends sooner. Otherwise
        (a periodic save) the writer starts once staging is over: its writes on the bytes just
        copied would stretch the copy, which is the pause training sees.
        """
        staged = prepare(pieces, meta_json, self._buffer, device=has_device(flat, pieces))
        landing = StageProgress([sp.piece.nbytes for sp in staged])
        future = self._pool.submit(self._write, info, staged, landing) if overlap else None
        try:
            copy_staged(flat, staged, meta_json, self._buffer, landing)
            self._fault_hook("staging", info.step)
        except BaseException:
            landing.abandon()  # the writer gives up; its temporary file is debris retention removes
            if future is not None:
                futures_wait([future])
            raise
        landing.seal()
        return future or self._pool.submit(self._write, info, staged, landing)

    def _fault_at(self, step: int) -> Callable[[str], None]:
        """The fault hook for the stages of the save of ``step``."""
        return lambda stage: self._fault_hook(stage, step)

    def _info(self, step: int, extra: Mapping[str, Any] | None,
              progress: protocol.CommitProgress | None = None) -> protocol.CheckpointInfo:
        return protocol.CheckpointInfo(
            ckpt_id=checkpoint_id(generation=self.id.generation, step=step, holder=self.id.holder),
            identity=self.id, step=step, parent=self._parent, nodes=self._comm.nodes(),
            checksum=self.checksum, created=self._clock.now(), extra=dict(extra or {}),
            progress=progress)

    def _write(self, info: protocol.CheckpointInfo, staged: list[Any],
               progress: StageProgress) -> protocol.ShardReport:
        # The NaN/Inf scan runs while the shard is written: the CPU is idle during O_DIRECT
        # writes, so the scan costs no time. A refused shard is never committed; it is debris
        # that retention removes.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcrun-finite") as scan:
            scanning = scan.submit(self._scan_staged, staged, progress)
            report = self._write_shard(info, staged, progress)
            try:
                bad = scanning.result()
            except HpcrunError as exc:
                return replace(report, record=None, error=str(exc))
        if bad:
            return protocol.ShardReport(rank=report.rank, record=None, nonfinite=tuple(bad))
        return report

    def _scan_staged(self, staged: list[Any], progress: StageProgress) -> list[str]:
        # Once staging is over: on a node with few CPUs the scan would compete with the
        # staging copy and lengthen the exposed pause; it overlaps the write backlog instead.
        progress.wait_sealed()
        return nonfinite_keys(self._buffer, staged)

    def _write_shard(self, info: protocol.CheckpointInfo, staged: list[Any],
                     progress: StageProgress) -> protocol.ShardReport:
        t0 = self._clock.monotonic()
        rank = self.layout.rank
        try:
            header = ShardHeader(run_id=info.identity.run_id, ckpt_id=info.ckpt_id,
                                 generation=info.identity.generation, step=info.step, rank=rank,
                                 world_size=self.layout.world_size, node=self.layout.node)
            path = self._ckpt_dir(info.ckpt_id) / shard_relpath(self.layout.node, rank)
            record = write_shard(path, header, self._buffer, staged, algorithm=info.checksum,
                                 fault=self._fault_at(info.step), storage=self._storage,
                                 progress=progress)
            return protocol.ShardReport(rank=rank, record=record,
                                        write_s=self._clock.monotonic() - t0)
        except StorageTimeoutError as exc:  # a hung tier: abandon this checkpoint, go on
            return protocol.ShardReport(rank=rank, record=None, error=str(exc), timed_out=True,
                                        write_s=self._clock.monotonic() - t0)
        except (HpcrunError, OSError) as exc:
            return protocol.ShardReport(rank=rank, record=None, error=str(exc),
                                        write_s=self._clock.monotonic() - t0)

    def poll(self) -> SaveResult | None:
        """COLLECTIVE, cheap: finalize the in-flight save if every rank finished writing."""
        self._check_open()
        if self._inflight is None or not self._comm.all_true(self._inflight.future.done()):
            return None
        return self._finalize()

    def wait(self) -> SaveResult | None:
        """COLLECTIVE: block until the in-flight save is finalized; its result, if any."""
        self._check_open()
        return self._finalize() if self._inflight is not None else None

    def _finalize(self) -> SaveResult:
        flight, self._inflight = self._inflight, None
        assert flight is not None
        mine = flight.future.result()
        node_reports = self._comm.node_gather_object(mine)
        verdict: tuple[protocol.CommitOutcome, float, str] | None = None
        if node_reports is not None:  # this rank leads its node
            summary, write_s = self._summarize(flight.info, node_reports)
            gathered = self._comm.leaders_gather_object((summary, write_s))
            if gathered is not None:  # rank 0: the coordinator
                verdict = self._coordinate(flight.info, gathered)
        outcome, write_s, keys = self._comm.broadcast_object(verdict)
        self._known_keys = keys
        result = SaveResult(ckpt_id=flight.info.ckpt_id, step=flight.info.step,
                            committed=outcome.outcome is protocol.Outcome.COMMITTED,
                            pause_s=flight.pause_s, write_s=write_s, bytes=outcome.bytes,
                            staging_bytes=flight.staging_bytes, error=outcome.message)
        self.results.append(result)
        self._after_verdict(outcome, flight.info.ckpt_id)
        return result

    def _summarize(self, info: protocol.CheckpointInfo, reports: list[protocol.ShardReport],
                   ) -> tuple[hierarchy.NodeSummary, float]:
        """Node leader: check its node's shard reports, write the node's sub-manifest."""
        refused = protocol.refusal(reports, info.step)
        records = [r.record for r in reports if r.record is not None]
        data, summary = hierarchy.summarize_node(
            info.ckpt_id, self.layout.node, records, refused=refused[1] if refused else "",
            nonfinite=refused is not None and refused[0] is protocol.Outcome.NONFINITE,
            timed_out=refused is not None and refused[0] is protocol.Outcome.FAILED
            and all(r.timed_out for r in reports if r.error),
            known_keys="" if self.layout.rank == 0 else self._known_keys)
        if refused is None:
            try:
                hierarchy.write_node_manifest(self.tiers.run_dir, info.ckpt_id, self.layout.node,
                                              data, storage=self._storage)
            except (HpcrunError, OSError) as exc:
                summary = replace(summary, problems=(*summary.problems,
                                                     f"writing its sub-manifest failed: {exc}"),
                                  timed_out=isinstance(exc, StorageTimeoutError))
        return summary, max(r.write_s for r in reports)

    def _coordinate(self, info: protocol.CheckpointInfo,
                    gathered: list[tuple[hierarchy.NodeSummary, float]],
                    ) -> tuple[protocol.CommitOutcome, float, str]:
        """Rank 0: check coverage across nodes, publish the top manifest and the COMMIT."""
        for s, _ in gathered:
            if s.keys:
                self._key_tables[s.keys_digest] = (s.keys, s.totals)
        summaries = [s if s.keys or s.keys_digest not in self._key_tables else
                     replace(s, keys=self._key_tables[s.keys_digest][0],
                             totals=self._key_tables[s.keys_digest][1])
                     for s, _ in gathered]
        outcome = hierarchy.commit_nodes(self.tiers.run_dir, self._log, info, summaries,
                                         tier=self.write_tier, fault=self._fault_at(info.step),
                                         storage=self._storage)
        keys = summaries[0].keys_digest if outcome.outcome is protocol.Outcome.COMMITTED else ""
        return outcome, max(w for _, w in gathered), keys

    def _after_verdict(self, verdict: protocol.CommitOutcome, ckpt_id: str) -> None:
        if verdict.outcome is protocol.Outcome.NONFINITE:
            raise NonFiniteError(verdict.message)
        if verdict.outcome is protocol.Outcome.STALE:
            raise StaleGenerationError(verdict.message)
        if verdict.outcome is protocol.Outcome.COMMITTED:
            self._parent = ckpt_id
            self._gc.submit(self._retain)

    def _retain(self) -> None:
        """Background retention after a commit: rank 0 the shared tier, one rank per node tier 0."""
        in_flight = [self._inflight.info.ckpt_id] if self._inflight else []
        try:
            if self.layout.rank == 0:
                collect_run(self.tiers.run_dir, log=self._log, keep_last=self.keep_last,
                            now=self._clock.now(), in_flight=in_flight, storage=self._storage)
            if self.layout.local_rank == 0 and self.tiers.node_local_root is not None:
                collect_run(self.tiers.run_dir, log=self._log, keep_last=self.keep_last,
                            now=self._clock.now(), in_flight=in_flight, storage=self._storage,
                            local=(self.tiers.node_local_root, self.id.run_id))
        except HpcrunError as exc:  # retention is best effort; the next commit retries
            _log.warning("checkpoint retention failed: %s", exc)

    # -- restore ---------------------------------------------------------------------------

    def restore(self, state: Mapping[str, Any]) -> RestoreResult | None:
        """COLLECTIVE: load the newest committed checkpoint that verifies into ``state``.

        Each rank reads only the bytes its state needs, into its state's tensors in place (see
        :mod:`hpcrun.checkpoint.restorer`).

        Returns:
            What was restored, or None for a fresh start (no committed checkpoint verifies).

        Raises:
            ReshardError: the newest good checkpoint cannot be placed on this layout.
            CorruptCheckpointError: a checkpoint that failed verification had been read
                straight into some state tensor and no older one filled it again.
        """
        self._check_open()
        if self._inflight is not None:
            self._finalize()  # the staging buffer is restore's read buffer
        entries = self._log.read_before(self.fence_slot)  # -1: every entry
        state = wrap_sharded(state)  # FSDP2/TP modules and optimizers: DTensor state dicts
        leaves = flatten_state(state).leaves  # refuses what cannot be saved, before any step
        candidates = restorable(entries)  # after an sdc fault: known-good only
        if not candidates:
            return None
        if prepare_restore(state):
            leaves = flatten_state(state).leaves
        need = need_of(self.layout.rank, leaves)
        skipped: list[str] = []
        self._restorer.overwritten.clear()
        for n, ckpt in enumerate(reversed(candidates)):
            # straight into the tensors while an older checkpoint could refill them; the last
            # candidate reads through the buffer, so a refused one leaves the init for a fresh start
            loaded = self._restorer.load(ckpt, need, leaves, in_place=n < len(candidates) - 1)
            if loaded is None:
                skipped.append(ckpt.ckpt_id)
                continue
            self._check_refilled(skipped, loaded.tensors.keys())
            return self._apply(loaded, state, skipped, leaves)
        self._check_refilled(skipped, ())
        return None

    def _check_refilled(self, skipped: Sequence[str], filled: Iterable[str]) -> None:
        """COLLECTIVE: refuse to go on when a refused checkpoint was read into some state
        tensor (straight into it) and no restored checkpoint filled that tensor again."""
        left = sorted(self._restorer.overwritten.difference(filled))
        if self._comm.any_true(bool(left)):
            where = ", ".join(left[:3]) or "on another rank"
            raise CorruptCheckpointError(
                f"checkpoints {', '.join(skipped)} failed verification after some of their "
                f"bytes were read into the state's tensors ({where}), and no older checkpoint "
                "restores those tensors; rebuild the state (restart the run) or remove the "
                "damaged checkpoints so that it starts fresh")

    def _apply(self, loaded: Loaded, state: Mapping[str, Any], skipped: list[str],
               leaves: Mapping[str, TensorLeaf]) -> RestoreResult:
        load_into(state, decode_tree(loaded.meta, as_state_values(loaded.tensors, leaves)))
        if isinstance(loaded.meta.get(RNG_FIELD), dict):
            restore_rng(loaded.meta[RNG_FIELD])
        self._parent = loaded.ckpt_id
        if skipped and self.layout.rank == 0:
            self._log.append_entry(RestoreFellBackNote(restored=loaded.ckpt_id,
                                                       skipped=tuple(skipped)),
                                   generation=self.id.generation, holder=self.id.holder)
        return RestoreResult(ckpt_id=loaded.ckpt_id, step=loaded.step,
                             tier=_slowest_tier(loaded),
                             extra=dict(loaded.extra), skipped=tuple(skipped),
                             bytes_read=loaded.bytes_read, files_read=loaded.files_read,
                             peer_bytes=loaded.by_tier.get(Tier.PEER, 0),
                             phases=loaded.phases.fields())

    # -- lifecycle -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed; create a new one")

    def close(self) -> None:
        """Stop the background writer (an unfinalized save is abandoned as debris)."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
            self._gc.shutdown(wait=True)


def _slowest_tier(loaded: Loaded) -> Tier:
    """The slowest tier a restore touched: tier 1 (on any rank), else a peer (on this rank),
    else this node's tier 0."""
    if loaded.shared:
        return Tier.SHARED
    return Tier.PEER if loaded.by_tier.get(Tier.PEER) else Tier.NODE_LOCAL
