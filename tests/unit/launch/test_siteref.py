"""The site config reference: every SiteConfig field (and its sections') is a row with its
default, and docs/site.md is what the rows render to."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hpcrun.control.specload import canonical, field_default, is_required, to_plain, type_hints
from hpcrun.control.specref import section_type
from hpcrun.launch.site import SiteConfig
from hpcrun.launch.siteref import site_reference

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_every_site_field_is_a_row_with_its_default_and_no_digest() -> None:
    rows = {r.key: r for r in site_reference().rows}
    seen = []
    stack: list[tuple[type, str]] = [(SiteConfig, "")]
    while stack:
        cls, prefix = stack.pop()
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            seen.append(key)
            row = rows[key]
            assert row.digest is None and row.meaning, key
            if is_required(f):
                assert row.default == "required", key
            else:
                assert json.loads(row.default) == canonical(to_plain(field_default(f))), key
            inner = section_type(type_hints(cls)[f.name])
            if inner is not None:
                stack.append((inner, key))
    assert sorted(seen) == sorted(rows)
    assert rows["preempt_mode"].allowed == "requeue, cancel, off"
    assert rows["container"].type == "section or null" and rows["container"].section


def test_docs_site_md_is_up_to_date() -> None:
    page = REPO_ROOT / "docs" / "site.md"
    assert page.exists(), "docs/site.md is missing: run make spec-docs"
    assert page.read_text() == site_reference().markdown(), (
        "docs/site.md is stale (a site config field, default or docstring changed): "
        "run make spec-docs")
