"""Alert sinks bound their peers: real HTTP servers on 127.0.0.1.

A webhook that answers one byte at a time is given up on within the delivery deadline (and the
delivery stays pending); credentials in the URL arrive as HTTP basic auth and are never printed;
a URL without a usable scheme, host or port is refused at load.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hpcrun.errors import ConfigError, DeliveryError
from hpcrun.launch.alertsinks import AlertSinks, redacted
from hpcrun.observe.notify import Delivery, FiredAlert, deliver_alerts, webhook_sender

ALERT = FiredAlert(run_id="r1", rule="no_progress", subject="", severity="warning",
                   message="no progress for 10 min")
DELIVERY = Delivery(key="r1/no_progress", incident=1, sink="webhook", alert=ALERT)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen_auth: list[str]
    trickle: bool


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen_auth.append(self.headers.get("Authorization", ""))
        if not self.server.trickle:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        with_timeout = time.monotonic() + 20  # bounded: the test never waits this long
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        while time.monotonic() < with_timeout:
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.seen_auth, srv.trickle = [], False
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server, creds: str = "") -> str:
    host, port = srv.server_address[:2]
    return f"http://{creds}{host}:{port}/hook"


def test_a_trickling_webhook_is_given_up_on_within_the_deadline(server: _Server,
                                                                tmp_path: Path) -> None:
    server.trickle = True
    send = webhook_sender(_url(server), timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(DeliveryError, match="no complete answer within 1 s"):
        send(DELIVERY)
    assert time.monotonic() - started < 3.0
    started = time.monotonic()
    lines = deliver_alerts(tmp_path, [ALERT], senders={"r1": {"webhook": send}}, runs=["r1"])
    assert time.monotonic() - started < 3.0
    assert lines == ["r1: alert no_progress NOT delivered to webhook (no complete answer "
                     "within 1 s); retried on the next pass"]


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_printed(
        server: _Server) -> None:
    url = _url(server, "alice:s3cr%40t@")
    webhook_sender(url)(DELIVERY)
    assert server.seen_auth == ["Basic " + base64.b64encode(b"alice:s3cr@t").decode()]
    assert "s3cr" not in redacted(url) and redacted(url).startswith("http://***@127.0.0.1:")
    with pytest.raises(ConfigError) as info:
        AlertSinks(webhook=url.replace("http://", "ftp://"))
    assert "s3cr" not in str(info.value) and "alice" not in str(info.value)


@pytest.mark.parametrize("bad", ["http://", "https:///path", "ftp://host/x", "http://host:0/",
                                 "http://host:99999/", "http://ho st/", "host/hook"])
def test_a_webhook_without_scheme_host_or_a_valid_port_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"alerts\.webhook"):
        AlertSinks(webhook=bad)


def test_a_good_webhook_is_kept() -> None:
    assert AlertSinks(webhook="https://hooks.example.org:8443/x?y=1").webhook is not None
