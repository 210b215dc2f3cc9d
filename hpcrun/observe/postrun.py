"""The post-run manifest: what a finished run was, consumed, produced and cost.

On a terminal state the supervisor builds the manifest (pure, :func:`build_manifest`), writes it
into the run directory and publishes it with a fenced ``result`` entry (:func:`publish_manifest`):
a stale incarnation can write the file but its entry is void, so only the owner's manifest counts.
``hpcrun show RUN --manifest`` reads it back (:func:`read_manifest`), verifying its digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpcrun.errors import RecordError
from hpcrun.observe.ettr import EttrReport
from hpcrun.observe.status import RecordFacts
from hpcrun.storage import LOCAL_STORAGE, Storage
from hpcrun.vocab import TERMINAL, RunState

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_DIR = "post_run"
ARTIFACTS_DIR = "artifacts"


@dataclass(frozen=True, kw_only=True, slots=True)
class Artifact:
    """A final artifact and its digest."""

    path: str
    """Path relative to the run directory."""
    bytes: int
    """Size."""
    sha256: str
    """Hex SHA-256 of its content."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """What the run was: spec, code and data identity."""

    spec_id: str
    """Digest of the frozen spec."""
    code_commit: str | None
    """Git commit of the code (None outside a repository)."""
    code_dirty: bool
    """Whether the tree was dirty (then a snapshot is in the run directory)."""
    dataset_id: str
    """Dataset ID consumed."""
    versions: Mapping[str, str]
    """python / torch / hpcrun versions."""


def sha256_file(path: Path, *, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def digest_artifacts(run_dir: Path, paths: Iterable[Path]) -> list[Artifact]:
    """Digest each existing file; paths are reported relative to ``run_dir``."""
    out = []
    for p in sorted({Path(p) for p in paths}):
        full = p if p.is_absolute() else Path(run_dir) / p
        if full.is_file():
            out.append(Artifact(path=str(full.relative_to(run_dir)) if full.is_relative_to(
                run_dir) else str(full), bytes=full.stat().st_size, sha256=sha256_file(full)))
    return out


def find_artifacts(run_dir: Path, checkpoint_manifests: Iterable[str]) -> list[Path]:
    """Files under ``artifacts/`` plus the manifests of retained checkpoints."""
    root = Path(run_dir) / ARTIFACTS_DIR
    files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    return files + [Path(run_dir) / m for m in checkpoint_manifests if m]


def realized_counts(cursor: Mapping[str, Any], depth: int = 3) -> dict[str, Any]:
    """Per-source realized counts found in a cursor (keys named ``realized*``), else {}."""
    if depth < 0:
        return {}
    for key, value in cursor.items():
        if str(key).startswith("realized") and isinstance(value, Mapping):
            return dict(value)
    for value in cursor.values():
        if isinstance(value, Mapping):
            found = realized_counts(value, depth - 1)
            if found:
                return found
    return {}


def build_manifest(facts: RecordFacts, *, provenance: Provenance, artifacts: Iterable[Artifact],
                   ettr: EttrReport, created_ts: float) -> dict[str, Any]:
    """The post-run manifest of a terminal run (pure)."""
    if facts.state not in TERMINAL:
        raise RecordError(f"run {facts.run_id} is {facts.state}, expected a terminal state "
                          f"({', '.join(sorted(TERMINAL))}); the manifest is written at "
                          "the end")
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION, "run_id": facts.run_id,
        "terminal_state": facts.state, "created_ts": created_ts, "generation": facts.generation,
        "provenance": {**asdict(provenance), "versions": dict(provenance.versions)},
        "data": {"dataset_id": provenance.dataset_id, "cursor": dict(facts.cursor),
                 "realized_counts": realized_counts(facts.cursor)},
        "tokens": facts.tokens, "steps": facts.step,
        "checkpoints_retained": [asdict(c) for c in facts.checkpoints],
        "artifacts": [asdict(a) for a in artifacts],
        "incidents": [asdict(f) for f in facts.faults],
        "quarantined": list(facts.quarantined),
        "restarts": facts.restarts, "requeues": facts.requeues, "job_ids": list(facts.job_ids),
        "ettr": ettr.to_dict(),
        "cost": {"node_hours": ettr.node_hours, "cost_per_token": ettr.cost_per_token},
    }


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """Canonical JSON bytes of a manifest (sorted keys)."""
    return json.dumps(manifest, sort_keys=True, indent=1, default=str).encode()


def publish_manifest(run_dir: Path, manifest: Mapping[str, Any], *, log: Any, generation: int,
                     holder: str, previous_result: Mapping[str, Any] | None = None,
                     storage: Storage = LOCAL_STORAGE) -> Path:
    """Write the manifest file, then publish it with a fenced ``result`` entry.

    ``log`` is the run's :class:`hpcrun.control.log.RunLog`. Raises
    :class:`hpcrun.errors.StaleGenerationError` when this generation was fenced out.
    """
    from hpcrun.control.entries import ResultPayload

    data = manifest_bytes(manifest)
    rel = Path(MANIFEST_DIR) / f"manifest-g{generation:04d}.json"
    storage.makedirs(Path(run_dir) / MANIFEST_DIR)
    storage.write_atomic(Path(run_dir) / rel, data)
    result = replace(ResultPayload.from_payload(previous_result or {}), manifest=str(rel),
                     manifest_sha256=hashlib.sha256(data).hexdigest(),
                     state=RunState(manifest["terminal_state"]))
    log.publish_entry(result, generation=generation, holder=holder)
    return Path(run_dir) / rel


def read_manifest(run_dir: Path, result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The published manifest named by the record's ``result``, digest-verified."""
    from hpcrun.control.entries import ResultPayload

    published = ResultPayload.from_payload(result) if result else None
    if published is None or published.manifest is None:
        raise RecordError(f"run {Path(run_dir).name} has no published post-run manifest yet; it "
                          "is written when the run reaches SUCCEEDED, FAILED or CANCELLED")
    rel = Path(published.manifest)
    if rel.is_absolute() or ".." in rel.parts:
        raise RecordError(f"manifest path {rel} in the record is not inside the run directory; "
                          "the log is damaged")
    try:
        data = (Path(run_dir) / rel).read_bytes()
    except OSError as exc:
        raise RecordError(f"cannot read manifest {rel}: {exc.strerror}; was it deleted?") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != published.manifest_sha256:
        raise RecordError(f"manifest {rel} has sha256 {digest[:12]}…, the log recorded "
                          f"{str(published.manifest_sha256)[:12]}…; it was modified after "
                          "publication")
    body = json.loads(data)
    if not isinstance(body, dict) or body.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise RecordError(f"manifest {rel} is not a post-run manifest of schema "
                          f"{MANIFEST_SCHEMA_VERSION}")
    return body


def provenance_from_spec(spec: Any) -> Provenance:
    """Provenance from a :class:`hpcrun.control.spec.RunSpec`."""
    code = getattr(spec, "code", None)
    return Provenance(spec_id=str(spec.spec_id), code_commit=getattr(code, "commit", None),
                      code_dirty=bool(getattr(code, "dirty", False)),
                      dataset_id=str(getattr(spec.data, "dataset_id", "") or ""),
                      versions=dict(getattr(spec, "versions", {}) or {}))


def publish_post_run(run_dir: Path, *, record: Any, spec: Any, log: Any, generation: int,
                     holder: str, now: float, node_hour_price: float | None = None) -> Path:
    """The supervisor's one call at a terminal state: build, write and publish the manifest."""
    from hpcrun.observe.collect import facts_from_record
    from hpcrun.observe.ettr import compute_ettr
    from hpcrun.observe.events import read_events
    from hpcrun.observe.figures import allocations_at

    facts = facts_from_record(record, rpo_s=getattr(spec.checkpoint, "rpo_s", None))
    manifests = [str(getattr(c, "manifest", "")) for c in getattr(record, "checkpoints", ())]
    artifacts = digest_artifacts(run_dir, find_artifacts(run_dir, manifests))
    ettr = compute_ettr(read_events(run_dir), node_hour_price=node_hour_price,
                        allocations=allocations_at(facts.allocations, now) or None)
    manifest = build_manifest(facts, provenance=provenance_from_spec(spec), artifacts=artifacts,
                              ettr=ettr, created_ts=now)
    return publish_manifest(run_dir, manifest, log=log, generation=generation, holder=holder,
                            previous_result=getattr(record, "result", None))


def post_run_publisher(*, clock: Any, storage: Storage = LOCAL_STORAGE,
                       node_hour_price: float | None = None) -> Any:
    """An :data:`hpcrun.control.ending.EndPublisher` that reads the run's record and spec at
    the moment a terminal state was published, then builds, writes and publishes its manifest.

    Cancel, the reconcile pass and the in-job supervisor call it under their own fence.
    """
    from hpcrun.control.record import load_run_spec, read_record

    def publish(log: Any, generation: int, holder: str) -> None:
        run_dir = Path(log.run_dir)
        spec = load_run_spec(run_dir, storage=storage)
        record = read_record(run_dir, storage=storage, spec_id=spec.spec_id)
        publish_post_run(run_dir, record=record, spec=spec, log=log, generation=generation,
                         holder=holder, now=clock.now(), node_hour_price=node_hour_price)

    return publish
