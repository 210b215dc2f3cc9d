"""The run spec: an immutable description of a run, identified by the digest of its canonical JSON.

A :class:`RunSpec` binds everything that decides what a run computes and how it is operated:
entrypoint, code version, versions, resources, membership, checkpoint policy, data and resume
contract, retry policy, budgets and cancellation authority. ``spec_id`` is the SHA-256 of the
canonical JSON (defaults filled, keys sorted, integral floats written as integers), so two specs
that mean the same thing have the same id however their YAML was written.

:func:`load_spec` reads ``run.yaml``; a bad spec raises one :class:`InvalidSpecError` (a
:class:`SpecError`) listing every problem in the file, one line each, naming the key path, the
expected and the found value, and the fix. The generic loader is :mod:`hpcrun.control.specload`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from hpcrun.control.elastic import check_elastic_batch, check_fixed_batch, gang_node_counts
from hpcrun.control.payload import canonical_json
from hpcrun.control.specload import (
    ADDITIVE,
    Checks,
    FieldProblem,
    InvalidSpecError,
    above,
    at_least,
    build,
    canonical,
    check_bounds,
    check_json_value,
    one_of,
    to_plain,
)
from hpcrun.errors import SpecError
from hpcrun.vocab import (
    WRITTEN_TIERS,
    AsyncPolicy,
    CadenceKind,
    ChecksumAlgorithm,
    DistBackend,
    FaultClass,
    RankLauncher,
    ResumeContract,
    SdcAction,
    Tracker,
)

SPEC_SCHEMA_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_ENTRYPOINT_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")
_CONTENT_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TIERS: tuple[str, ...] = tuple(t.value for t in WRITTEN_TIERS)
"""Tier names a spec may list (the tiers a save writes), fastest first."""
SCRIPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")
"""Signals a script-mode rank may be sent on a preemption (``preempt_signal``)."""


class MembershipMode(StrEnum):
    """Whether the gang size is fixed or may shrink and grow between bounds."""

    FIXED = "fixed"
    ELASTIC = "elastic"


@dataclass(frozen=True, kw_only=True, slots=True)
class Resources:
    """What to ask the scheduler for."""

    nodes: int = field(default=1, metadata=at_least(1))
    """Nodes the gang runs on."""
    spare_nodes: int = field(default=0, metadata=at_least(0))
    """Extra nodes allocated to replace a failed node without requeueing."""
    tasks_per_node: int = field(default=1, metadata=at_least(1))
    """Ranks per node."""
    gpus_per_node: int = field(default=0, metadata=at_least(0))
    """GPUs per node (0 on CPU-only runs)."""
    cpus_per_task: int = field(default=1, metadata=at_least(1))
    """CPUs per rank."""
    time_limit_min: int = field(default=60, metadata=at_least(1))
    """Wall-clock limit of one allocation, minutes."""
    partition: str | None = None
    """Slurm partition; the site default when None."""
    account: str | None = None
    """Slurm account to charge."""
    qos: str | None = None
    """Slurm QOS."""
    constraint: str | None = None
    """Slurm feature constraint (``--constraint``)."""
    exclude: tuple[str, ...] = ()
    """Nodes never to run on (quarantined nodes are added per allocation)."""
    sbatch_extra: Mapping[str, str] = field(default_factory=dict, metadata=ADDITIVE)
    """sbatch options hpcrun does not model (``mem: 64G``, ``exclusive: ""`` for a bare flag),
    overriding the site's ``sbatch_extra`` option by option; checked at submit."""

    def __post_init__(self) -> None:
        checks = Checks()
        check_bounds(self, checks)
        checks.done()
        object.__setattr__(self, "sbatch_extra", types.MappingProxyType(dict(self.sbatch_extra)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Membership:
    """The membership contract: a fixed gang or an elastic one between bounds."""

    mode: MembershipMode = MembershipMode.FIXED
    """fixed: exactly ``resources.nodes``; elastic: anywhere in ``min_nodes..max_nodes``."""
    min_nodes: int | None = None
    """Fewest nodes an elastic run continues on."""
    max_nodes: int | None = None
    """Most nodes an elastic run grows to."""

    def __post_init__(self) -> None:
        checks = Checks()
        if self.mode == MembershipMode.FIXED:
            for key in ("min_nodes", "max_nodes"):
                checks(getattr(self, key) is None, key, "null for mode fixed",
                       getattr(self, key), "remove it or set membership.mode: elastic",
                       reads=("mode",))
        else:
            checks(self.min_nodes is not None and self.min_nodes >= 1, "min_nodes",
                   "an integer >= 1 for mode elastic", self.min_nodes,
                   "set membership.min_nodes", reads=("mode",))
        if self.max_nodes is not None and self.min_nodes is not None:
            checks(self.min_nodes <= self.max_nodes, "min_nodes",
                   f"<= max_nodes ({self.max_nodes})", self.min_nodes,
                   "lower min_nodes or raise max_nodes", reads=("max_nodes",))
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPolicy:
    """When and where checkpoints are written and how many are kept."""

    cadence: CadenceKind = CadenceKind.EVERY_STEPS
    """How the interval is chosen."""
    every_steps: int | None = 100
    """Interval in optimizer steps (cadence every_steps)."""
    every_seconds: float | None = None
    """Interval in seconds (cadence every_seconds)."""
    tiers: tuple[str, ...] = field(default=TIERS, metadata=one_of(TIERS))
    """Tiers a checkpoint is committed on, fastest first."""
    keep_last: int = field(default=2, metadata=at_least(
        2, fix="keep at least 2 so the newest good checkpoint survives an async save"))
    """Committed checkpoints kept per tier (>= 2, so a good one survives an async save)."""
    async_policy: AsyncPolicy = AsyncPolicy.BLOCK
    """What a snapshot does while the previous one is still in flight."""
    rpo_s: float | None = field(default=None, metadata=above(0))
    """Recovery point objective: most seconds of work a failure may lose."""
    rto_s: float | None = field(default=None, metadata=above(0))
    """Recovery time objective: most seconds from failure to training again."""
    checksum: ChecksumAlgorithm = field(default=ChecksumAlgorithm.XXH3, metadata=ADDITIVE)
    """Shard checksum: ``xxh3`` (fast) or ``sha256`` (cryptographic, for audits)."""
    init_from: str | None = field(default=None, metadata=ADDITIVE)
    """A checkpoint made elsewhere the run starts from while it has none of its own: a DCP
    directory, or Hugging Face safetensors (a ``.safetensors`` file, its ``.index.json``, or a
    directory holding one); an absolute path, checked at submit. Once the run commits, every
    restore uses its own checkpoints (docs/interop.md)."""

    def __post_init__(self) -> None:
        checks = Checks()
        checks(self.init_from is None or os.path.isabs(os.path.expanduser(self.init_from)),
               "init_from", "an absolute path", self.init_from,
               "write the full path of the DCP directory or safetensors file")
        if self.cadence == CadenceKind.EVERY_STEPS:
            checks(self.every_steps is not None and self.every_steps >= 1, "every_steps",
                   "an integer >= 1 for cadence every_steps", self.every_steps,
                   "set checkpoint.every_steps", reads=("cadence",))
        if self.cadence == CadenceKind.EVERY_SECONDS:
            checks(self.every_seconds is not None and self.every_seconds > 0, "every_seconds",
                   "a number > 0", self.every_seconds, "set every_seconds to a positive value",
                   reads=("cadence",))
        checks(bool(self.tiers) and set(self.tiers) <= set(TIERS)
               and len(set(self.tiers)) == len(self.tiers), "tiers",
               f"distinct names among {list(TIERS)}", list(self.tiers),
               "list node_local and/or shared once each")
        check_bounds(self, checks)
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSpec:
    """Which data the run consumes, in which order, under which resume contract."""

    manifest: str | None = None
    """Path of the dataset manifest (aliases are resolved at load)."""
    dataset_id: str | None = None
    """Digest of the canonical dataset manifest, when known."""
    seed: int = field(default=0, metadata=at_least(0, fix="use a non-negative seed"))
    """Seed of the sample order."""
    global_batch: int | None = field(default=None,
                                     metadata=at_least(1, fix="set data.global_batch"))
    """Samples (or packed sequences) per optimizer step; a multiple of the world size
    (``nodes x tasks_per_node``; elastic: of every size the gang may take), so each rank takes
    an equal share."""
    contract: ResumeContract = ResumeContract.EXACT_ORDER
    """What a resume promises about the data sequence. ``bitwise`` also promises the
    uninterrupted run's bits (model, optimizer, RNG streams, cursor) on the same layout (world
    size, ranks per node, device kind), when every RNG stream is seeded at a fresh start,
    kernels are deterministic, DDP comes from ``hpcrun.integrations.ddp`` (one gradient-bucket
    layout for the whole run) and each reduction runs the same collective algorithm (gloo:
    always; NCCL: the same node topology, or ``NCCL_ALGO``/``NCCL_PROTO`` pinned); see
    docs/recovery.md."""

    def __post_init__(self) -> None:
        checks = Checks()
        check_bounds(self, checks)
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class DistSpec:
    """The process group: backend and collective timeouts (None: the site config's value)."""

    backend: DistBackend | None = None
    """``auto`` (NCCL when the run has GPUs), ``nccl`` or ``gloo``; None: the site default."""
    init_timeout_s: float | None = field(default=None, metadata=above(0))
    """Seconds the rendezvous and process-group init may wait for every rank."""
    step_timeout_s: float | None = field(default=None, metadata=above(0))
    """Seconds one training or step-agreement collective may wait before it is a hang."""
    checkpoint_timeout_s: float | None = field(default=None, metadata=above(0))
    """Seconds one checkpoint collective (save agreement, restore exchange) may wait."""
    rank_launcher: RankLauncher | None = field(default=None, metadata=ADDITIVE)
    """``agent`` (each node's agent forks its ranks) or ``pmix`` (one ``srun --mpi=pmix`` step
    per incarnation; ranks take rank, world size and the rendezvous from ``MPI.COMM_WORLD``;
    Slurm only, not with a site container or ``script:``/``command:``); None: the site default."""

    def __post_init__(self) -> None:
        checks = Checks()
        check_bounds(self, checks)
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class ObserveSpec:
    """Where the run's step metrics go besides hpcrun's own status, report and export."""

    tracker: Tracker | None = None
    """``tensorboard``, ``wandb`` or ``mlflow``: rank 0 logs each step's metrics to one tracker
    run per hpcrun run, across requeues, restarts and spare swaps (``hpcrun.observe.tracker``);
    None: no tracker. The tracker's package must be installed where the run is submitted."""
    project: str = "hpcrun"
    """The wandb project or MLflow experiment the tracker run belongs to."""

    def __post_init__(self) -> None:
        checks = Checks()
        checks(bool(self.project.strip()), "project", "a non-empty name", self.project,
               "set observe.project to the wandb project or MLflow experiment")
        checks.done()


SDC_EVERY_STEPS = 100
"""Default replica-check interval. On the tiny example (CPU, 2 gloo ranks) a check costs about
1 ms (fingerprint ~0.5 ms, the 16-byte exchange the rest) plus ~1-2 ms for the replay snapshot,
against 3-5 ms per step at best: one check per 100 steps stays under 1 % of step time
(``benchmarks/sdc_bench.py`` measures it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SdcPolicy:
    """Silent data corruption checks: replica agreement, loss spikes, device canaries."""

    enabled: bool = True
    """Run the checks at all."""
    every_steps: int = field(default=SDC_EVERY_STEPS, metadata=at_least(
        1, fix="set sdc.every_steps to the steps between replica checks"))
    """Steps between replica agreement checks (detection latency, in steps)."""
    loss_spike: float | None = None
    """A loss above this factor times the mean of the recent losses is suspect (None: off)."""
    policy: SdcAction = SdcAction.FAIL
    """What a suspect step that replays to the same result does: ``fail`` or ``skip_batch``."""
    canary_every_min: float | None = field(default=30.0, metadata=above(0))
    """Minutes between per-device known-answer canaries (None: only at start)."""

    def __post_init__(self) -> None:
        checks = Checks()
        check_bounds(self, checks)
        checks(self.loss_spike is None or (math.isfinite(self.loss_spike)
                                           and self.loss_spike > 1.0),
               "loss_spike", "a factor > 1 (e.g. 4.0) or null", self.loss_spike,
               "set sdc.loss_spike above 1, or leave it out to turn the spike check off")
        checks.done()


def default_max_attempts() -> dict[str, int]:
    """Retries allowed per fault class before the run fails."""
    return {
        FaultClass.PREEMPTION: 100, FaultClass.TIMEOUT: 50, FaultClass.NODE_FAILURE: 5,
        FaultClass.PROCESS_CRASH: 3, FaultClass.HANG: 3, FaultClass.NONFINITE: 2,
        FaultClass.DATA_ERROR: 1, FaultClass.STORAGE_ERROR: 3, FaultClass.USER_ERROR: 0,
        FaultClass.UNKNOWN: 2,
    }


ADDED_BUDGETS: dict[str, int] = {FaultClass.SDC: 3}
"""Budgets of fault classes added within schema 1, used when ``max_attempts`` leaves them out
(kept out of the defaults, so an existing spec keeps its ``spec_id``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Per-class retry budgets, bounded exponential backoff, deterministic-repeat and quarantine."""

    max_attempts: Mapping[str, int] = field(default_factory=default_max_attempts,
                                            metadata=one_of(FaultClass, keys=True))
    """Retries allowed per :class:`FaultClass` value; classes left out get the default."""
    backoff_base_s: float = field(default=10.0, metadata=at_least(0, fix="use 0 for no delay"))
    """Delay bound of the first retry, seconds."""
    backoff_factor: float = field(default=2.0,
                                  metadata=at_least(1, fix="use 1 for a constant delay"))
    """Growth of the delay bound per attempt."""
    backoff_cap_s: float = 600.0
    """Largest delay, seconds."""
    jitter: bool = True
    """Full jitter: the delay is uniform in [0, bound], so retries of many runs spread out."""
    in_allocation_restarts: int = field(
        default=2, metadata=at_least(0, fix="set in_allocation_restarts"))
    """Gang restarts inside one allocation before requeueing."""
    deterministic_repeat_limit: int = field(
        default=3, metadata=at_least(1, fix="set deterministic_repeat_limit"))
    """The same fault signature at the same step this many times fails the run."""
    quarantine_after: int = field(default=2, metadata=at_least(1, fix="set quarantine_after"))
    """Failures of one node within the window that quarantine it."""
    quarantine_window_s: float = field(default=3600.0, metadata=above(0))
    """Window for counting a node's failures, seconds."""

    def __post_init__(self) -> None:
        checks = Checks()
        known = {c.value for c in FaultClass}
        for key, value in self.max_attempts.items():
            checks(key in known, f"max_attempts.{key}", f"a fault class among {sorted(known)}",
                   key, "fix the fault class name")
            checks(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                   f"max_attempts.{key}", "an integer >= 0", value, "set a retry count")
        filled = {**default_max_attempts(), **self.max_attempts}
        object.__setattr__(self, "max_attempts",
                           types.MappingProxyType({str(k): v for k, v in sorted(filled.items())}))
        check_bounds(self, checks)
        checks(self.backoff_cap_s >= self.backoff_base_s, "backoff_cap_s",
               f">= backoff_base_s ({self.backoff_base_s})", self.backoff_cap_s, "raise the cap",
               reads=("backoff_base_s",))
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class Budgets:
    """Limits on the whole run."""

    max_wall_hours: float | None = field(default=None, metadata=above(0))
    """Total allocated wall time across allocations; None for no limit."""
    max_requeues: int = field(default=10, metadata=at_least(0, fix="use 0 to never requeue"))
    """Requeues after faults (new or requeued allocations) before the run fails; a segment (a
    preemption or time-limit stop that committed progress) is not counted here."""
    max_segments: int | None = field(default=None, metadata={
        **ADDITIVE, **at_least(1, fix="use null for no limit")})
    """Segments (allocations that ended in a stop with committed progress) before the run
    fails; None for no limit."""
    max_node_hours: float | None = field(default=None, metadata={**ADDITIVE, **above(0)})
    """Total allocated node-hours (allocated nodes x wall hours) across allocations; None for
    no limit."""

    def __post_init__(self) -> None:
        checks = Checks()
        check_bounds(self, checks)
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class CodeVersion:
    """The code a run executes."""

    commit: str | None = None
    """Git commit (hex), None outside a repository."""
    dirty: bool = False
    """Whether the work tree differed from the commit (then ``snapshot`` holds the code)."""
    snapshot: str | None = None
    """Path of the code snapshot, relative to the run directory."""
    content: str | None = field(default=None, metadata=ADDITIVE)
    """``sha256:`` digest of the snapshot's files, for a project outside git (no commit)."""

    def __post_init__(self) -> None:
        checks = Checks()
        checks(self.commit is None or bool(_COMMIT_RE.match(self.commit)), "commit",
               "a lowercase hex git commit", self.commit, "pass `git rev-parse HEAD`")
        checks(self.content is None or (bool(_CONTENT_RE.match(self.content))
                                        and self.snapshot is not None), "content",
               "sha256:<64 hex digits> of a snapshot", self.content,
               "let submit snapshot the project (hpcrun.launch.codever)")
        if self.snapshot is not None:
            parts = Path(self.snapshot).parts
            checks(not os.path.isabs(self.snapshot) and ".." not in parts and bool(parts),
                   "snapshot", "a path relative to the run directory", self.snapshot,
                   "store the snapshot inside the run directory, e.g. code/")
        checks(not self.dirty or self.snapshot is not None, "snapshot",
               "a snapshot path when dirty is true", self.snapshot,
               "snapshot the dirty tree into the run directory", reads=("dirty",))
        checks.done()


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """An immutable run description; ``spec_id`` is the digest of its canonical JSON."""

    name: str
    """Short name (letters, digits, ``.``, ``_``, ``-``); prefix of run ids."""
    entrypoint: str = ""
    """Training main as ``package.module:function`` (exactly one of ``entrypoint``, ``script``
    and ``command``)."""
    script: str | None = field(default=None, metadata=ADDITIVE)
    """Script mode: a plain training script, its path relative to the code directory, run on
    every rank as ``python <script> <args>`` with the torchrun environment (docs/scripts.md)."""
    args: tuple[str, ...] = field(default=(), metadata=ADDITIVE)
    """Arguments after ``script`` on every rank's command line."""
    command: tuple[str, ...] = field(default=(), metadata=ADDITIVE)
    """Script mode with a whole command line per rank (``[python, -m, pkg.train, --lr, 3e-4]``),
    run in the code directory with the torchrun environment."""
    preempt_signal: str = field(default="SIGTERM",
                                metadata={**ADDITIVE, **one_of(SCRIPT_SIGNALS)})
    """Signal a script-mode rank receives on a preemption (``SIGTERM``: what torchrun forwards
    and what scripts handle; or ``SIGUSR1``, ``SIGUSR2``, ``SIGINT``)."""
    resources: Resources = field(default_factory=Resources)
    """What to ask the scheduler for."""
    site: str = "local"
    """Site config name (``site_configs/<site>.yaml``) or ``local``."""
    membership: Membership = field(default_factory=Membership)
    """Fixed or elastic gang."""
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """Checkpoint cadence, tiers, retention, objectives."""
    data: DataSpec = field(default_factory=DataSpec)
    """Data manifest, order seed and resume contract."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Fault budgets, backoff, quarantine."""
    budgets: Budgets = field(default_factory=Budgets)
    """Limits on the whole run."""
    sdc: SdcPolicy = field(default_factory=SdcPolicy, metadata=ADDITIVE)
    """Silent data corruption checks (replica agreement, loss spikes, canaries)."""
    cancel_authority: tuple[str, ...] = ()
    """User names allowed to cancel besides the owner."""
    dist: DistSpec = field(default_factory=DistSpec, metadata=ADDITIVE)
    """Process group backend and collective timeouts (omitted from the digest when default)."""
    observe: ObserveSpec = field(default_factory=ObserveSpec, metadata=ADDITIVE)
    """The experiment tracker step metrics go to (omitted from the digest when default)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """Free-form user config handed to ``main(ctx)`` (JSON values only)."""
    code: CodeVersion | None = None
    """Code version, filled at submit."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """python / torch / hpcrun versions, filled at submit."""

    def __post_init__(self) -> None:
        checks = Checks()
        checks(bool(_NAME_RE.match(self.name)), "name",
               "1-64 letters, digits, '.', '_' or '-' starting with a letter or digit",
               self.name, "rename the run")
        _check_launch(self, checks)
        check_json_value(self.config, "config", checks)
        object.__setattr__(self, "config", types.MappingProxyType(dict(self.config)))
        object.__setattr__(self, "versions", types.MappingProxyType(dict(self.versions)))
        m, nodes = self.membership, self.resources.nodes
        if m.mode == MembershipMode.ELASTIC and m.min_nodes is not None:
            checks(m.min_nodes <= nodes, "membership.min_nodes",
                   f"<= resources.nodes ({nodes})", m.min_nodes, "lower min_nodes",
                   reads=("resources",))
            check_elastic_batch(self.data.global_batch, self.resources.tasks_per_node,
                                gang_node_counts(m.min_nodes, nodes), checks)
        elif m.mode == MembershipMode.FIXED:
            check_fixed_batch(self.data.global_batch, self.resources.tasks_per_node,
                              self.resources.nodes, checks)
        checks.done()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with every default filled and a ``schema_version``.

        Fields and sections added within the schema version (``ADDITIVE``: ``dist``, ``sdc``,
        ``checkpoint.checksum``, ``resources.sbatch_extra``, ``budgets.max_segments``, ...) are
        written only when they differ from their defaults, so the ``spec_id`` of a spec that
        does not use them stays what it was.
        """
        plain = to_plain(self)
        return {"schema_version": SPEC_SCHEMA_VERSION, **plain}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "run.yaml") -> RunSpec:
        """Build and validate a spec.

        Raises:
            InvalidSpecError: every problem of ``raw`` (unknown keys, wrong types, bad values,
                cross-field rules), one line each, naming ``source`` and the key path.
        """
        if not isinstance(raw, Mapping):
            raise SpecError(f"{source}: expected a mapping at the top level, found "
                            f"{type(raw).__name__}; write the spec as `key: value` lines")
        body = dict(raw)
        version = body.pop("schema_version", SPEC_SCHEMA_VERSION)
        problems = [] if version == SPEC_SCHEMA_VERSION else [FieldProblem(
            "schema_version", str(SPEC_SCHEMA_VERSION), version,
            "write the spec for this hpcrun version")]
        spec, found = build(cls, body)
        if problems or found:
            raise InvalidSpecError([*problems, *found], source=source)
        return spec  # type: ignore[no-any-return]

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, integral floats as integers, ASCII only."""
        return canonical_json(canonical(self.to_dict())).decode()

    @property
    def spec_id(self) -> str:
        """``sha256:<hex>`` of :meth:`canonical_json`."""
        return "sha256:" + hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def script_mode(self) -> bool:
        """Whether the ranks run a plain script or command (``script``/``command``) instead of
        an ``entrypoint`` taking ``ctx``."""
        return not self.entrypoint


def _check_launch(spec: RunSpec, checks: Checks) -> None:
    """Exactly one of entrypoint, script and command; each well formed (script mode: the
    script's path stays inside the code directory)."""
    given = [k for k in ("entrypoint", "script", "command") if getattr(spec, k)]
    checks(len(given) == 1, "entrypoint", "exactly one of entrypoint, script, command",
           ", ".join(given) or None, "keep one way to start the ranks",
           reads=("script", "command"))
    if spec.entrypoint:
        checks(bool(_ENTRYPOINT_RE.match(spec.entrypoint)), "entrypoint",
               "'package.module:function'", spec.entrypoint,
               "name the module and the function, e.g. examples.tiny_lm.train:main")
    if spec.script is not None:
        parts = Path(spec.script).parts
        checks(bool(parts) and not Path(spec.script).is_absolute() and ".." not in parts,
               "script", "a path relative to the code directory, without '..'", spec.script,
               "name the script from the project root, e.g. examples/torchrun_ddp/train.py")
    checks(not spec.args or spec.script is not None, "args", "arguments of a script",
           list(spec.args), "set script, or put the arguments in command", reads=("script",))
    checks(all(isinstance(a, str) and a for a in spec.command), "command",
           "non-empty strings", list(spec.command), "write each argument as a string")
    name = spec.preempt_signal.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    checks(name in SCRIPT_SIGNALS, "preempt_signal", f"one of {', '.join(SCRIPT_SIGNALS)}",
           spec.preempt_signal, "use SIGTERM (torchrun's) or SIGUSR1 (Slurm's)")
    object.__setattr__(spec, "preempt_signal", name)


def resolve_aliases(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Replace mutable aliases (``data/latest`` symlinks) with the immutable paths they name now."""
    data = raw.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("manifest"), str):
        return raw
    manifest = data["manifest"]
    if "://" in manifest:
        return raw
    target = Path(os.path.expanduser(manifest))
    target = target if target.is_absolute() else base_dir / target
    if not target.exists():
        raise SpecError(f"data.manifest: expected an existing file, found {manifest!r} "
                        f"(looked at {target}); fix the path or build the manifest first")
    return {**raw, "data": {**data, "manifest": str(target.resolve())}}


def load_spec(path: str | os.PathLike[str]) -> RunSpec:
    """Read ``run.yaml``, resolve mutable aliases, validate, return the spec.

    Raises:
        SpecError: the file is missing, not YAML, or invalid; the message names the key path.
    """
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read spec {p}: {exc.strerror}; check the path") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{p} is not valid YAML ({str(exc).splitlines()[0]}); "
                        "fix the syntax") from exc
    if not isinstance(raw, dict):
        return RunSpec.from_dict(raw, source=str(p))  # raises with a clear message
    return RunSpec.from_dict(resolve_aliases(raw, p.parent.resolve()), source=str(p))


def freeze_spec(spec: RunSpec, *, code: CodeVersion, versions: Mapping[str, str]) -> RunSpec:
    """The spec as submitted: code version and python/torch/hpcrun versions filled in."""
    return dataclasses.replace(spec, code=code, versions=dict(versions))
