"""Node-local and run directories: another user's, others-writable or symlinked ones are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.errors import UnsafeDirectoryError
from hpcrun.safedirs import ensure_private_dir

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's directory "
                                "needs root (chown)")


def test_a_missing_directory_is_created_private(tmp_path: Path) -> None:
    made = ensure_private_dir(tmp_path / "local" / "n0", what="node-local directory",
                              check_ancestors=True)
    assert made.is_dir() and made.stat().st_uid == os.getuid()
    assert made.stat().st_mode & 0o077 == 0


@needs_root
def test_a_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "hpcrun-alice"
    planted.mkdir()
    os.chown(planted, OTHER_UID, -1)
    with pytest.raises(UnsafeDirectoryError, match=r"node-local directory .*hpcrun-alice is "
                       r"owned by nobody \(uid 65534\), not by"):
        ensure_private_dir(planted, what="node-local directory")


def test_a_world_writable_directory_without_sticky_bit_is_refused(tmp_path: Path) -> None:
    wide = tmp_path / "wide"
    wide.mkdir()
    os.chmod(wide, 0o777)
    with pytest.raises(UnsafeDirectoryError, match="writable by group or others without the "
                       "sticky bit"):
        ensure_private_dir(wide, what="run directory")
    os.chmod(wide, 0o1777)  # sticky: others cannot rename what is ours
    assert ensure_private_dir(wide, what="run directory") == wide


def test_a_symlink_in_the_node_local_path_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeDirectoryError, match=r"node-local directory .*link is a symlink"):
        ensure_private_dir(tmp_path / "link", what="node-local directory", check_ancestors=True)
    with pytest.raises(UnsafeDirectoryError, match=r"an ancestor of the node-local directory "
                       r".*link is a symlink"):
        ensure_private_dir(tmp_path / "link" / "n0", what="node-local directory",
                           check_ancestors=True)
    assert not (real / "n0").exists()  # refused before anything was created through it


def test_an_ancestor_others_can_rename_in_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    if os.geteuid() == 0:
        os.chown(shared, OTHER_UID, -1)
    with pytest.raises(UnsafeDirectoryError, match="an ancestor of the node-local directory"):
        ensure_private_dir(shared / "n0", what="node-local directory", check_ancestors=True)


@needs_root
def test_a_run_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "r-1"
    planted.mkdir()
    os.chown(planted, OTHER_UID, -1)
    spec = RunSpec.from_dict({"name": "t", "entrypoint": "m:f"})
    with pytest.raises(UnsafeDirectoryError, match=r"run directory .*r-1 is owned by nobody"):
        create_run(tmp_path, spec, run_id="r-1")
    assert not (planted / "spec.json").exists()
