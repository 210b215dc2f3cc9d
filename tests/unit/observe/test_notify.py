"""Alerts delivered: each new incident once per sink, a failing sink retried, never fatal."""

from __future__ import annotations

import json
import logging
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from filelock import FileLock

from hpcrun.cli.main import cli
from hpcrun.launch.alertsinks import AlertSinks
from hpcrun.launch.site import load_site, save_site_snapshot
from hpcrun.observe import notify
from hpcrun.observe.notify import (
    STATE_FILE,
    Delivery,
    FiredAlert,
    deliver_alerts,
    parse_alert,
    plan_deliveries,
    run_alerts,
)
from tests.unit.observe.builders import make_run


def fired(rule: str = "no_progress", run: str = "r1", subject: str = "") -> FiredAlert:
    return FiredAlert(run_id=run, rule=rule, subject=subject, severity="critical",
                      message=f"[critical] {rule}: 1000 > 900; owner hpcrun: look")


def test_an_incident_is_delivered_once_and_a_return_is_a_new_incident() -> None:
    sinks = {"r1": ["webhook"]}
    state, todo = plan_deliveries({}, [fired()], sinks=sinks, runs=["r1"])
    assert [(d.incident, d.sink) for d in todo] == [(1, "webhook")]
    state["alerts"][todo[0].key]["delivered"].append("webhook")
    state, todo = plan_deliveries(state, [fired()], sinks=sinks, runs=["r1"])
    assert todo == []  # still the same incident, already delivered
    state, todo = plan_deliveries(state, [], sinks=sinks, runs=["r1"])  # it cleared
    state, todo = plan_deliveries(state, [fired()], sinks=sinks, runs=["r1"])
    assert [d.incident for d in todo] == [2]


def test_a_run_not_evaluated_keeps_its_incident_open() -> None:
    state, _ = plan_deliveries({}, [fired(run="r2")], sinks={"r2": []}, runs=["r2"])
    state, _ = plan_deliveries(state, [], sinks={}, runs=["r1"])
    assert state["alerts"]["r2|no_progress|"]["active"] is True


def test_status_lines_parse_into_rule_and_subject() -> None:
    a = parse_alert("r1", "[critical] repeated_fault (crash:oom): 3 > 2; owner user: fix it")
    assert a is not None and (a.rule, a.subject, a.severity) == (
        "repeated_fault", "crash:oom", "critical")
    assert parse_alert("r1", "not an alert") is None


class Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []
    fail = False

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if Hook.fail:
            self.send_response(500)
        else:
            Hook.received.append(json.loads(body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    Hook.received, Hook.fail = [], False
    server = HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/abc"
    server.shutdown()


def test_the_watch_pass_delivers_a_runs_alerts_to_the_site_webhook_once(
        tmp_path: Path, webhook: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hpcrun watch` on a run whose gang stopped progressing: the site's webhook gets one
    Slack-compatible POST per alert; a second pass sends nothing; a down webhook is retried."""
    runs = tmp_path / "runs"
    run = make_run(runs)  # steps stopped at t=1030: no_progress fires now
    from dataclasses import replace

    save_site_snapshot(run, replace(load_site("testbed"), alerts=AlertSinks(webhook=webhook)))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))  # the reconcile pass itself fails
    runner = CliRunner(env={"HPCRUN_RUNS": str(runs)})

    Hook.fail = True
    first = runner.invoke(cli, ["watch", "demo-1"])
    assert "reconcile failed" in first.output and first.exit_code != 0
    assert "NOT delivered to webhook" in first.output and Hook.received == []

    Hook.fail = False
    runner.invoke(cli, ["watch", "demo-1"])
    rules = {m["rule"] for m in Hook.received}
    assert "no_progress" in rules and len(Hook.received) == len(rules)
    body = next(m for m in Hook.received if m["rule"] == "no_progress")
    assert body["text"].startswith("hpcrun run demo-1: [critical] no_progress")
    assert (body["run_id"], body["incident"]) == ("demo-1", 1)

    runner.invoke(cli, ["watch", "demo-1"])
    assert len(Hook.received) == len(rules)  # nothing new: nothing sent again


def test_a_failing_sink_does_not_stop_the_others(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    alerts = run_alerts(run)
    sent: list[Delivery] = []

    def broken(d: Delivery) -> None:
        raise ConnectionRefusedError("connection refused")

    lines = deliver_alerts(tmp_path, alerts, runs=["demo-1"],
                           senders={"demo-1": {"webhook": broken, "email": sent.append}})
    assert sent and all(d.sink == "email" for d in sent)
    assert any("NOT delivered to webhook (connection refused)" in line for line in lines)
    again = deliver_alerts(tmp_path, alerts, runs=["demo-1"],
                           senders={"demo-1": {"webhook": broken, "email": sent.append}})
    assert len(sent) == len(alerts)  # email delivered once; only the webhook is retried
    assert all("NOT delivered to webhook" in line for line in again)


class _Waits(logging.Handler):
    """Sets ``event`` when a file lock was found taken (filelock's debug record)."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.DEBUG)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "not acquired" in record.getMessage():
            self.event.set()


def test_two_passes_at_once_keep_each_others_deliveries(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Pass A is sending when pass B starts: B waits for A's state (never reads the state A
    is about to replace), and the state ends with both runs' deliveries, each sent once."""
    b_waits_or_ended = threading.Event()
    sending, sent, lock_modes = threading.Event(), list[str](), list[int]()
    lock_path = tmp_path / (STATE_FILE + ".lock")

    def slow(d: Delivery) -> None:
        lock_modes.append(stat.S_IMODE(lock_path.stat().st_mode) if lock_path.exists() else -1)
        sending.set()
        b_waits_or_ended.wait(30)
        sent.append(d.key)

    def pass_b() -> None:
        deliver_alerts(tmp_path, [fired(run="b")], runs=["b"],
                       senders={"b": {"webhook": lambda d: sent.append(d.key)}})
        b_waits_or_ended.set()

    caplog.set_level(logging.DEBUG, logger="filelock")
    handler = _Waits(b_waits_or_ended)
    logging.getLogger("filelock").addHandler(handler)
    try:
        a = threading.Thread(target=deliver_alerts, args=(tmp_path, [fired(run="a")]),
                             kwargs={"runs": ["a"], "senders": {"a": {"webhook": slow}}})
        a.start()
        assert sending.wait(30)
        b = threading.Thread(target=pass_b)
        b.start()
        a.join(30)
        b.join(30)
    finally:
        logging.getLogger("filelock").removeHandler(handler)
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert {k: v["delivered"] for k, v in state["alerts"].items()} == {
        "a|no_progress|": ["webhook"], "b|no_progress|": ["webhook"]}
    assert sent == ["a|no_progress|", "b|no_progress|"]
    assert lock_modes == [0o600]  # the lock file sits next to the state, owner-only


def test_a_pass_that_cannot_get_the_lock_leaves_its_alerts_to_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "STATE_LOCK_TIMEOUT_S", 0.2)
    sent: list[Delivery] = []
    with FileLock(tmp_path / (STATE_FILE + ".lock")):  # a pass stuck on a slow sink
        lines = deliver_alerts(tmp_path, [fired()], runs=["r1"],
                               senders={"r1": {"webhook": sent.append}})
    assert sent == [] and not (tmp_path / STATE_FILE).exists()
    assert len(lines) == 1 and "the next pass delivers them" in lines[0]
    deliver_alerts(tmp_path, [fired()], runs=["r1"], senders={"r1": {"webhook": sent.append}})
    assert [d.key for d in sent] == ["r1|no_progress|"]
