"""Admission: every check's verdict, with fakes for the runner and the storage seam."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpcrun.errors import AdmissionError, StorageError
from hpcrun.launch.admission import (
    CheckKind,
    Passed,
    ProbeTarget,
    Problem,
    Skipped,
    VerifyData,
    assemble,
    capped,
    entrypoint_findings,
    nearest_existing,
    node_local_prefix,
    sample_objects,
)
from hpcrun.launch.admit import (
    AdmissionRequest,
    admit,
    probe_data,
    probe_entrypoint,
    probe_writable,
)
from hpcrun.runner import CommandResult, SubprocessRunner
from hpcrun.storage import LocalStorage
from hpcrun.testing.fakes import FakeRunner
from hpcrun.testing.runs import tiny_spec, write_spec
from tests.unit.launch.admission_cases import (
    BROKEN,
    REPO_ROOT,
    broken_manifest,
    change_object,
    small_dataset,
)


def _spec(manifest: Path | None, **overrides: object) -> object:
    from hpcrun.control.spec import RunSpec

    raw = tiny_spec(manifest=manifest or Path("/unused"), **overrides)
    if manifest is None:
        raw["data"].pop("manifest")
    return RunSpec.from_dict(raw)


# -- the report ---------------------------------------------------------------------------------

def test_report_lists_every_problem_in_check_order_one_line_each() -> None:
    report = assemble([
        Problem(check=CheckKind.DATA, what="m.json holds a list", fix="rebuild it"),
        Passed(check=CheckKind.SPEC, what="valid"),
        Skipped(check=CheckKind.STORAGE, what="node-local not here"),
        Problem(check=CheckKind.ENTRYPOINT, what="module 'x' missing", expected="a module"),
    ])
    assert not report.ok
    assert [p.check for p in report.problems] == [CheckKind.ENTRYPOINT, CheckKind.DATA]
    err = report.refusal()
    assert isinstance(err, AdmissionError)
    lines = str(err).splitlines()
    assert "2 problems" in lines[0] and "nothing was created" in lines[0]
    assert lines[1:] == ["  entrypoint: module 'x' missing; expected a module",
                         "  data: m.json holds a list; rebuild it"]
    assert [ln.split()[0] for ln in report.render().splitlines()] == [
        "ok", "PROBLEM", "PROBLEM", "skipped"]
    assert assemble([Passed(check=CheckKind.SPEC, what="valid")]).ok


def test_many_problems_of_one_kind_are_capped_with_a_count() -> None:
    many = [Problem(check=CheckKind.DATA, what=f"object {i} missing") for i in range(25)]
    shown = capped(many, noun="object problems", limit=20)
    assert len(shown) == 21 and shown[-1].what == "... and 5 more object problems like those above"
    assert capped(many[:3], noun="x") == many[:3]


# -- pure decisions -----------------------------------------------------------------------------

def test_sample_is_deterministic_bounded_and_independent_of_manifest_order() -> None:
    objects = [(f"/d/obj{i:03d}", 100) for i in range(50)]
    a = sample_objects(objects, VerifyData.SAMPLE, key="ds-1")
    assert len(a) == 8 and a == sample_objects(objects[::-1], VerifyData.SAMPLE, key="ds-1")
    assert a != sample_objects(objects, VerifyData.SAMPLE, key="ds-2")
    assert sample_objects(objects, VerifyData.ALL, key="ds-1") == {p for p, _ in objects}
    assert sample_objects(objects, VerifyData.NONE, key="ds-1") == frozenset()
    big = [(f"/d/big{i}", 3 << 30) for i in range(4)]
    assert len(sample_objects(big, VerifyData.SAMPLE, key="k")) == 1  # one always fits
    mixed = [(f"/d/m{i}", (512 << 20) if i % 2 else 10) for i in range(20)]
    chosen = sample_objects(mixed, VerifyData.SAMPLE, key="k", budget=(2 << 30) + 100)
    assert sum(n for p, n in mixed if p in chosen) <= (2 << 30) + 100 and len(chosen) == 8


def test_node_local_prefix_stops_at_the_first_job_variable() -> None:
    env = {"USER": "alice", "HOME": "/home/alice"}
    assert node_local_prefix("/local/nvme/$USER/hpcrun/${SLURM_JOB_ID}", env) == Path(
        "/local/nvme/alice/hpcrun")
    assert node_local_prefix("~/.cache/hpcrun/node-local", env) == Path(
        "/home/alice/.cache/hpcrun/node-local")
    assert node_local_prefix("/scratch/$TMPDIR_UNSET/x", env) == Path("/scratch")
    assert node_local_prefix("$SLURM_TMPDIR/hpcrun", env) is None


def test_nearest_existing_is_where_creating_the_path_starts() -> None:
    present = {Path("/"), Path("/a")}
    assert nearest_existing(Path("/a/b/c"), lambda p: p in present) == Path("/a")
    assert nearest_existing(Path("/x/y"), lambda p: p in present) == Path("/")


def test_entrypoint_probe_answers_mean_what_they_say() -> None:
    target = ProbeTarget(python="/opt/py", code_path="/repo")
    ok = '{"m.train": {"found": true, "via": "path"}, "hpcrun": {"found": true, "via": "path"}}'
    assert all(isinstance(f, Passed) for f in entrypoint_findings(
        "m.train", target, returncode=0, stdout=ok, stderr=""))
    missing = ('{"m.trian": {"found": false, "via": "import", "missing": "m.trian"}, '
               '"hpcrun": {"found": false, "via": "import", "missing": "hpcrun"}}')
    mod, own = entrypoint_findings("m.trian", target, returncode=0, stdout=missing, stderr="")
    assert isinstance(mod, Problem) and "'m.trian' is not importable by /opt/py" in mod.line()
    assert isinstance(own, Problem) and "hpcrun is not importable" in own.line()
    parent = '{"m.x": {"found": null, "error": "RuntimeError: no GPU"}, "hpcrun": {"found": true}}'
    first = entrypoint_findings("m.x", target, returncode=0, stdout=parent, stderr="")[0]
    assert isinstance(first, Skipped) and "RuntimeError: no GPU" in first.what
    [crash] = entrypoint_findings("m", target, returncode=1, stdout="",
                                  stderr="SyntaxError: invalid syntax")
    assert isinstance(crash, Problem) and "SyntaxError" in crash.what


# -- entrypoint probe, with the real interpreter ------------------------------------------------

def _code_tree(root: Path) -> Path:
    """A package whose ``__init__`` leaves a marker if it is ever executed."""
    pkg = root / "code" / "lab"
    (pkg / "models").mkdir(parents=True)
    marker = root / "executed"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "models" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (pkg / "models" / "train.py").write_text("raise SystemExit('module body ran')\n")
    return root / "code"


def test_entrypoint_found_without_running_any_user_code(tmp_path: Path) -> None:
    code = _code_tree(tmp_path)
    target = ProbeTarget(python=sys.executable, code_path=str(code))
    found = probe_entrypoint("lab.models.train:main", target, runner=SubprocessRunner(),
                             env={"PYTHONPATH": str(REPO_ROOT)})
    assert [type(f) for f in found] == [Passed, Passed], found
    assert not (tmp_path / "executed").exists()  # no __init__ ran, nor the module


def test_entrypoint_typo_is_a_problem_naming_the_module_and_the_code_path(tmp_path: Path) -> None:
    code = _code_tree(tmp_path)
    target = ProbeTarget(python=sys.executable, code_path=str(code))
    found = probe_entrypoint("lab.models.trian:main", target, runner=SubprocessRunner(),
                             env={"PYTHONPATH": str(REPO_ROOT)})
    problem = found[0]
    assert isinstance(problem, Problem)
    assert f"'lab.models.trian' is not importable by {sys.executable} with {code}" in problem.what
    outside = probe_entrypoint("examples.tiny_lm.train:main", target, runner=SubprocessRunner(),
                               env={"PYTHONPATH": ""})
    assert isinstance(outside[0], Problem)  # the job's code directory is not the repository


def test_entrypoint_interpreter_missing_is_skipped_not_refused() -> None:
    def missing(argv: object) -> CommandResult:
        from hpcrun.errors import SchedulerError

        raise SchedulerError("command not found: '/nope/python'; install it or put it on PATH")

    target = ProbeTarget(python="/nope/python", code_path="/repo")
    [note] = probe_entrypoint("m:main", target, runner=FakeRunner({"/nope/python": missing}),
                              env={})
    assert isinstance(note, Skipped) and "cannot be run on this node" in note.what


# -- data ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_manifest_is_one_problem_line(tmp_path: Path, kind: str) -> None:
    bad = broken_manifest(small_dataset(tmp_path), kind)
    [problem] = probe_data(_spec(bad), VerifyData.SAMPLE)  # type: ignore[arg-type]
    assert isinstance(problem, Problem) and problem.check is CheckKind.DATA
    assert BROKEN[kind] in problem.what and str(bad) in problem.what
    assert "\n" not in problem.line()


def test_changed_and_missing_objects_are_all_reported(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path)
    changed = change_object(manifest)
    gone = sorted((tmp_path / "src").iterdir())[-1]
    gone.unlink()
    found = probe_data(_spec(manifest), VerifyData.ALL)  # type: ignore[arg-type]
    lines = [f.line() for f in found]
    assert all(isinstance(f, Problem) for f in found) and len(found) == 2, lines
    assert any(str(changed) in ln and "changed: expected digest" in ln for ln in lines)
    assert any(str(gone) in ln and "missing" in ln for ln in lines)


def test_verify_data_none_opens_no_object_and_sample_hashes_a_bounded_set(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path, n=12)
    change_object(manifest)  # same size: only a full hash sees it
    none = probe_data(_spec(manifest), VerifyData.NONE)  # type: ignore[arg-type]
    assert [type(f) for f in none] == [Skipped] and "--verify-data none" in none[0].what
    sampled = probe_data(_spec(manifest), VerifyData.SAMPLE)  # type: ignore[arg-type]
    every = probe_data(_spec(manifest), VerifyData.ALL)  # type: ignore[arg-type]
    assert isinstance(every[0], Problem)
    if isinstance(sampled[0], Passed):  # the changed object was not among the 8 sampled
        assert "12 objects present, 8 hashed in full" in sampled[0].what
    assert sampled == probe_data(_spec(manifest), VerifyData.SAMPLE)  # type: ignore[arg-type]


def test_pinned_dataset_id_must_match_the_manifest(tmp_path: Path) -> None:
    manifest = small_dataset(tmp_path)
    spec = _spec(manifest, data={"dataset_id": "ds-0000"})
    found = probe_data(spec, VerifyData.NONE)  # type: ignore[arg-type]
    assert isinstance(found[0], Problem) and "pins data.dataset_id ds-0000" in found[0].what


# -- storage ------------------------------------------------------------------------------------

class RefusingStorage(LocalStorage):
    """The local disk, except that nothing may be created (a read-only or foreign directory)."""

    def create_exclusive(self, path: os.PathLike[str] | str, data: bytes) -> bool:
        raise StorageError(f"create {path!r} failed") from PermissionError(13, "Permission denied")


def test_writable_probe_leaves_nothing_and_names_an_unwritable_directory(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "deeper"
    assert isinstance(probe_writable("runs root", target), Passed)
    assert list(tmp_path.iterdir()) == []  # nothing created, the probe file removed
    refused = probe_writable("runs root", target, storage=RefusingStorage())
    assert isinstance(refused, Problem)
    assert f"cannot create files in {tmp_path} (Permission denied)" in refused.line()
    (tmp_path / "file").write_text("")
    under_file = probe_writable("runs root", tmp_path / "file" / "runs")
    assert isinstance(under_file, Problem) and str(tmp_path / "file") in under_file.what


def _request(tmp_path: Path, spec: Path, **kw: object) -> AdmissionRequest:
    return AdmissionRequest(spec_path=spec, code_path=REPO_ROOT, python=sys.executable,
                            user="alice", runs_root=str(tmp_path / "runs"),
                            **kw)  # type: ignore[arg-type]


def test_admit_on_a_slurm_site_checks_names_and_skips_what_is_not_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    import yaml

    (sites / "cluster.yaml").write_text(yaml.safe_dump(
        {"name": "cluster", "backend": "slurm", "shared_path": str(tmp_path / "shared"),
         "node_local_path": "/nonexistent-nvme/$USER/${SLURM_JOB_ID}", "partition": "gpu-typo",
         "account": "proj-ml", "qos": "long"}))
    monkeypatch.setenv("HPCRUN_SITE_CONFIGS", str(sites))
    spec = write_spec(tmp_path / "run.yaml",
                      tiny_spec(manifest=small_dataset(tmp_path), site="cluster"))
    golden = Path(__file__).parent / "golden"
    runner = FakeRunner({
        sys.executable: lambda argv: SubprocessRunner().run(argv, env={"PYTHONPATH":
                                                                       str(REPO_ROOT)}),
        "sinfo": (golden / "sinfo_partitions_documented.txt").read_text(),
        "sacctmgr --noheader --parsable2 show associations":
            (golden / "sacctmgr_associations_documented.txt").read_text(),
        "sacctmgr --noheader --parsable2 show qos":
            (golden / "sacctmgr_qos_documented.txt").read_text()})
    result = admit(_request(tmp_path, spec, have_sbatch=True),
                   environ={"USER": "alice", "HOME": str(tmp_path)}, runner=runner)
    assert result.backend == "slurm"
    lines = [p.line() for p in result.report.problems]
    assert lines == ["scheduler: partition 'gpu-typo' does not exist on this cluster; expected "
                     "one of batch, debug, gpu, high; set resources.partition in the spec (or "
                     "partition in the site config)"]
    assert any("node-local tier" in s.what and "/nonexistent-nvme/alice does not exist" in s.what
               for s in result.report.skipped)
    assert ("sacctmgr", "--noheader", "--parsable2", "show", "associations", "user=alice",
            "format=Account,Partition,QOS") in runner.calls
    assert not (tmp_path / "runs").exists()


def test_admit_reports_a_bad_spec_and_still_checks_the_site(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "run.yaml", {"name": "x", "entrypoint": "m:main",
                                              "site": "no-such-site", "resoures": {}})
    result = admit(_request(tmp_path, spec), environ={}, runner=FakeRunner())
    checks = [p.check for p in result.report.problems]
    assert checks == [CheckKind.SPEC, CheckKind.SITE], result.report.render()
    assert "resoures" in result.report.problems[0].what
    assert "unknown site 'no-such-site'" in result.report.problems[1].what
    assert result.spec is None and result.site is None
