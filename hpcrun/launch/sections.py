"""The checks a site config's sections share: a nested mapping (``container:``,
``shared_tier:``) and a list of strings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcrun.errors import ConfigError


def section_mapping(raw: object, *, key: str, keys: Sequence[str], source: str,
                    expected: str) -> Mapping[str, Any] | None:
    """``raw`` as a mapping whose keys are all in ``keys`` (None when the section is absent).

    Raises:
        ConfigError: naming ``source``, the section ``key`` (and the unknown sub-key), what was
            expected (``expected`` describes a valid section) and what was found.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: key {key!r}: expected {expected}, found {raw!r}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(f"{source}: key '{key}.{unknown[0]}': unknown; expected one of "
                          f"{', '.join(keys)}")
    return raw


def str_tuple(key: str, value: object, source: str) -> tuple[str, ...]:
    """``value`` as a tuple of strings (empty when absent).

    Raises:
        ConfigError: naming ``source`` and ``key`` when ``value`` is not a list of strings.
    """
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: key {key!r}: expected a list of strings, found {value!r}")
    return tuple(value)
