"""The site's shared tier: the layout of checkpoint directories and the deadline of its
operations (``shared_tier:`` in a site config).

On Lustre a new directory gets the filesystem's default layout, often one stripe, so every
large shard lands on one OST. ``stripe_count``/``stripe_size`` set the checkpoint directory's
default layout with ``lfs setstripe -c N -S SIZE`` when the run is created; every shard written
below it inherits it. Where ``lfs`` is missing the settings cannot take effect, and
:func:`apply_striping` says so instead of ignoring them silently. GPFS and NFS have no
per-directory striping: leave the keys out there (see docs/launch.md, "Sites").

:func:`stripe_command` and :func:`shared_tier_from_dict` are pure; :func:`apply_striping` runs
the command through the injected runner.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.control.specload import duration_expected
from hpcrun.errors import ConfigError
from hpcrun.launch.sections import section_mapping
from hpcrun.runner import CommandRunner

__all__ = ["SharedTierConfig", "apply_striping", "shared_tier_from_dict", "stripe_command"]

DEFAULT_DEADLINE_S = 300.0
"""Seconds a shared-tier operation may take when the site sets no ``deadline_s``."""
MAX_STRIPE_COUNT = 2000
"""Most stripes Lustre gives one file (``LOV_MAX_STRIPE_COUNT``)."""
_SIZE_RE = re.compile(r"^[1-9][0-9]*[KMGkmg]?$")
_KEYS = ("stripe_count", "stripe_size", "deadline_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedTierConfig:
    """Settings of the parallel filesystem that holds the runs."""

    stripe_count: int | None = None
    """Lustre: OSTs each checkpoint file is striped over (``-1``: all); None: the default."""
    stripe_size: str | None = None
    """Lustre: stripe size (``4M``, ``16M``); None: the filesystem's default."""
    deadline_s: float = DEFAULT_DEADLINE_S
    """Seconds one shared-tier operation (write, fsync, rename, read) may take before it is a
    ``storage_timeout`` fault instead of a hang."""

    def __post_init__(self) -> None:
        if self.stripe_count is not None and not (
                self.stripe_count == -1 or 1 <= self.stripe_count <= MAX_STRIPE_COUNT):
            raise ConfigError(f"shared_tier.stripe_count: expected -1 (all OSTs) or 1.."
                              f"{MAX_STRIPE_COUNT} (Lustre's most stripes per file), found "
                              f"{self.stripe_count}; write -1 to stripe over every OST")
        if self.stripe_size is not None and not _SIZE_RE.match(self.stripe_size):
            raise ConfigError(f"shared_tier.stripe_size: expected a size such as 4M or 1G, "
                              f"found {self.stripe_size!r}")
        expected = duration_expected(self.deadline_s)
        if expected is not None:
            raise ConfigError(f"shared_tier.deadline_s: expected {expected}, found "
                              f"{self.deadline_s!r}; write how long one shared-tier operation "
                              "may take (default 300)")

    @property
    def striped(self) -> bool:
        """Whether a layout is asked for."""
        return self.stripe_count is not None or self.stripe_size is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as :func:`shared_tier_from_dict` reads it."""
        return {"stripe_count": self.stripe_count, "stripe_size": self.stripe_size,
                "deadline_s": self.deadline_s}


def shared_tier_from_dict(raw: object, *, source: str) -> SharedTierConfig | None:
    """Validate a site config's ``shared_tier:`` mapping (None: defaults, no striping).

    Raises:
        ConfigError: naming ``source`` and the key.
    """
    raw = section_mapping(raw, key="shared_tier", keys=_KEYS, source=source,
                          expected=f"a mapping of {', '.join(_KEYS)}")
    if raw is None:
        return None
    count, size, deadline = (raw.get(k) for k in _KEYS)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise ConfigError(f"{source}: key 'shared_tier.stripe_count': expected an integer, "
                          f"found {count!r}")
    if "deadline_s" in raw and (isinstance(deadline, bool)
                                or not isinstance(deadline, int | float)):
        raise ConfigError(f"{source}: key 'shared_tier.deadline_s': expected seconds, found "
                          f"{deadline!r}; write a number of seconds, or leave the key out for "
                          f"{DEFAULT_DEADLINE_S:g}")
    try:
        # the default only when the key is absent: 0 is refused, never read as "unset"
        return SharedTierConfig(stripe_count=count, stripe_size=None if size is None else
                                str(size), deadline_s=DEFAULT_DEADLINE_S if deadline is None
                                else float(deadline))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def stripe_command(tier: SharedTierConfig | None, directory: Path) -> list[str] | None:
    """``lfs setstripe`` for ``directory``, or None when no layout is asked for (pure)."""
    if tier is None or not tier.striped:
        return None
    argv = ["lfs", "setstripe"]
    if tier.stripe_count is not None:
        argv += ["-c", str(tier.stripe_count)]
    if tier.stripe_size is not None:
        argv += ["-S", tier.stripe_size]
    return [*argv, str(directory)]


def apply_striping(tier: SharedTierConfig | None, directory: Path, *, runner: CommandRunner,
                   which: Callable[[str], str | None] = shutil.which) -> str | None:
    """Give ``directory`` the site's Lustre layout; return a warning when it cannot.

    The directory is created first. Without ``lfs`` on PATH, or when it refuses (not a Lustre
    mount), the layout stays the filesystem's default and the warning says so: the settings
    are never ignored silently.
    """
    argv = stripe_command(tier, directory)
    if argv is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    if which("lfs") is None:
        return (f"site shared_tier sets Lustre striping ({' '.join(argv[2:-1])}) but `lfs` is "
                f"not on PATH here; {directory} keeps the filesystem's default layout. Remove "
                "stripe_count/stripe_size on a non-Lustre filesystem, or load Lustre's client "
                "tools")
    result = runner.run(argv, timeout=60)
    if result.returncode != 0:
        return (f"`{' '.join(argv)}` failed ({result.stderr.strip()[:200]}); {directory} keeps "
                "the filesystem's default layout; is the shared tier a Lustre mount?")
    return None
