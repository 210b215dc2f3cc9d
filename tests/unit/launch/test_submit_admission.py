"""``hpcrun submit`` of a bad input exits non-zero, prints every problem, and creates nothing.

Each case runs the real CLI in a subprocess on the local site, from the repository root (so
``examples.tiny_lm.train`` is importable), with ``$HPCRUN_RUNS`` and ``$HOME`` (the local
site's node-local tier) inside the test's directory.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpcrun.testing.runs import hpcrun, tiny_spec, write_spec
from tests.unit.launch.admission_cases import (
    BROKEN,
    REPO_ROOT,
    broken_manifest,
    change_object,
    small_dataset,
)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _submit(tmp: Path, spec: dict[str, Any], *args: str,
            command: str = "submit") -> subprocess.CompletedProcess[str]:
    path = write_spec(tmp / "run.yaml", spec)
    backend = ["--backend", "local"] if command == "submit" else []
    return hpcrun(command, str(path), *backend, *args, cwd=REPO_ROOT,
                  env={"HPCRUN_RUNS": str(tmp / "runs"), "HOME": str(tmp / "home"),
                       "PYTHONPATH": str(REPO_ROOT)})


def _refused(out: subprocess.CompletedProcess[str], *expected: str) -> list[str]:
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr
    problems = [ln.strip() for ln in out.stderr.splitlines() if ln.startswith("  ")]
    assert "nothing was created" in out.stderr and len(problems) == len(expected), out.stderr
    for text, line in zip(expected, problems, strict=True):
        assert text in line, (text, line)
    return problems


CASES = {
    "entrypoint-typo": ({"entrypoint": "examples.tiny_lm.trian:main"},
                        "entrypoint: entrypoint module 'examples.tiny_lm.trian' is not importable"),
    "unknown-site": ({"site": "no-such-site"}, "site: unknown site 'no-such-site'"),
    "spec-key-typo": ({"checkpoint": {"evry_steps": 5}}, "spec: "),
    "nccl-without-gpus": ({"dist": {"backend": "nccl"}},
                          "site: dist.backend is nccl but site 'local' has no GPUs "
                          "(gpus_per_node: 0); NCCL needs a GPU per rank; set dist.backend: gloo"),
    "pmix-on-the-local-backend": ({"dist": {"rank_launcher": "pmix"}},
                                  "site: dist.rank_launcher is pmix but the run's backend is "
                                  "local: `srun --mpi=pmix` needs Slurm"),
    "negative-spares": ({"resources": {"spare_nodes": -1}},
                        "run.yaml: resources.spare_nodes: expected an integer >= 0"),
    "min-nodes-above-nodes": ({"membership": {"mode": "elastic", "min_nodes": 3}},
                              "run.yaml: membership.min_nodes: expected <= "
                              "resources.nodes (2)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_spec_or_site_is_refused_before_anything_exists(tmp_path: Path, case: str) -> None:
    overrides, line = CASES[case]
    spec = tiny_spec(manifest=small_dataset(tmp_path / "data"), **overrides)
    before = _tree(tmp_path)
    _refused(_submit(tmp_path, spec), line)
    assert _tree(tmp_path) == sorted([*before, "run.yaml"])  # only the spec we wrote


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_manifest_is_refused_before_anything_exists(tmp_path: Path, kind: str) -> None:
    bad = broken_manifest(small_dataset(tmp_path / "data"), kind)
    _refused(_submit(tmp_path, tiny_spec(manifest=bad)), f"data: {bad}")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "home").exists()


def test_changed_objects_are_refused_and_every_problem_is_listed(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path / "data")
    changed = change_object(manifest)
    (tmp_path / "blocker").write_text("")  # a file where the runs root's parent should be
    spec = tiny_spec(manifest=manifest, entrypoint="examples.tiny_lm.trian:main")
    out = _submit(tmp_path, spec, "--runs-root", str(tmp_path / "blocker" / "runs"))
    problems = _refused(out, "entrypoint: ", f"data: data object {changed}",
                        f"storage: runs root (shared tier): cannot create files in "
                        f"{tmp_path / 'blocker'}")
    assert "changed: expected digest" in problems[1]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "home").exists()


def test_dry_run_runs_the_same_checks(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path / "data")
    good = _submit(tmp_path, tiny_spec(manifest=manifest), "--dry-run", "--verify-data", "all")
    assert good.returncode == 0, good.stderr
    assert "local backend: 2 node(s)" in good.stdout
    for check in ("spec:", "site:", "entrypoint:", "data:", "storage:"):
        assert any(ln.startswith("ok") and check in ln for ln in good.stderr.splitlines()), check
    assert not (tmp_path / "runs").exists()
    bad = _submit(tmp_path, tiny_spec(manifest=broken_manifest(manifest, "json-list")),
                  "--dry-run")
    _refused(bad, "data: ")


def test_hpcrun_sbatch_is_refused_the_same_way(tmp_path: Path) -> None:
    bad = broken_manifest(small_dataset(tmp_path / "data"), "empty-object")
    _refused(_submit(tmp_path, tiny_spec(manifest=bad), command="sbatch"), "data: ")
    assert not (tmp_path / "runs").exists()


def test_verify_data_none_submits_past_a_changed_object(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path / "data")
    change_object(manifest)
    out = _submit(tmp_path, tiny_spec(manifest=manifest), "--dry-run", "--verify-data", "none")
    assert out.returncode == 0, out.stderr
    assert "hpcrun: not checked: data: objects of ds-" in out.stderr
