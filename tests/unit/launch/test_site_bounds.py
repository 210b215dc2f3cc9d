"""Every number of a site config is finite and within what its consumer accepts.

Walks every numeric key of the site config (from :class:`SiteConfig`'s and
:class:`SharedTierConfig`'s own fields, so a new key is covered without a list to keep) with
``0``, ``-1``, ``nan``, ``inf`` and ``1e15``: each is either refused at load in one line naming
the key, or kept as a finite value; a duration (a key ending in ``_s``) is kept only in
``(0, MAX_DURATION_S]``, the bound the spec's durations have.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from hpcrun.control.specload import MAX_DURATION_S
from hpcrun.errors import ConfigError
from hpcrun.launch.site import SiteConfig, load_site, site_from_dict
from hpcrun.launch.striping import SharedTierConfig

NUMERIC = {"int", "float"}
SITE_KEYS = [f.name for f in dataclasses.fields(SiteConfig) if f.type in NUMERIC]
TIER_KEYS = [f"shared_tier.{f.name}" for f in dataclasses.fields(SharedTierConfig)
             if f.type in ("int | None", "float")]
KEYS = SITE_KEYS + TIER_KEYS
VALUES = [0, -1, float("nan"), float("inf"), 1e15]


def _site_with(key: str, value: object) -> SiteConfig:
    raw: dict[str, Any] = load_site("testbed").to_dict()
    if key.startswith("shared_tier."):
        raw["shared_tier"] = {**(raw.get("shared_tier") or {}), key.split(".")[1]: value}
    else:
        raw[key] = value
    return site_from_dict(raw, source="site.yaml")


def _kept(site: SiteConfig, key: str) -> Any:
    section, _, name = key.rpartition(".")
    return getattr(getattr(site, section) if section else site, name)


def test_the_walk_finds_the_known_numbers() -> None:
    assert {"gpus_per_node", "preempt_lead_s", "mtbf_prior_h", "pg_init_timeout_s",
            "step_timeout_s", "checkpoint_timeout_s", "sweep_max_points"} <= set(SITE_KEYS)
    assert {"shared_tier.deadline_s", "shared_tier.stripe_count"} <= set(TIER_KEYS)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_site_number_is_refused_in_one_line_or_kept_finite_and_in_range(
        key: str, value: float) -> None:
    try:
        site = _site_with(key, value)
    except ConfigError as exc:
        text = str(exc)
        assert key.split(".")[-1] in text and "\n" not in text, text
        assert text.startswith("site.yaml: ") and "expected" in text, text
        return
    kept = _kept(site, key)
    assert isinstance(kept, int | float) and math.isfinite(kept), (key, kept)
    if key.endswith("_s"):
        assert 0 < kept <= MAX_DURATION_S or key == "preempt_lead_s", (key, kept)
    assert kept == value, (key, kept)  # nothing is silently replaced by a default


@pytest.mark.parametrize("key", [k for k in KEYS if k.endswith("_timeout_s")
                                 or k == "shared_tier.deadline_s"])
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_every_timeout_and_deadline_outside_its_bound_is_refused(key: str,
                                                                 value: float) -> None:
    with pytest.raises(ConfigError, match=rf"{key.split('.')[-1]}'?: expected finite "
                                          rf"seconds, > 0 and at most {MAX_DURATION_S}"):
        _site_with(key, value)


def test_the_shared_tier_deadline_defaults_only_when_the_key_is_absent() -> None:
    raw = load_site("testbed").to_dict()
    tier = site_from_dict({**raw, "shared_tier": {"stripe_count": 2}}).shared_tier
    assert tier is not None and tier.deadline_s == 300.0
    with pytest.raises(ConfigError, match=r"shared_tier\.deadline_s: expected finite seconds, "
                                          r"> 0 .*found 0\.0; write how long one shared-tier"):
        site_from_dict({**raw, "shared_tier": {"deadline_s": 0}}, source="site.yaml")
    with pytest.raises(ConfigError, match=r"'shared_tier\.deadline_s': expected seconds, "
                                          r"found None; .*leave the key out for 300"):
        site_from_dict({**raw, "shared_tier": {"deadline_s": None}}, source="site.yaml")
    assert site_from_dict({**raw, "shared_tier": {"deadline_s": MAX_DURATION_S}}
                          ).shared_tier.deadline_s == MAX_DURATION_S  # type: ignore[union-attr]


def test_the_expected_values_that_stay_accepted() -> None:
    assert _site_with("gpus_per_node", 0).gpus_per_node == 0
    assert _site_with("preempt_lead_s", 0).preempt_lead_s == 0
    assert _site_with("mtbf_prior_h", 1e15).mtbf_prior_h == 1e15
    assert _site_with("shared_tier.stripe_count", -1).shared_tier.stripe_count == -1  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"stripe_count: expected -1 \(all OSTs\) or 1\.\.2000"):
        _site_with("shared_tier.stripe_count", 2001)
