"""Dependencies: --after parsing and planning, the rendered flag, and a dependent run whose
upstream failed ending CANCELLED through a watch pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.control.depend import (
    After,
    AfterKind,
    Upstream,
    parse_after,
    plan_dependency,
)
from hpcrun.control.entries import DependencyNote
from hpcrun.control.fencing import UNFENCED
from hpcrun.control.log import EntryKind, RunLog
from hpcrun.control.reconcile import Cancel, MarkState, ReconcilePolicy, reconcile
from hpcrun.control.record import RunRecord, create_run, read_record
from hpcrun.control.spec import RunSpec
from hpcrun.control.watch import watch_once
from hpcrun.errors import SpecError
from hpcrun.launch.sbatch import render_sbatch, sbatch_args
from hpcrun.launch.site import load_site
from hpcrun.scheduler.slurm import Observation, SlurmClient, SlurmJobState
from hpcrun.testing import FakeClock
from hpcrun.vocab import Backend, RunState
from tests.unit.control.fake_cluster import FakeCluster, Job

NOW = 1_700_000_000.0


def rec(run_id: str, state: RunState, jobs: tuple[str, ...] = ("101",)) -> RunRecord:
    return RunRecord(run_id=run_id, spec_id="s", state=state, job_ids=jobs,
                     job_backends={j: Backend.SLURM for j in jobs})


def test_after_forms_and_one_clear_error_for_a_bad_one() -> None:
    assert parse_after("train-1") == After(run="train-1", kind=AfterKind.OK)
    assert parse_after("train-1:any") == After(run="train-1", kind=AfterKind.ANY)
    assert str(parse_after("train-1:ok")) == "train-1:ok"
    with pytest.raises(SpecError, match="expected RUN, RUN:ok or RUN:any"):
        parse_after("train-1:maybe")


def test_the_dependency_waits_for_live_upstreams_only() -> None:
    ups = [Upstream(after=parse_after("a"), records=(rec("a", RunState.RUNNING, ("7", "9")),)),
           Upstream(after=parse_after("b:any"), records=(rec("b", RunState.PENDING, ("8",)),)),
           Upstream(after=parse_after("c"), records=(rec("c", RunState.SUCCEEDED),))]
    assert plan_dependency(ups) == "afterok:9,afterany:8"
    done = [Upstream(after=parse_after("d:any"), records=(rec("d", RunState.FAILED),))]
    assert plan_dependency(done) is None


def test_an_upstream_that_already_failed_is_refused_before_submitting() -> None:
    ups = [Upstream(after=parse_after("a"), records=(rec("a", RunState.FAILED),))]
    with pytest.raises(SpecError, match="run a already ended FAILED, so afterok can never be "
                                        "satisfied; nothing was submitted"):
        plan_dependency(ups)
    local = [Upstream(after=parse_after("l"), records=(rec("l", RunState.RUNNING, ()),))]
    with pytest.raises(SpecError, match="has no Slurm job to wait for"):
        plan_dependency(local)


def test_the_flag_is_rendered_into_the_job_script() -> None:
    spec = RunSpec.from_dict({"name": "eval", "entrypoint": "m:f"})
    site = load_site("testbed")
    flags = dict(sbatch_args(spec, site, run_dir=Path("/r"), op_id="o",
                             dependency="afterok:42"))
    assert flags["dependency"] == "afterok:42" and "array" not in flags
    script = render_sbatch(spec, site, run_dir=Path("/r"), op_id="o", dependency="afterany:7")
    assert "#SBATCH --dependency=afterany:7\n" in script
    assert "--dependency" not in render_sbatch(spec, site, run_dir=Path("/r"), op_id="o")


def test_reconcile_cancels_a_run_whose_dependency_can_never_be_met() -> None:
    record = RunRecord(run_id="eval-1", spec_id="s", job_ids=("55",), after=("train-1:ok",))
    obs = Observation(job_id="55", state=SlurmJobState.PENDING,
                      reason="DependencyNeverSatisfied", source="squeue")
    actions = reconcile(record, obs, NOW, ReconcilePolicy())
    assert [type(a) for a in actions] == [MarkState, Cancel]
    mark = actions[0]
    assert isinstance(mark, MarkState) and mark.state == RunState.CANCELLED
    assert mark.reason.startswith("DependencyNeverSatisfied: job 55 waits for train-1:ok")
    waiting = Observation(job_id="55", state=SlurmJobState.PENDING, reason="Dependency",
                          source="squeue")
    assert reconcile(record, waiting, NOW, ReconcilePolicy()) == []


def test_a_watch_pass_ends_the_dependent_run_cancelled_with_the_reason(tmp_path: Path) -> None:
    run_dir = create_run(tmp_path, RunSpec.from_dict({"name": "eval", "entrypoint": "m:f"}),
                         run_id="eval-1")
    log = RunLog(run_dir)
    log.append_entry(DependencyNote(after=("train-1:ok",), flag="afterok:101"),
                     generation=UNFENCED, holder="")
    log.append(EntryKind.JOB, generation=-1, holder="", payload={"job_id": "202"})
    cluster = FakeCluster()
    cluster.jobs["202"] = Job(state="PENDING", reason="DependencyNeverSatisfied")
    watch_once(run_dir, SlurmClient(cluster), FakeClock(NOW))
    record = read_record(run_dir)
    assert record.state == RunState.CANCELLED and record.after == ("train-1:ok",)
    assert "DependencyNeverSatisfied" in str((record.state_info or {}).get("reason"))
    assert cluster.count("scancel") == 1


def test_submit_after_a_run_that_does_not_exist_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcrun.cli.main import main

    runs = tmp_path / "runs"
    monkeypatch.setenv("HPCRUN_RUNS", str(runs))
    spec = tmp_path / "eval.yaml"
    spec.write_text("name: eval\nentrypoint: m:f\n")
    with pytest.raises(SystemExit) as exited:
        main(["submit", str(spec), "--after", "train-nope:ok", "--runs-root", str(runs)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code != 0 and len(err) == 1
    assert err[0].startswith("hpcrun: error: --after train-nope: no run or sweep 'train-nope'")
    assert err[0].endswith("nothing was submitted")
    assert not runs.exists() or not any(runs.iterdir())


def _run(root: Path, run_id: str, state: RunState | None = None) -> Path:
    run_dir = create_run(root, RunSpec.from_dict({"name": "x", "entrypoint": "m:f"}),
                         run_id=run_id)
    if state is not None:
        log = RunLog(run_dir)
        fence = log.claim("a")
        log.publish(EntryKind.STATE, generation=fence.generation, holder=fence.holder,
                    payload={"state": state.value, "reason": "test"})
    return run_dir


@pytest.mark.parametrize(("upstream", "kind", "cancelled"), [
    (RunState.FAILED, "ok", True), (RunState.SUCCEEDED, "ok", False),
    (RunState.FAILED, "any", False), (RunState.CANCELLED, "ok", True)])
def test_the_first_start_cancels_a_run_whose_upstream_did_not_succeed(
        tmp_path: Path, upstream: RunState, kind: str, cancelled: bool) -> None:
    from hpcrun.runtime.node.upstream import cancel_if_upstream_broken

    up = _run(tmp_path, "train-1", upstream)
    down = _run(tmp_path, "eval-1")
    log = RunLog(down)
    log.append_entry(DependencyNote(after=(f"train-1:{kind}",), dirs=(str(up),)),
                     generation=UNFENCED, holder="")
    fence = log.claim("agent")
    assert cancel_if_upstream_broken(down, log, generation=fence.generation,
                                     holder=fence.holder) is cancelled
    record = read_record(down)
    if cancelled:
        reason = str((record.result or {}).get("reason"))
        assert record.state == RunState.CANCELLED
        assert reason == (f"DependencyNeverSatisfied: upstream train-1:ok ended "
                          f"{upstream.value}, so the dependency can never be met; the run is "
                          "cancelled")
    else:
        assert record.state == RunState.PENDING
