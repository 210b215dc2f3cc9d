"""The dataset manifest: immutable objects, their digests and ranges, and the dataset ID.

A manifest lists *sources* (one per path or alias given to ``hpcrun data build``); a source is a
sequence of *objects* (files) pinned by content digest. Every object's kept records form a
contiguous *logical range* of the source, and every source a contiguous range of global sample
IDs (:data:`SAMPLE_ID_RULE`). Per-record token lengths, the kept physical record numbers (after
filtering and deduplication) and JSONL byte offsets live in a sidecar *index* per object, pinned
by ``index_digest`` and stored under ``<manifest>.index/<hex>.npz``.

``dataset_id`` is the digest of the canonical JSON of everything else in the manifest (sorted
keys, no whitespace, no floats), so the same data built the same way gets the same ID and any
change to an object, a filter or the tokenizer gets a new one. This module is pure: values in,
values out; reading and writing files is in :mod:`hpcrun.data.build` and
:mod:`hpcrun.data.dataset`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xxhash

from hpcrun.data.formats import DIGEST_ALGO, ObjectFormat
from hpcrun.errors import DataError

__all__ = ["MANIFEST_KIND", "MANIFEST_SCHEMA_VERSION", "SAMPLE_ID_RULE", "DatasetManifest",
           "ObjectEntry", "SourceEntry", "canonical_json", "digest_arrays"]

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_KIND = "hpcrun.data.manifest"
SAMPLE_ID_RULE = "source.base + object.start + kept-record index (contiguous, in manifest order)"
"""How a global sample ID is formed; recorded in every manifest."""


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace: one byte string per value (the input of every digest)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def digest_arrays(**arrays: np.ndarray) -> str:
    """Digest of named arrays (name, dtype, shape and bytes), independent of file encoding."""
    h = xxhash.xxh3_128()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(canonical_json([name, arr.dtype.str, list(arr.shape)]).encode())
        h.update(arr.tobytes())
    return f"{DIGEST_ALGO}:{h.hexdigest()}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectEntry:
    """One immutable data object (a file) of a source."""

    path: str
    """Resolved absolute path (aliases and symlinks already followed)."""
    digest: str
    """Content digest, ``xxh3-128:<hex>``."""
    nbytes: int
    """Size in bytes."""
    records: int
    """Physical records in the object."""
    kept: int
    """Records kept after filtering and deduplication (the object's logical record count)."""
    start: int
    """First logical record of this object within its source: range ``[start, start+kept)``."""
    tokens: int
    """Tokens in the kept records."""
    index_digest: str
    """Digest of the sidecar index (kept record numbers, token lengths, byte offsets)."""

    def __post_init__(self) -> None:
        if min(self.nbytes, self.records, self.kept, self.start, self.tokens) < 0 \
                or self.kept > self.records:
            raise DataError(f"manifest object {self.path}: counts are inconsistent "
                            f"(records={self.records}, kept={self.kept}, start={self.start})")
        for d in (self.digest, self.index_digest):
            if not d.startswith(f"{DIGEST_ALGO}:"):
                raise DataError(f"manifest object {self.path}: digest {d!r} is not "
                                f"{DIGEST_ALGO}; rebuild the manifest with this hpcrun")


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceEntry:
    """One source: a named, ordered sequence of objects of one format."""

    name: str
    """Alias of the source (``name=PATH`` on the command line, else the path's stem)."""
    given: str
    """The path or alias as given, before resolution (provenance)."""
    format: ObjectFormat
    """Object format."""
    base: int
    """First global sample ID of this source."""
    records: int
    """Logical records (sum of the objects' ``kept``)."""
    tokens: int
    """Tokens in the logical records."""
    objects: tuple[ObjectEntry, ...]
    """The objects, in logical order."""
    split: str = "train"
    """Which split this source is (``train``, ``validation``, ...)."""
    filter: Mapping[str, int | None] = field(default_factory=dict)
    """Record filter applied at build time (``min_tokens``, ``max_tokens``)."""
    dedup: str = "none"
    """Deduplication applied at build time: ``none`` or ``exact`` (identical token content)."""
    compression: str = "none"
    """Compression of the objects (only ``none``: records need random access)."""
    access: str = "internal"
    """Access scope (``public``, ``internal``, ``restricted``): who may read the objects."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", ObjectFormat(self.format))
        if not self.name or self.records < 1:
            raise DataError(f"source {self.name!r} has no records after filtering; drop it "
                            "or relax the filter")
        nxt = 0
        for o in self.objects:
            if o.start != nxt:
                raise DataError(f"source {self.name!r}: object {o.path} starts at logical "
                                f"record {o.start}, expected {nxt} (ranges are contiguous)")
            nxt += o.kept
        if nxt != self.records:
            raise DataError(f"source {self.name!r}: objects keep {nxt} records, source says "
                            f"{self.records}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetManifest:
    """A dataset: sources, tokenizer, transforms, packing policy and provenance."""

    sources: tuple[SourceEntry, ...]
    """The sources in order (their sample-ID ranges follow this order)."""
    tokenizer: Mapping[str, Any] = field(default_factory=dict)
    """Tokenizer ``name``, ``version``, ``vocab_size`` and ``vocab_digest``."""
    transforms: tuple[str, ...] = ()
    """Named transforms the data was or must be passed through, in order."""
    packing: Mapping[str, Any] = field(default_factory=lambda: {"policy": "concat"})
    """Packing policy the run is expected to use (recorded, not enforced here)."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """Who built it with what (hpcrun version, command line); no timestamps (ID stability)."""
    sample_id_rule: str = SAMPLE_ID_RULE
    """How global sample IDs are formed."""
    schema_version: int = MANIFEST_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != MANIFEST_SCHEMA_VERSION:
            raise DataError(f"manifest schema_version is {self.schema_version}, expected "
                            f"{MANIFEST_SCHEMA_VERSION}; rebuild it with this hpcrun")
        if not self.sources:
            raise DataError("manifest has no sources; give at least one path to data build")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise DataError(f"manifest source names must be unique, found {names}")
        nxt = 0
        for s in self.sources:
            if s.base != nxt:
                raise DataError(f"source {s.name!r} starts at sample ID {s.base}, expected "
                                f"{nxt}; sample-ID ranges must be contiguous")
            nxt += s.records

    @property
    def num_samples(self) -> int:
        """Total logical records (global sample IDs are ``[0, num_samples)``)."""
        return sum(s.records for s in self.sources)

    def body(self) -> dict[str, Any]:
        """The canonical content (everything the dataset ID covers)."""
        raw = asdict(self)
        raw["kind"] = MANIFEST_KIND
        return raw

    @property
    def dataset_id(self) -> str:
        """``ds-<xxh3-128 hex>`` of the canonical manifest."""
        return "ds-" + xxhash.xxh3_128_hexdigest(canonical_json(self.body()).encode())

    def to_json(self) -> str:
        """Canonical JSON of the manifest plus its ``dataset_id`` (checked on load)."""
        raw = self.body()
        raw["dataset_id"] = self.dataset_id
        return json.dumps(raw, sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DatasetManifest:
        """Build a manifest from its decoded JSON body (a stored ``dataset_id`` is ignored:
        :meth:`from_json` checks it).

        Raises:
            DataError: ``raw`` is not an hpcrun dataset manifest.
            KeyError, TypeError, ValueError: a field is missing or has the wrong type.
        """
        if raw.get("kind") != MANIFEST_KIND:
            raise DataError(f"not a valid hpcrun dataset manifest: expected kind "
                            f"{MANIFEST_KIND!r}, found {raw.get('kind')!r}; build one with "
                            "`hpcrun data build`")
        sources = tuple(_source(s) for s in raw["sources"])
        return cls(sources=sources, tokenizer=dict(raw["tokenizer"]),
                   transforms=tuple(str(t) for t in raw["transforms"]),
                   packing=dict(raw["packing"]), provenance=dict(raw["provenance"]),
                   sample_id_rule=str(raw["sample_id_rule"]),
                   schema_version=int(raw["schema_version"]))

    @classmethod
    def from_json(cls, text: str, *, origin: str = "manifest") -> DatasetManifest:
        """Parse and validate an untrusted manifest; its stored ``dataset_id`` must match.

        Raises:
            DataError: malformed JSON, wrong kind/schema, or content that does not match
                its ``dataset_id``.
        """
        try:
            raw = json.loads(text)
            manifest = cls.from_dict(raw)
        except DataError as exc:
            raise DataError(f"{origin}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{origin}: not a valid hpcrun dataset manifest ({exc!r}); rebuild "
                            "it with `hpcrun data build`") from exc
        if raw.get("dataset_id") != manifest.dataset_id:
            raise DataError(f"{origin}: stored dataset_id {raw.get('dataset_id')!r} does not "
                            f"match its content ({manifest.dataset_id}); the file was edited, "
                            "rebuild it with `hpcrun data build`")
        return manifest


def _source(raw: Mapping[str, Any]) -> SourceEntry:
    objects = tuple(ObjectEntry(**{k: raw_o[k] for k in ObjectEntry.__dataclass_fields__})
                    for raw_o in raw["objects"])
    fields = {k: raw[k] for k in SourceEntry.__dataclass_fields__ if k != "objects"}
    return SourceEntry(objects=objects, **fields)
