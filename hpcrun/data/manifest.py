"""The dataset manifest: immutable objects, their digests and ranges, and the dataset ID.

A manifest lists *sources* (one per path or alias given to ``hpcrun data build``); a source is a
sequence of *objects* (files) pinned by content digest. Every object's kept records form a
contiguous *logical range* of the source, and every source a contiguous range of global sample
IDs (:data:`SAMPLE_ID_RULE`). Per-record token lengths, the kept physical record numbers (after
filtering and deduplication) and JSONL byte offsets live in a sidecar *index* per object, pinned
by ``index_digest`` and stored under ``<manifest>.index/<hex>.npz``.

``dataset_id`` is the digest of the canonical JSON of everything else in the manifest (sorted
keys, no whitespace, no floats), so the same data built the same way gets the same ID and any
change to an object, a filter or the tokenizer gets a new one. An object path must be absolute,
normalized and in its source's directory (:func:`object_path_escape`, checked when a source is
built, so every reader of a manifest refuses one that escapes, whatever its seal says: the seal
is the manifest's own digest, and only a pinned ``data.dataset_id`` tells a resealed manifest
from the one a run was meant to read). This module is pure: values in,
values out; reading and writing files is in :mod:`hpcrun.data.build` and
:mod:`hpcrun.data.dataset`.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import xxhash

from hpcrun.data.formats import DIGEST_ALGO, ObjectFormat
from hpcrun.errors import DataError

__all__ = ["MANIFEST_KIND", "MANIFEST_SCHEMA_VERSION", "SAMPLE_ID_RULE", "DatasetManifest",
           "ObjectEntry", "SourceEntry", "canonical_utf8_json", "check_manifest_shape",
           "digest_arrays", "object_path_escape", "source_root"]

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_KIND = "hpcrun.data.manifest"
SAMPLE_ID_RULE = "source.base + object.start + kept-record index (contiguous, in manifest order)"
"""How a global sample ID is formed; recorded in every manifest."""


def canonical_utf8_json(obj: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept as characters: one string per value (the
    input of every data digest; :func:`hpcrun.control.payload.canonical_json` escapes non-ASCII
    instead, so the two are not interchangeable)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def digest_arrays(**arrays: np.ndarray) -> str:
    """Digest of named arrays (name, dtype, shape and bytes), independent of file encoding."""
    h = xxhash.xxh3_128()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(canonical_utf8_json([name, arr.dtype.str, list(arr.shape)]).encode())
        h.update(arr.tobytes())
    return f"{DIGEST_ALGO}:{h.hexdigest()}"


def source_root(paths: Sequence[str]) -> str:
    """The directory a source's objects live in (pure): ``data build`` lists one directory, not
    recursively, or names one file, so every object of a source is a child of one directory;
    when a manifest says otherwise, the directory most of them are in."""
    parents = Counter(posixpath.dirname(p) for p in paths)
    return parents.most_common(1)[0][0] if parents else ""


def object_path_escape(path: str, root: str) -> str | None:
    """Why object ``path`` escapes its source's ``root`` directory, or ``None`` when it does not
    (pure; the one rule every reader of a manifest goes through).

    A path that ``data build`` writes is absolute, normalized and a child of the source's root.
    A relative path would be read from wherever the reader runs, and ``..`` (or a path in
    another directory) reaches outside the dataset: both are refused, digest or not.
    """
    parts = path.split("/")
    if not path.startswith("/"):
        return "it is relative (read from whatever directory the reader runs in)"
    if "\x00" in path or any(p in ("", ".", "..") for p in parts[1:]) \
            or posixpath.normpath(path) != path:
        return "it is not a normalized absolute path (it holds '..', '.' or '//')"
    if posixpath.dirname(path) != root:
        return f"it is not in the source's directory {root}"
    return None


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
        root = source_root([o.path for o in self.objects])
        for o in self.objects:
            why = object_path_escape(o.path, root)
            if why is not None:
                raise DataError(f"source {self.name!r}: object path {o.path!r} escapes the "
                                f"dataset's root: {why}; expected an absolute path in one "
                                "directory per source, as `hpcrun data build` writes; the "
                                "manifest is corrupt or forged, rebuild it")
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
        return "ds-" + xxhash.xxh3_128_hexdigest(canonical_utf8_json(self.body()).encode())

    def to_json(self) -> str:
        """Canonical JSON of the manifest plus its ``dataset_id`` (checked on load)."""
        raw = self.body()
        raw["dataset_id"] = self.dataset_id
        return json.dumps(raw, sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, raw: object) -> DatasetManifest:
        """Build a manifest from its decoded JSON body, after checking its shape (a stored
        ``dataset_id`` is ignored: :meth:`from_json` checks it).

        Raises:
            DataError: ``raw`` does not have the shape of an hpcrun dataset manifest.
        """
        check_manifest_shape(raw)
        raw = cast(dict[str, Any], raw)  # the shape check says so
        sources = tuple(_source(s) for s in raw["sources"])
        return cls(sources=sources, tokenizer=dict(raw["tokenizer"]),
                   transforms=tuple(str(t) for t in raw["transforms"]),
                   packing=dict(raw["packing"]), provenance=dict(raw["provenance"]),
                   sample_id_rule=str(raw["sample_id_rule"]),
                   schema_version=int(raw["schema_version"]))

    @classmethod
    def from_json(cls, text: str | bytes, *, origin: str = "manifest") -> DatasetManifest:
        """Parse and validate an untrusted manifest; its stored ``dataset_id`` must match.

        The shape (a JSON object of the kind and schema this hpcrun writes, every field of the
        type it must have) is checked before any field is used, so a manifest that is a JSON
        list, an empty object, truncated, or hand-edited is one :class:`DataError` line.

        Raises:
            DataError: malformed JSON, wrong kind/schema/shape, or content that does not match
                its ``dataset_id``.
        """
        try:
            raw = json.loads(text)
        except UnicodeDecodeError as exc:
            raise DataError(f"{origin}: not a dataset manifest (not UTF-8 text: {exc.reason} at "
                            f"byte {exc.start}); rebuild it with `hpcrun data build`") from exc
        except ValueError as exc:
            raise DataError(f"{origin}: not valid JSON ({exc}); the file is truncated or was "
                            "edited by hand, rebuild it with `hpcrun data build`") from exc
        try:
            manifest = cls.from_dict(raw)
        except DataError as exc:
            raise DataError(f"{origin}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{origin}: not a valid hpcrun dataset manifest ({exc!r}); rebuild "
                            "it with `hpcrun data build`") from exc
        if raw["dataset_id"] != manifest.dataset_id:
            raise DataError(f"{origin}: stored dataset_id {raw['dataset_id']!r} does not "
                            f"match its content ({manifest.dataset_id}); the file was edited, "
                            "rebuild it with `hpcrun data build`")
        return manifest


# What each level of a manifest must hold, as JSON types (bool is not an int here).
_TOP_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "dataset_id": (str,), "sources": (list,), "tokenizer": (dict,),
    "transforms": (list,), "packing": (dict,), "provenance": (dict,), "sample_id_rule": (str,)}
_SOURCE_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "given": (str,), "format": (str,), "base": (int,), "records": (int,),
    "tokens": (int,), "objects": (list,), "split": (str,), "filter": (dict,), "dedup": (str,),
    "compression": (str,), "access": (str,)}
_OBJECT_FIELDS: dict[str, tuple[type, ...]] = {
    "path": (str,), "digest": (str,), "nbytes": (int,), "records": (int,), "kept": (int,),
    "start": (int,), "tokens": (int,), "index_digest": (str,)}
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
               type(None): "null"}


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, float):
        return "a number with a fraction"
    return next((n for t, n in _JSON_NAMES.items() if isinstance(value, t)), type(value).__name__)


def _require(raw: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]], where: str) -> None:
    for key, types in fields.items():
        if key not in raw:
            raise DataError(f"{where}{key} is missing; expected {_JSON_NAMES[types[0]]}")
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise DataError(f"{where}{key}: expected {_JSON_NAMES[types[0]]}, found "
                            f"{_json_type(value)}")


def check_manifest_shape(raw: object) -> None:
    """Raise :class:`DataError` unless ``raw`` (parsed JSON) has the shape of a manifest (pure).

    Checks the top level is an object of :data:`MANIFEST_KIND` and :data:`MANIFEST_SCHEMA_VERSION`
    and that every field the parser reads has its JSON type; values are checked by the
    dataclasses after.
    """
    if not isinstance(raw, dict):
        raise DataError(f"not a valid hpcrun dataset manifest: the file holds "
                        f"{_json_type(raw)}, expected a JSON object as written by "
                        "`hpcrun data build`; rebuild it")
    if raw.get("kind") != MANIFEST_KIND:
        found = "an empty object" if not raw else f"kind {raw.get('kind')!r}"
        raise DataError(f"not a valid hpcrun dataset manifest: expected kind "
                        f"{MANIFEST_KIND!r}, found {found}; build one with `hpcrun data build`")
    _require(raw, _TOP_FIELDS, "")
    if raw["schema_version"] != MANIFEST_SCHEMA_VERSION:
        raise DataError(f"manifest schema_version is {raw['schema_version']}, expected "
                        f"{MANIFEST_SCHEMA_VERSION}; rebuild it with this hpcrun")
    for i, source in enumerate(raw["sources"]):
        if not isinstance(source, dict):
            raise DataError(f"sources[{i}]: expected an object, found {_json_type(source)}")
        _require(source, _SOURCE_FIELDS, f"sources[{i}].")
        for j, obj in enumerate(source["objects"]):
            if not isinstance(obj, dict):
                raise DataError(f"sources[{i}].objects[{j}]: expected an object, found "
                                f"{_json_type(obj)}")
            _require(obj, _OBJECT_FIELDS, f"sources[{i}].objects[{j}].")


def _source(raw: Mapping[str, Any]) -> SourceEntry:
    objects = tuple(ObjectEntry(**{k: raw_o[k] for k in ObjectEntry.__dataclass_fields__})
                    for raw_o in raw["objects"])
    fields = {k: raw[k] for k in SourceEntry.__dataclass_fields__ if k != "objects"}
    return SourceEntry(objects=objects, **fields)
