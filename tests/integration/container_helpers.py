"""A small Charliecloud image directory for the container tests, and the site that uses it.

The image is a *skeleton*: empty mount points, the merged-``/usr`` symlinks (``bin``, ``lib``,
``lib64``, ``sbin`` → ``usr/...``) and nothing else. Its ``/usr`` and ``/etc`` are the host's,
bound by the site's ``container.mounts``, and hpcrun binds the run's own paths (run directory,
node-local tier, code, data, the interpreter's environment) as it does on any site. Why bound and
not copied: copying (or hard-linking) the host's ``/usr`` and the venv with torch costs seconds to
minutes and gigabytes on a loaded 2-core machine, and proves nothing more about hpcrun: what the
tests check is that each rank really runs inside ``ch-run`` (its own mount namespace whose ``/``
is this directory, recorded by the rank itself) and that hpcrun's binds and environment are
enough for a rank to train, checkpoint, stop and resume there. What it does not prove is that a
foreign distribution's userland works (a real image ships its own ``/usr`` and Python).
Charliecloud images are read-only, so every bind destination must exist in the image: the
helper creates the mount points of the paths given, and keeps the run's own paths under ``/tmp``,
which ``ch-run`` binds from the host by default.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CH_RUN = shutil.which("ch-run")
"""Charliecloud's runtime, when installed (Debian: ``apt-get install charliecloud-runtime``)."""
NO_CH_RUN = "ch-run (Charliecloud) is not installed: apt-get install charliecloud-runtime"
HOST_MOUNTS = ("/usr:/usr", "/etc:/etc")
"""The image's userland: the host's, bound (see the module docstring)."""
_MOUNT_POINTS = ("usr", "etc", "dev", "proc", "sys", "tmp", "root", "home", "run", "var", "mnt")


def interpreter_dirs() -> list[Path]:
    """Where this interpreter and its environment live (resolved): they need mount points."""
    return [Path(p).resolve() for p in (sys.prefix, sys.base_prefix,
                                        Path(sys.executable).parent.parent)]


def build_image(dest: Path, mount_points: Iterable[Path] = ()) -> Path:
    """Make the skeleton image at ``dest`` with a mount point for each of ``mount_points`` (host
    paths outside ``/tmp``); return ``dest``."""
    for name in _MOUNT_POINTS:
        (dest / name).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if not (dest / name).is_symlink():
            (dest / name).symlink_to(f"usr/{name}")
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        (dest / "etc" / name).touch()
    for path in mount_points:
        path = Path(path).resolve()
        if path.parts[1:2] != ("tmp",):
            (dest / path.relative_to("/")).mkdir(parents=True, exist_ok=True)
    return dest


def container_site(base: dict[str, Any], *, name: str, image: Path,
                   node_local: str | Path) -> dict[str, Any]:
    """``base`` (a site config's mapping) with ranks in ``image`` through Charliecloud; the
    node-local tier under ``node_local`` (a path the image can hold: under ``/tmp``)."""
    return {**base, "name": name, "node_local_path": str(node_local),
            "container": {"runtime": "charliecloud", "image": str(image),
                          "mounts": list(HOST_MOUNTS), "gpus": False}}


def ch_env() -> dict[str, str]:
    """What ``ch-run`` needs in the agents' environment (it refuses to start without ``USER``)."""
    return {"USER": os.environ.get("USER") or "root"}
