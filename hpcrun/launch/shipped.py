"""Where the files hpcrun ships beside its code live: ``site_configs/`` and ``sbatch_templates/``.

In a source checkout (and an editable install) they sit next to the ``hpcrun`` package; a wheel
installs them as data files under ``<prefix>/share/hpcrun/``.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from hpcrun.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]


def shipped_dir(name: str, *, roots: Sequence[Path] | None = None) -> Path:
    """The shipped directory ``name``: beside the package, else under ``share/hpcrun``.

    Raises:
        ConfigError: neither place holds it (a broken install).
    """
    candidates = [Path(r) / name for r in (roots if roots is not None else _roots())]
    for path in candidates:
        if path.is_dir():
            return path
    raise ConfigError(f"hpcrun's {name}/ is missing (looked in "
                      f"{', '.join(str(c) for c in candidates)}); reinstall hpcrun")


def _roots() -> list[Path]:
    prefixes = dict.fromkeys([sys.prefix, sysconfig.get_config_var("userbase") or ""])
    return [_CHECKOUT] + [Path(p) / "share" / "hpcrun" for p in prefixes if p]
