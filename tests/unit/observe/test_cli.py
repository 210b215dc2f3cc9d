"""The operator commands end to end on a real run directory (click's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from hpcrun.cli.main import cli
from tests.unit.observe.builders import make_run


@pytest.fixture
def runs(tmp_path: Path) -> tuple[CliRunner, Path]:
    make_run(tmp_path / "runs", terminal=False)
    return CliRunner(env={"HPCRUN_RUNS": str(tmp_path / "runs")}), tmp_path


def test_plan_reproduces_the_textbook_interval() -> None:
    out = CliRunner().invoke(cli, ["plan", "--ckpt-cost", "30s", "--mtbf", "6h",
                                   "--restore", "180s"])
    assert out.exit_code == 0, out.output
    assert "Young  T = sqrt(2·C·M) = 1138 s (18m 58s)" in out.output
    assert "chosen T = 1119 s (18m 39s)" in out.output
    assert "<- chosen" in out.output and "1h 0m" in out.output


def test_plan_with_rpo_and_bad_duration() -> None:
    out = CliRunner().invoke(cli, ["plan", "--ckpt-cost", "30s", "--mtbf", "6h", "--rpo", "5m"])
    assert "chosen T = 300 s (5m 0s)  [capped by RPO]" in out.output
    bad = CliRunner().invoke(cli, ["plan", "--ckpt-cost", "soon", "--mtbf", "6h"])
    assert bad.exit_code != 0


def test_status_text_and_json(runs: tuple[CliRunner, Path]) -> None:
    runner, _ = runs
    out = runner.invoke(cli, ["status", "demo-1", "--no-reconcile"])
    assert out.exit_code == 0, out.output
    for needle in ("RUNNING", "job 4242", "step 30", "c10 step 10 on node_local+shared",
                   "straggler: node n1 rank 3", "rank     3 n1", "read "):
        assert needle in out.output
    js = runner.invoke(cli, ["status", "demo-1", "--json", "--reconcile", "--timeout", "5"])
    body = json.loads(js.output)
    assert body["facts"]["step"] == 30 and body["reconcile"]["seconds"] >= 0
    assert body["read_s"] < 5
    every = runner.invoke(cli, ["status", "demo-1", "--no-reconcile", "--ranks", "all"])
    assert every.exit_code == 0, every.output
    assert [ln.split()[1] for ln in every.output.splitlines() if ln.startswith("rank ")] == [
        "0", "1", "2", "3"]
    assert runner.invoke(cli, ["status", "demo-1", "--ranks", "some"]).exit_code != 0


def test_list_and_logs(runs: tuple[CliRunner, Path]) -> None:
    runner, _ = runs
    listing = runner.invoke(cli, ["list"])
    assert "demo-1" in listing.output and "RUNNING" in listing.output
    logs = runner.invoke(cli, ["logs", "demo-1", "--rank", "2", "-n", "2"])
    assert logs.output.splitlines() == ["rank 2 step 29 loss 1.29", "rank 2 step 30 loss 1.30"]
    allr = runner.invoke(cli, ["logs", "demo-1", "-n", "1"])
    assert allr.output.splitlines()[0] == "[n0 rank 0] rank 0 step 30 loss 1.30"
    missing = runner.invoke(cli, ["logs", "demo-1", "--rank", "9"])
    assert missing.exit_code != 0


def test_report_export_and_show(runs: tuple[CliRunner, Path]) -> None:
    runner, tmp = runs
    rep = runner.invoke(cli, ["report", "demo-1", "-o", str(tmp / "r.html")])
    assert rep.exit_code == 0, rep.output
    assert (tmp / "r.html").read_text().count("data:image/png;base64,") == 7  # loss + six
    exp = runner.invoke(cli, ["export", "demo-1", "--prometheus", str(tmp / "prom")])
    assert exp.exit_code == 0, exp.output
    names = {f.name for f in text_string_to_metric_families(
        (tmp / "prom" / "hpcrun_demo-1.prom").read_text())}
    assert {"hpcrun_step_rate", "hpcrun_ettr_ratio", "hpcrun_checkpoint_age_seconds",
            "hpcrun_restarts", "hpcrun_input_wait_ratio"} <= names
    show = runner.invoke(cli, ["show", "demo-1", "--manifest"])
    assert show.exit_code != 0  # still running: no manifest yet


def test_unknown_run_is_one_clear_line(runs: tuple[CliRunner, Path]) -> None:
    runner, _ = runs
    out = runner.invoke(cli, ["status", "nope"])
    assert out.exit_code != 0
    assert "hpcrun list" in str(out.exception)


def test_metrics_of_a_run_that_reported_none_is_one_line_and_an_error(
        runs: tuple[CliRunner, Path]) -> None:
    from hpcrun.errors import RecordError

    runner, _ = runs
    out = runner.invoke(cli, ["metrics", "demo-1", "--csv"])
    assert out.exit_code != 0 and isinstance(out.exception, RecordError)  # main maps it
    assert "reported no numeric metric yet" in str(out.exception)
    assert "ctx.step_done(loss=" in str(out.exception)
