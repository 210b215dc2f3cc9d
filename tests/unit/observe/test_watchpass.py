"""A watch pass's alerts go out off the reconcile path: every delivery at once, one deadline for
all of them, against a real HTTP server on 127.0.0.1 that answers one byte a second."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hpcrun.launch.alertsinks import AlertSinks
from hpcrun.observe.watchpass import start_alert_round
from hpcrun.testing.fakes import FakeRunner
from tests.unit.observe.builders import make_run

DEADLINE_S = 3.0
"""The round's deadline here; three deliveries one after another would take three of them."""


class _Trickle(ThreadingHTTPServer):
    daemon_threads = True
    expected: int
    posts: int
    all_arrived: threading.Event
    stop: threading.Event
    guard: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    server: _Trickle

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.guard:
            self.server.posts += 1
            if self.server.posts == self.server.expected:
                self.server.all_arrived.set()
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):  # one byte a second until the test ends (bounded)
            if self.server.stop.wait(1.0):
                return
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return


@pytest.fixture
def trickle() -> Iterator[_Trickle]:
    srv = _Trickle(("127.0.0.1", 0), _Handler)
    srv.expected, srv.posts, srv.guard = 0, 0, threading.Lock()
    srv.all_arrived, srv.stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.stop.set()
    srv.shutdown()
    srv.server_close()


def test_several_alerts_to_a_trickling_webhook_end_within_one_deadline(
        trickle: _Trickle, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = make_run(runs)  # checkpoint_lag, no_progress and rank_tail fire now
    host, port = trickle.server_address[:2]
    sinks = AlertSinks(webhook=f"http://{host!s}:{port}/hook")
    trickle.expected = 3

    started = time.monotonic()
    round_ = start_alert_round([run], runs_root=runs, sinks_of=lambda _: sinks,
                               runner=FakeRunner(), deadline_s=DEADLINE_S)
    assert not round_.done.is_set()  # returned at once: the next pass is not held
    assert trickle.all_arrived.wait(DEADLINE_S)  # all three in flight together
    lines = round_.wait(timeout=3 * DEADLINE_S)
    elapsed = time.monotonic() - started

    assert lines is not None and elapsed < 2 * DEADLINE_S  # one deadline, not three
    assert sorted(lines) == [
        f"demo-1: alert {rule} NOT delivered to webhook (no complete answer within 3 s); "
        "retried on the next pass" for rule in ("checkpoint_lag", "no_progress", "rank_tail")]
