"""The code a run executes: a project outside git is read, hashed and snapshotted at submit."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.control.spec import CodeVersion
from hpcrun.errors import SpecError
from hpcrun.launch import codever
from hpcrun.launch.codever import (
    SNAPSHOT_DIR,
    code_version,
    content_digest,
    no_snapshot_warning,
    read_project,
    write_snapshot,
)


def _project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("def main(ctx):\n    pass\n")
    (root / "run.yaml").write_text("name: x\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "data").mkdir()
    (root / "data" / "doc.npy").write_bytes(b"\x93NUMPY" + bytes(100))  # data, not code
    (root / "snapshot.pt").write_bytes(bytes(10))
    (root / "big.json").write_bytes(b"[" + b"0," * (1 << 20) + b"0]")  # over the size cap
    (root / ".git-like").mkdir()
    (root / ".git-like" / "hook.py").write_text("hidden\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")
    (root / "venv" / "lib").mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "venv" / "lib" / "site.py").write_text("env\n")
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "runs" / "r1" / "spec.json").write_text("{}\n")
    return root


def test_the_digest_covers_paths_and_bytes_in_any_order() -> None:
    files = [("a.py", b"1"), ("b/c.py", b"2")]
    assert content_digest(files) == content_digest(reversed(files))
    assert content_digest(files) != content_digest([("a.py", b"1"), ("b/c.py", b"3")])
    assert content_digest(files) != content_digest([("a2.py", b"1"), ("b/c.py", b"2")])
    assert content_digest(files).startswith("sha256:") and len(content_digest(files)) == 71


def test_a_project_snapshot_holds_its_code_and_leaves_data_and_environments_out(
        tmp_path: Path) -> None:
    root = _project(tmp_path / "proj")
    snap = read_project(root, exclude=(root / "runs",))
    assert [rel for rel, _ in snap.files] == ["pkg/model.py", "run.yaml", "train.py"]
    assert snap.refused is None and snap.digest == content_digest(snap.files)
    write_snapshot(snap, tmp_path / "run" / SNAPSHOT_DIR)
    copied = sorted(p.relative_to(tmp_path / "run" / SNAPSHOT_DIR).as_posix()
                    for p in (tmp_path / "run" / SNAPSHOT_DIR).rglob("*") if p.is_file())
    assert copied == ["pkg/model.py", "run.yaml", "train.py"]
    assert (tmp_path / "run" / SNAPSHOT_DIR / "train.py").read_bytes() == \
        (root / "train.py").read_bytes()


def test_the_spec_names_the_snapshot_by_its_digest(tmp_path: Path) -> None:
    snap = read_project(_project(tmp_path / "proj"))
    code = code_version(None, False, snap)
    assert (code.commit, code.dirty, code.snapshot, code.content) == \
        (None, False, SNAPSHOT_DIR, snap.digest)
    git = code_version("abc1234", False, None)
    assert (git.snapshot, git.content) == (None, None)  # a clean git tree: the commit says it
    with pytest.raises(SpecError, match="content"):
        CodeVersion(content="sha256:nothex", snapshot=SNAPSHOT_DIR)
    with pytest.raises(SpecError, match="content"):
        CodeVersion(content=snap.digest)  # a digest without the snapshot it names


def test_a_project_too_large_is_not_snapshotted_and_submit_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codever, "MAX_PROJECT_FILES", 2)
    snap = read_project(_project(tmp_path / "proj"))
    assert snap.files == () and snap.digest is None
    assert code_version(None, False, snap) == CodeVersion()
    warning = no_snapshot_warning(snap)
    assert warning is not None and "not a git repository" in warning
    assert "a requeue runs whatever is on disk then" in warning and "4 code files" in warning
    assert no_snapshot_warning(None) is None
