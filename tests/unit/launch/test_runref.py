"""One name for a run: the pure resolver on listings, and the shell on real directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrun.control.entries import JobPayload
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import RunLog
from hpcrun.control.record import create_run
from hpcrun.control.spec import RunSpec
from hpcrun.control.sweep import SweepIndex, SweepPoint, write_sweep_index
from hpcrun.errors import ConfigError, RecordError, RunReferenceError
from hpcrun.launch.runref import (
    RefKind,
    RunEntry,
    RunsListing,
    RunsRoot,
    backend_of,
    expand_runs,
    link_into_primary_root,
    match_reference,
    resolve_reference,
    resolve_run_dir,
    run_backend,
    run_dirs,
    runs_roots,
)
from hpcrun.launch.site import load_site, save_site_snapshot
from hpcrun.vocab import Backend

ROOT = RunsRoot(path=Path("/runs"), source="$HPCRUN_RUNS")
IDS = ("tiny-lm-20261201-101500-ab12", "tiny-lm-20261201-101500-cd34",
       "tiny-lm-20261202-090000-ef56", "gpt-20261201-120000-0a0b")


def _listing(*names: str, root: RunsRoot = ROOT,
             sweeps: tuple[str, ...] = ()) -> RunsListing:
    entries = [RunEntry(name=n, path=root.path / n, kind=RefKind.RUN) for n in names]
    entries += [RunEntry(name=n, path=root.path / n, kind=RefKind.SWEEP) for n in sweeps]
    return RunsListing(roots=(root,), entries=tuple(entries))


# -- the pure core ------------------------------------------------------------------------------

def test_an_exact_id_and_a_unique_prefix_each_name_one_run() -> None:
    listing = _listing(*IDS)
    assert match_reference(IDS[3], listing).path == Path("/runs") / IDS[3]
    assert match_reference("gpt", listing).name == IDS[3]
    assert match_reference("tiny-lm-20261202", listing).name == IDS[2]


def test_an_exact_id_wins_over_the_longer_ids_it_begins() -> None:
    listing = _listing("demo-1", "demo-10", "demo-11")
    assert match_reference("demo-1", listing).name == "demo-1"


def test_an_ambiguous_prefix_lists_the_candidates_and_how_to_pick_one() -> None:
    with pytest.raises(RunReferenceError) as err:
        match_reference("tiny-lm-20261201", _listing(*IDS))
    msg = str(err.value)
    assert "\n" not in msg and "'tiny-lm-20261201' is ambiguous" in msg
    assert IDS[0] in msg and IDS[1] in msg and IDS[2] not in msg
    assert "give more of the id" in msg


def test_an_ambiguous_prefix_shows_five_candidates_and_counts_the_rest() -> None:
    names = [f"run-{i:02d}" for i in range(8)]
    with pytest.raises(RunReferenceError) as err:
        match_reference("run-", _listing(*names))
    msg = str(err.value)
    assert all(n in msg for n in names[:5]) and names[5] not in msg
    assert "begins 8 run ids" in msg and "and 3 more" in msg


def test_the_same_id_under_two_roots_asks_for_the_path() -> None:
    other = RunsRoot(path=Path("/lustre/me/runs"), source="site 'hpc'")
    listing = RunsListing(roots=(ROOT, other), entries=(
        RunEntry(name="demo-1", path=ROOT.path / "demo-1", kind=RefKind.RUN),
        RunEntry(name="demo-1", path=other.path / "demo-1", kind=RefKind.RUN)))
    with pytest.raises(RunReferenceError, match=r"2 runs are called 'demo-1'.*/lustre/me/runs"):
        match_reference("demo-1", listing)


def test_no_match_names_every_root_searched_and_how_to_set_one() -> None:
    site = RunsRoot(path=Path("/lustre/me/runs"), source="site 'hpc'")
    listing = RunsListing(roots=(ROOT, site), entries=_listing(*IDS).entries)
    with pytest.raises(RunReferenceError) as err:
        match_reference("bert", listing)
    msg = str(err.value)
    assert "no run or sweep 'bert'" in msg and "\n" not in msg
    assert "/runs ($HPCRUN_RUNS)" in msg and "/lustre/me/runs (site 'hpc')" in msg
    assert "$HPCRUN_RUNS" in msg and "$HPCRUN_SITE" in msg and "hpcrun list" in msg


def test_a_path_names_its_directory_and_a_missing_path_is_not_looked_up() -> None:
    at = RunEntry(name="x", path=Path("/elsewhere/x"), kind=RefKind.RUN)
    assert match_reference("/elsewhere/x", _listing("x"), at_path=at) is at
    with pytest.raises(RunReferenceError, match=r"no run at \./x: expected a directory holding"):
        match_reference("./x", _listing("x"))


def test_an_empty_reference_is_refused() -> None:
    with pytest.raises(RunReferenceError, match="empty run reference"):
        match_reference(" ", _listing(*IDS))


def test_a_prefix_of_a_sweep_id_names_the_sweep_not_its_points() -> None:
    sweep = "tiny-sweep-20261201-101500-aa11"
    listing = _listing(f"{sweep}-000", f"{sweep}-001", sweeps=(sweep,))
    got = match_reference("tiny-sweep", listing)
    assert (got.name, got.kind) == (sweep, RefKind.SWEEP)
    assert match_reference(f"{sweep}-001", listing).kind is RefKind.RUN
    with pytest.raises(RunReferenceError, match="ambiguous"):  # a sweep and an unrelated run
        match_reference("tiny", _listing(f"{sweep}-000", "tiny-lm-1", sweeps=(sweep,)))


def test_a_runs_backend_is_its_newest_jobs_else_its_sites() -> None:
    assert backend_of(("1", "local-9"), {"1": "slurm", "local-9": "local"},
                      Backend.SLURM) is Backend.LOCAL
    assert backend_of(("77",), {}, Backend.LOCAL) is Backend.SLURM  # jobs default to slurm
    assert backend_of((), {}, Backend.LOCAL) is Backend.LOCAL
    with pytest.raises(RecordError, match="backend 'pbs'"):
        backend_of(("5",), {"5": "pbs"}, Backend.SLURM)


# -- the shell, on real directories -------------------------------------------------------------

def _run(root: Path, run_id: str) -> Path:
    return create_run(root, RunSpec(name="tiny", entrypoint="examples.tiny_lm.train:main"),
                      run_id=run_id)


def _site(configs: Path, name: str, shared: Path) -> None:
    configs.mkdir(parents=True, exist_ok=True)
    (configs / f"{name}.yaml").write_text(
        f"name: {name}\nbackend: local\nnode_local_path: {shared.parent / 'nl'}\n"
        f"shared_path: {shared}\n")


def test_hpcrun_runs_pins_the_only_root(tmp_path: Path) -> None:
    roots = runs_roots({"HPCRUN_RUNS": str(tmp_path / "r"), "HPCRUN_SITE": "local"})
    assert [(r.path, r.source) for r in roots] == [(tmp_path / "r", "$HPCRUN_RUNS")]


def test_without_hpcrun_runs_the_sites_shared_paths_are_the_roots(tmp_path: Path) -> None:
    _site(tmp_path / "sites", "mine", tmp_path / "shared")
    (tmp_path / "sites" / "broken.yaml").write_text("name: [\n")
    env = {"HOME": str(tmp_path / "home"), "USER": "me",
           "HPCRUN_SITE_CONFIGS": str(tmp_path / "sites")}
    roots = runs_roots(env)
    assert roots[0].path == tmp_path / "home" / "hpcrun-runs"  # the local site, first
    assert roots[0].source == "site 'local'"
    assert tmp_path / "shared" in [r.path for r in roots]
    assert Path("/lustre/me/hpcrun-runs") in [r.path for r in roots]  # a shipped Slurm site
    pinned = runs_roots({**env, "HPCRUN_SITE": "mine"})
    assert [(r.path, r.source) for r in pinned] == [(tmp_path / "shared", "$HPCRUN_SITE=mine")]
    with pytest.raises(ConfigError, match="unknown site 'nosuch'"):
        runs_roots({**env, "HPCRUN_SITE": "nosuch"})


def test_a_run_is_found_by_id_prefix_and_path_under_its_sites_root(tmp_path: Path) -> None:
    _site(tmp_path / "sites", "mine", tmp_path / "shared")
    env = {"HOME": str(tmp_path / "home"), "USER": "me",
           "HPCRUN_SITE_CONFIGS": str(tmp_path / "sites")}
    run = _run(tmp_path / "shared", IDS[0])
    _run(tmp_path / "shared", IDS[1])
    assert resolve_run_dir(IDS[0], environ=env) == run.resolve()
    assert resolve_run_dir(IDS[0][:-2], environ=env) == run.resolve()
    assert resolve_run_dir(str(run), environ={}) == run.resolve()  # a path needs no root
    with pytest.raises(RunReferenceError, match="ambiguous"):
        resolve_run_dir("tiny-lm", environ=env)
    assert run_dirs(env) and set(run_dirs(env)) == {run.resolve(),
                                                     (tmp_path / "shared" / IDS[1]).resolve()}


def test_a_sweep_expands_to_its_points_and_a_run_only_command_names_them(
        tmp_path: Path) -> None:
    root = tmp_path / "runs"
    sweep_id = "tiny-sweep-20261201-101500-aa11"
    points = [_run(root, f"{sweep_id}-{i:03d}") for i in range(2)]
    (root / sweep_id).mkdir()
    write_sweep_index(root / sweep_id, SweepIndex(sweep_id=sweep_id, backend="local", points=tuple(
        SweepPoint(index=i, run_id=p.name, overrides={}) for i, p in enumerate(points))))
    env = {"HPCRUN_RUNS": str(root)}
    entry = resolve_reference("tiny-sweep", environ=env)
    assert (entry.kind, entry.path) == (RefKind.SWEEP, (root / sweep_id).resolve())
    assert expand_runs(sweep_id, environ=env) == [p.resolve() for p in points]
    assert expand_runs(f"{sweep_id}-001", environ=env) == [points[1].resolve()]
    with pytest.raises(RunReferenceError, match=f"is a sweep.*{sweep_id}-000, {sweep_id}-001"):
        resolve_run_dir(sweep_id, environ=env)


def test_a_linked_run_counts_once(tmp_path: Path) -> None:
    run = _run(tmp_path / "elsewhere", IDS[0])
    env = {"HPCRUN_RUNS": str(tmp_path / "runs")}
    link = link_into_primary_root(run, environ=env)
    assert link == tmp_path / "runs" / IDS[0] and link.resolve() == run.resolve()
    assert resolve_run_dir("tiny", environ=env) == run.resolve()
    assert link_into_primary_root(link.resolve().parent / IDS[0], environ={
        "HPCRUN_RUNS": str(tmp_path / "elsewhere")}) is None  # already under a root


def test_a_runs_backend_comes_from_its_record_then_its_site_snapshot(tmp_path: Path) -> None:
    run = _run(tmp_path, "r-1")
    save_site_snapshot(run, load_site("local"))
    assert run_backend(run) is Backend.LOCAL  # no job yet: the site's
    RunLog(run).append_entry(JobPayload(job_id="4242", backend=Backend.SLURM),
                             generation=UNFENCED, holder="")
    assert run_backend(run) is Backend.SLURM  # submitted with --backend slurm
    assert json.loads((run / "site.json").read_text())["backend"] == "local"
