"""Containers: which process runs in the image, its command line, and the checks around it.

Two shapes, by runtime (docs/launch.md "Containers"):

- ``charliecloud`` and ``apptainer``: **the agent stays on the host** (it calls ``scontrol``,
  ``sacct`` and ``scancel``, watches liveness, runs the drain and the partner server) and each
  *rank* process, a warm one included, is started through the runtime: :func:`rank_command`
  turns the rank's ``argv`` into ``ch-run --bind=... IMAGE -- argv`` or ``apptainer exec --nv
  --bind ... IMAGE argv``. The binds are the incarnation's paths (run directory, node-local tier,
  code directory, data roots, and the interpreter's environment when the image has none of its
  own: :func:`rank_binds`) plus the site's ``mounts``. The environment passes through as it is:
  ``ch-run`` keeps the caller's environment, and ``apptainer exec`` inherits it unless
  ``--cleanenv`` is given, which :class:`ContainerConfig` refuses (the rank's identity travels in
  ``HPCRUN_*`` variables).
- ``pyxis``: the agents' ``srun`` runs them inside the image (``--container-image``); the
  agent's Slurm calls then go through the site's ``HPCRUN_SLURM_WRAPPER``
  (:class:`hpcrun.runner.PrefixRunner`), as images ship no Slurm clients.

A rank started in an image checks that it runs the agent's hpcrun (:func:`check_same_hpcrun`:
version and :func:`package_digest`, passed in :data:`HOST_VERSION_ENV` and
:data:`HOST_DIGEST_ENV`); a mismatch ends the run as a ``user_error``, before training.

Everything but :func:`package_digest`, :func:`container_problems`'s filesystem look-ups and
:func:`root_mount` is pure.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpcrun.errors import ConfigError
from hpcrun.launch.scriptslots import one_line, option_word
from hpcrun.launch.sections import section_mapping, str_tuple
from hpcrun.vocab import Backend

__all__ = ["HOST_DIGEST_ENV", "HOST_VERSION_ENV", "ContainerConfig", "ContainerRuntime",
           "check_same_hpcrun", "container_from_dict", "container_problems", "host_environ",
           "package_digest", "rank_binds", "rank_command", "render_container", "root_mount"]

HOST_VERSION_ENV = "HPCRUN_HOST_VERSION"
"""The agent's hpcrun version, given to a rank started in an image."""
HOST_DIGEST_ENV = "HPCRUN_HOST_DIGEST"
"""The agent's :func:`package_digest`, given to a rank started in an image."""


class ContainerRuntime(StrEnum):
    """How a run uses an image."""

    PYXIS = "pyxis"                # srun --container-image: the agents run in the image
    APPTAINER = "apptainer"        # apptainer exec IMAGE: each rank runs in the image
    CHARLIECLOUD = "charliecloud"  # ch-run IMAGE --: each rank runs in the image


RANK_RUNTIMES = frozenset({ContainerRuntime.APPTAINER, ContainerRuntime.CHARLIECLOUD})
"""Runtimes that start the ranks in the image and leave the agent on the host."""
COMMAND = {ContainerRuntime.PYXIS: "srun", ContainerRuntime.APPTAINER: "apptainer",
           ContainerRuntime.CHARLIECLOUD: "ch-run"}
"""The command each runtime needs on the compute nodes."""
_CLEANENV = ("--cleanenv", "-e", "--containall", "-C")


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerConfig:
    """The image a run's ranks (Apptainer, Charliecloud) or agents (Pyxis) run in."""

    runtime: ContainerRuntime
    """``charliecloud``, ``apptainer`` or ``pyxis``."""
    image: str
    """An image directory (Charliecloud, ``ch-convert`` output), a ``.sif`` path (Apptainer), a
    registry reference ``nvcr.io#nvidia/pytorch:24.05-py3`` (Pyxis)."""
    mounts: tuple[str, ...] = ()
    """``SRC:DST[:FLAGS]`` bind mounts beside those hpcrun adds itself (run directory, node-local
    tier, code, data; Pyxis: the shared tier and the run directory must be in it)."""
    flags: tuple[str, ...] = ()
    """Extra flags: added to ``srun`` (Pyxis, e.g. ``--container-workdir=/work``), to
    ``apptainer exec`` or to ``ch-run`` (e.g. ``--set-env=/ch/environment``)."""
    gpus: bool = True
    """Apptainer: pass ``--nv``. Charliecloud has no run flag: inject the NVIDIA libraries with
    ``ch-fromhost --nvidia IMAGE`` when the image is built. Pyxis: enroot's hooks do it."""
    python: str | None = None
    """The interpreter inside the image (``python3`` of an image that ships torch and hpcrun);
    default: the agent's own interpreter, whose environment is then bound into the image."""

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise ConfigError("container.image: expected an image reference, found ''; name "
                              "the image (a directory for charliecloud, a .sif path for "
                              "apptainer, a registry ref for pyxis)")
        # each reaches a command line (Pyxis: the job script's srun line) as one argument
        one_line(self.image, key="container.image")
        for i, flag in enumerate(self.flags):
            one_line(flag, key=f"container.flags[{i}]")
        for i, mount in enumerate(self.mounts):
            self._check_mount(mount, key=f"container.mounts[{i}]")
        if self.runtime == ContainerRuntime.APPTAINER:
            for flag in self.flags:
                if flag.split("=")[0] in _CLEANENV:
                    raise ConfigError(f"container.flags: {flag!r} would drop the rank's "
                                      "environment, which carries its identity; expected flags "
                                      f"that keep it, remove {flag!r}")

    def _check_mount(self, mount: str, *, key: str) -> None:
        one_line(mount, key=key)
        if ":" not in mount or mount.startswith(":"):
            raise ConfigError(f"{key}: expected SRC:DST[:FLAGS], found {mount!r}; write e.g. "
                              "/lustre:/lustre")
        if self.runtime == ContainerRuntime.PYXIS and "," in mount:
            # --container-mounts is one comma-separated list: a comma would split this mount
            raise ConfigError(f"{key}: expected one SRC:DST[:FLAGS] mount, found {mount!r} "
                              "whose ',' would split it into two for --container-mounts; "
                              "write each mount as its own list item")

    @property
    def ranks_inside(self) -> bool:
        """Whether the ranks are started through the runtime (the agent stays on the host)."""
        return self.runtime in RANK_RUNTIMES

    def srun_flags(self) -> tuple[str, ...]:
        """Flags for the agents' ``srun`` (Pyxis), one argument each, unquoted; none for the
        other runtimes."""
        if self.runtime != ContainerRuntime.PYXIS:
            return ()
        mounts = (f"--container-mounts={','.join(self.mounts)}",) if self.mounts else ()
        return (f"--container-image={self.image}", *mounts, *self.flags)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as :func:`container_from_dict` reads it."""
        return {"runtime": self.runtime.value, "image": self.image, "mounts": list(self.mounts),
                "flags": list(self.flags), "gpus": self.gpus, "python": self.python}


_CONTAINER_KEYS = ("runtime", "image", "mounts", "flags", "gpus", "python")


def container_from_dict(raw: object, *, source: str) -> ContainerConfig | None:
    """Validate a site config's ``container:`` mapping (None: no container).

    Raises:
        ConfigError: naming ``source`` and the key.
    """
    raw = section_mapping(raw, key="container", keys=_CONTAINER_KEYS, source=source,
                          expected="a mapping with runtime and image")
    if raw is None:
        return None
    runtime = raw.get("runtime")
    if runtime not in {r.value for r in ContainerRuntime}:
        raise ConfigError(f"{source}: key 'container.runtime': expected "
                          f"{', '.join(r.value for r in ContainerRuntime)}, found {runtime!r}")
    lists = {k: str_tuple(f"container.{k}", raw.get(k), source) for k in ("mounts", "flags")}
    gpus = raw.get("gpus", True)
    if not isinstance(gpus, bool):
        raise ConfigError(f"{source}: key 'container.gpus': expected true/false, found {gpus!r}")
    image, python = raw.get("image"), raw.get("python")
    if not isinstance(image, str):
        raise ConfigError(f"{source}: key 'container.image': expected a string, found {image!r}")
    if python is not None and not (isinstance(python, str) and python.strip()):
        raise ConfigError(f"{source}: key 'container.python': expected the interpreter's path "
                          f"inside the image, found {python!r}")
    try:
        return ContainerConfig(runtime=ContainerRuntime(runtime), image=image, gpus=gpus,
                               python=python, **lists)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None



# -- the rank's command line ---------------------------------------------------------------------

def rank_binds(paths: Iterable[str | Path | None], mounts: Sequence[str] = ()) -> tuple[str, ...]:
    """The ``SRC:DST`` binds of a rank (pure): the site's ``mounts`` as written, then each path
    at its own place, except a path under another one or under a mount at its own place (that
    bind already holds it: a read-only image needs a mount point for each destination, and a
    site can mount a parent, e.g. a node-local tier whose path names the job)."""
    kept = [src.rstrip("/") for src, dst, *_ in (m.split(":") for m in mounts) if src == dst]
    own: list[str] = []
    for path in sorted({os.path.normpath(str(p)) for p in paths if p}):
        if path != "/" and not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
            own.append(path)
    return (*mounts, *(f"{p}:{p}" for p in own))


def rank_command(container: ContainerConfig | None, argv: Sequence[str], *,
                 binds: Sequence[str] = (), cwd: str | None = None) -> list[str]:
    """A rank's command line started through the container's runtime (pure); ``argv`` as it is
    without a container, or with one whose agents already run inside (Pyxis)."""
    if container is None or not container.ranks_inside:
        return list(argv)
    if container.runtime == ContainerRuntime.CHARLIECLOUD:
        cd = (f"--cd={cwd}",) if cwd else ()
        return ["ch-run", *(f"--bind={b}" for b in binds), *cd, *container.flags,
                container.image, "--", *argv]
    nv = ("--nv",) if container.gpus else ()
    pwd = ("--pwd", cwd) if cwd else ()
    return ["apptainer", "exec", *nv, *(f"--bind={b}" for b in binds), *pwd, *container.flags,
            container.image, *argv]


def render_container(container: ContainerConfig | None, srun_args: Sequence[str],
                     python: str, *, shell: bool = False) -> tuple[list[str], str]:
    """The agents' ``srun`` flags and interpreter command with ``container`` applied: Pyxis adds
    its flags; the agent's interpreter is the host's for every runtime.

    Args:
        shell: the flags go onto a shell line (the job script): each container flag is
            quoted as one word (:func:`~hpcrun.launch.scriptslots.option_word`), so a space or
            a ``;`` in an image or a mount cannot split it. Without it they stay argv items
            (submitit quotes its ``srun_args`` itself).
    """
    if container is None:
        return list(srun_args), python
    flags = container.srun_flags()
    if shell:
        flags = tuple(option_word(flag, key="container flag") for flag in flags)
    return [*srun_args, *flags], python


# -- checks ------------------------------------------------------------------------------------

def container_problems(container: ContainerConfig, *, backend: str,
                       which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Why ``container`` cannot start here (one line each; [] when it can).

    The image must be a readable directory (Charliecloud) or ``.sif`` file (Apptainer); a
    Pyxis reference is the registry's. The runtime's command is looked up on this host's PATH
    only for the local backend (on Slurm it is the compute nodes', which ``hpcrun preflight``
    run there checks).
    """
    out = _image_problems(container)
    command = COMMAND[container.runtime]
    if backend == Backend.LOCAL and container.ranks_inside and which(command) is None:
        out.append(f"container.runtime {container.runtime}: {command!r} is not on PATH; "
                   f"expected the {container.runtime} runtime installed here, install it or "
                   "put it on PATH")
    return out


def _image_problems(container: ContainerConfig) -> list[str]:
    image = Path(os.path.expanduser(container.image))
    if container.runtime == ContainerRuntime.CHARLIECLOUD:
        if not image.is_dir() or not os.access(image, os.R_OK | os.X_OK):
            return [f"container.image {container.image}: expected a readable image directory "
                    "(ch-convert IMAGE DIR), found none; build or unpack it there, or fix "
                    "the path"]
        if not (image / "bin").exists() and not (image / "usr").is_dir():
            return [f"container.image {container.image}: the directory has no /usr or /bin; "
                    "expected an unpacked image (ch-convert IMAGE DIR)"]
    if container.runtime == ContainerRuntime.APPTAINER and (
            not image.is_file() or not os.access(image, os.R_OK)):
        return [f"container.image {container.image}: expected a readable .sif file, found "
                "none; build it (apptainer build IMAGE.sif docker://...) or fix the path"]
    return []


@functools.cache
def package_digest() -> str:
    """``sha256:`` of this interpreter's hpcrun sources (:func:`~hpcrun.launch.codever.
    content_digest` of every ``.py`` file of the package, by relative path), read once per
    process (a warm process reads it before its hand-off)."""
    from hpcrun.launch.codever import content_digest

    root = Path(__file__).resolve().parents[1]
    return content_digest((str(p.relative_to(root)), p.read_bytes())
                          for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def host_environ() -> dict[str, str]:
    """What an agent gives a rank it starts in an image: its hpcrun version and digest."""
    from hpcrun.version import __version__

    return {HOST_VERSION_ENV: __version__, HOST_DIGEST_ENV: package_digest()}


def check_same_hpcrun(environ: Mapping[str, str], *, version: str, digest: str) -> None:
    """Refuse a rank whose hpcrun (``version``, ``digest``) is not its agent's (no-op without
    the agent's values: not started in an image).

    Raises:
        ConfigError: one line naming both sides.
    """
    host_v, host_d = environ.get(HOST_VERSION_ENV), environ.get(HOST_DIGEST_ENV)
    if host_v is None or host_d is None or (host_v, host_d) == (version, digest):
        return
    raise ConfigError(f"hpcrun in the container is {version} ({digest[:19]}) but the agent's "
                      f"is {host_v} ({host_d[:19]}); expected the same hpcrun on both sides: "
                      "install the agent's hpcrun in the image or bind it in (container.mounts)")


def root_mount(mountinfo: str) -> str:
    """The directory mounted at ``/`` (pure, ``/proc/self/mountinfo``'s text): ``/`` on the
    host, the image's directory inside ``ch-run``; the last such mount wins."""
    root = "/"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/":
            root = fields[3]
    return root

