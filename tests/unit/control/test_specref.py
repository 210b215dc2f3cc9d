"""The run.yaml reference: every dataclass field is a row with its default, and docs/spec.md is
what the rows render to."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcrun.control.spec import RunSpec
from hpcrun.control.specload import canonical, field_default, is_required, to_plain, type_hints
from hpcrun.control.specref import (
    DigestRule,
    Reference,
    RefRow,
    reference_rows,
    section_type,
    spec_reference,
)
from hpcrun.errors import ConfigError, SpecError

REPO_ROOT = Path(__file__).resolve().parents[3]
SPEC_MD = REPO_ROOT / "docs" / "spec.md"


def _fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any], type]]:
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        yield key, f, cls
        inner = section_type(type_hints(cls)[f.name])
        if inner is not None:
            yield from _fields(inner, key)


def test_every_field_of_every_section_is_a_row_with_its_default() -> None:
    rows = {r.key: r for r in spec_reference().rows}
    every = list(_fields(RunSpec))
    assert len(rows) == len(every), sorted(set(rows) ^ {k for k, _, _ in every})
    for key, f, _ in every:
        row = rows[key]
        if is_required(f):
            assert row.default == "required", key
        elif row.section and not row.default:
            assert dataclasses.is_dataclass(field_default(f)), key
        else:
            assert json.loads(row.default) == canonical(to_plain(field_default(f))), key
        assert row.meaning, f"{key} has no docstring: write one right after the field"


def test_known_rows_say_type_default_bounds_enum_members_and_digest() -> None:
    rows = {r.key: r for r in spec_reference().rows}
    assert rows["resources.nodes"] == RefRow(
        key="resources.nodes", type="integer", default="1", allowed=">= 1",
        meaning="Nodes the gang runs on.", digest=DigestRule.ALWAYS)
    assert rows["data.global_batch"].type == "integer or null"
    assert rows["data.global_batch"].allowed == ">= 1"
    assert rows["checkpoint.rpo_s"].allowed == "> 0"
    assert rows["checkpoint.checksum"].allowed == "xxh3, sha256"
    assert rows["checkpoint.checksum"].digest is DigestRule.WHEN_SET  # ADDITIVE
    assert rows["checkpoint.keep_last"].digest is DigestRule.ALWAYS
    assert rows["sdc"].section and rows["sdc"].digest is DigestRule.WHEN_SET
    assert rows["sdc.every_steps"].digest is DigestRule.WITH_SECTION
    assert rows["name"].default == "required"
    assert rows["checkpoint.tiers"].allowed == "node_local, shared"
    assert rows["retry.max_attempts"].allowed.startswith("keys: preemption, timeout, ")
    assert rows["preempt_signal"].allowed == "SIGTERM, SIGUSR1, SIGUSR2, SIGINT"
    assert rows["cancel_authority"].type == "list of strings"
    assert rows["retry.max_attempts"].type == "mapping string -> integer"
    assert "``" not in rows["entrypoint"].meaning and "\n" not in rows["entrypoint"].meaning


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Inner:
    depth: int = 3
    """How deep."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Outer:
    label: str
    """A label."""
    inner: Inner | None = None
    """An optional section."""


def test_a_new_field_appears_without_any_other_change() -> None:
    rows = reference_rows(Outer, digest=False)
    assert [(r.key, r.type, r.default, r.meaning, r.digest) for r in rows] == [
        ("label", "string", "required", "A label.", None),
        ("inner", "section or null", "null", "An optional section.", None),
        ("inner.depth", "integer", "3", "How deep.", None)]


def test_a_key_or_a_section_selects_its_rows() -> None:
    ref = spec_reference()
    assert [r.key for r in ref.select("resources.nodes")] == ["resources.nodes"]
    section = ref.select("checkpoint")
    assert section[0].key == "checkpoint" and all(
        r.key.startswith("checkpoint.") for r in section[1:])
    assert {"checkpoint.keep_last", "checkpoint.tiers"} <= {r.key for r in section}
    assert ref.select(None) == ref.rows


def test_an_unknown_key_is_one_line_naming_the_closest_keys() -> None:
    with pytest.raises(SpecError) as info:
        spec_reference().select("resources.node")
    msg = str(info.value)
    assert "\n" not in msg and "unknown key 'resources.node'" in msg
    assert "did you mean 'resources.nodes'" in msg and "hpcrun spec explain" in msg
    with pytest.raises(ConfigError):
        spec_reference().select("nope", error=ConfigError)


def test_markdown_has_a_table_per_section_and_escapes_pipes() -> None:
    text = spec_reference().markdown()
    assert text.startswith("# run.yaml reference\n")
    for section in ("resources", "checkpoint", "data", "retry", "budgets", "sdc", "dist"):
        assert f"\n## `{section}`\n" in text
    assert "| `resources.nodes` | integer | `1` | >= 1 | yes | Nodes the gang runs on. |" in text
    for line in text.splitlines():
        if line.startswith("| `"):
            assert line.replace("\\|", "").count("|") == 7, line


def test_docs_spec_md_is_up_to_date() -> None:
    expected = spec_reference().markdown()
    assert SPEC_MD.exists(), "docs/spec.md is missing: run make spec-docs"
    assert SPEC_MD.read_text() == expected, (
        "docs/spec.md is stale (a spec field, default or docstring changed): run make spec-docs")


def test_reference_text_lists_facts_then_meaning() -> None:
    ref = Reference(title="t", intro="i", what="x.yaml", command="c",
                    rows=spec_reference().select("resources.nodes"))
    assert ref.text() == ("resources.nodes: integer; default 1; allowed: >= 1; in the spec "
                          "digest: yes\n    Nodes the gang runs on.\n")


def _lookup(plain: Any, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(plain, dict) or part not in plain:
            return False, None
        plain = plain[part]
    return True, plain


def test_the_digest_column_says_which_keys_the_canonical_json_holds() -> None:
    minimal = RunSpec.from_dict({"name": "tiny", "entrypoint": "m:f"})
    plain = minimal.to_dict()
    rows = spec_reference().rows
    for row in rows:
        parent = row.key.rpartition(".")[0]
        if parent and _lookup(plain, parent) == (True, None):
            continue  # an optional section left null (code): nothing under it is written
        present, _ = _lookup(plain, row.key)
        # At its default, a key is in the digest exactly when the column says "yes".
        assert present == (row.digest is DigestRule.ALWAYS), row.key
    sdc = RunSpec.from_dict({"name": "tiny", "entrypoint": "m:f", "sdc": {"every_steps": 7}})
    assert _lookup(sdc.to_dict(), "sdc.enabled")[0]  # "when its section is not default"
    assert sdc.spec_id != minimal.spec_id
