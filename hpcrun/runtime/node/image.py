"""The image this node's ranks run in, when the site's container starts the ranks (Charliecloud,
Apptainer) and leaves the agent on the host.

The agent builds one :class:`RankImage` from its run: the binds (run directory, node-local tier,
code directory, the dataset's directories, the interpreter's environment when the image has no
interpreter of its own, the site's ``mounts``), the interpreter inside, and what a rank must
receive to check it runs the agent's hpcrun. Every rank, cold or warm, is started as
:meth:`RankImage.command` of its ``argv``
(:func:`hpcrun.launch.container.rank_command`). ``ch-run`` and ``apptainer exec`` exec the
command in place, so the agent's PID is the rank's and signals reach it unchanged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrun.launch.container import ContainerConfig, host_environ, rank_binds, rank_command

if TYPE_CHECKING:
    from hpcrun.control.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class RankImage:
    """How this node's ranks are started in the image."""

    container: ContainerConfig
    """The site's container (its runtime starts the ranks)."""
    python: str
    """The interpreter inside the image."""
    binds: tuple[str, ...] = ()
    """``SRC:DST`` binds, hpcrun's and the site's."""
    cwd: str | None = None
    """The ranks' working directory (the code directory)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """What every rank gets beside its own variables (the agent's hpcrun version and digest)."""

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started through the runtime."""
        return rank_command(self.container, argv, binds=self.binds, cwd=self.cwd)


def rank_image(container: ContainerConfig | None, spec: RunSpec, *, run_dir: Path,
               node_local_root: Path | None, environ: Mapping[str, str],
               python: str) -> RankImage | None:
    """This node's :class:`RankImage`; None when the ranks run on the host (no container, or
    Pyxis, whose agents are already inside)."""
    if container is None or not container.ranks_inside:
        return None
    code = environ.get("HPCRUN_CODE_PATH") or None
    paths: list[str | Path | None] = [run_dir, node_local_root, code, *data_roots(spec)]
    if container.python is None:
        paths += list(interpreter_paths(python, environ))
    return RankImage(container=container, python=container.python or python,
                     binds=rank_binds(_resolved(paths), container.mounts), cwd=code,
                     env=host_environ())


def rank_python(image: RankImage | None, python: str) -> str:
    """The ranks' interpreter: the image's, else the agent's own (``python``)."""
    return image.python if image is not None else python


def rank_argv(image: RankImage | None, python: str, argv: Sequence[str]) -> list[str]:
    """A rank's command line: ``-m MODULE`` runs under :func:`rank_python`, and the whole is
    started through the container's runtime when the ranks run in an image."""
    full = [rank_python(image, python), *argv] if argv[:1] == ["-m"] else list(argv)
    return image.command(full) if image is not None else full


def data_roots(spec: RunSpec) -> list[str]:
    """The dataset's directories: the manifest's and each source's (none without a manifest or
    when it cannot be read here: the rank reports that itself)."""
    from hpcrun.data.manifest import DatasetManifest, source_root
    from hpcrun.errors import DataError

    if not spec.data.manifest:
        return []
    path = Path(spec.data.manifest)
    try:
        manifest = DatasetManifest.from_json(path.read_bytes(), origin=str(path))
    except (OSError, ValueError, DataError):
        return [str(path.parent)]
    roots = [source_root([o.path for o in s.objects]) for s in manifest.sources if s.objects]
    return [str(path.parent), *roots]


def interpreter_paths(python: str, environ: Mapping[str, str]) -> Iterator[str]:
    """What the host interpreter needs inside the image: its environment (a venv and its base
    installation) and the ``PYTHONPATH`` entries."""
    yield str(Path(python).parent.parent)
    yield sys.prefix
    yield sys.base_prefix
    yield from (p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)


def _resolved(paths: Sequence[str | Path | None]) -> list[str]:
    """Each path where it leads, and as given unless it is itself a symlink (its target's bind
    holds it)."""
    out: list[str] = []
    for p in paths:
        if p:
            out += [str(Path(p).resolve()), *(() if Path(p).is_symlink() else (str(p),))]
    return out
