"""Deliver alerts: each new alert reaches the site's sinks once, a failed delivery is retried.

``hpcrun watch`` evaluates the alert rules of every unfinished run on each pass
(:func:`run_alerts`) and calls :func:`deliver_alerts`. An alert is identified by (run, rule,
subject); it is one *incident* from the pass that first sees it until a pass no longer does,
and a later return is a new incident. Each incident is delivered once per sink. The delivery
state is a small JSON file (:data:`STATE_FILE` in the runs root), written atomically; passes that
run at once (cron, an ``--interval`` loop, one per run) take turns on it under a file lock next to
it, so none overwrites another's deliveries and none sends what another is sending. A sink that
fails is logged and retried on the next pass, and never stops the pass or the other sinks.
Each delivery runs in its own thread and the pass waits for all of them for one
:data:`DELIVERY_DEADLINE_S` in total: N slow sinks cost one deadline, not N; one that has not
answered by then is left pending for the next pass.

:func:`plan_deliveries` is pure; :func:`deliver_alerts` does the I/O through injected senders.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from hpcrun.errors import DeliveryError
from hpcrun.runner import CommandRunner
from hpcrun.storage import LOCAL_STORAGE, Storage

__all__ = [
    "DELIVERY_DEADLINE_S",
    "STATE_FILE",
    "STATE_LOCK_TIMEOUT_S",
    "Delivery",
    "FiredAlert",
    "Sender",
    "deliver_alerts",
    "email_sender",
    "parse_alert",
    "plan_deliveries",
    "run_alerts",
    "webhook_sender",
]

_LOG = logging.getLogger(__name__)

STATE_FILE = ".alerts-state.json"
"""Delivery state, in the runs root."""
STATE_SCHEMA_VERSION = 1
STATE_LOCK_TIMEOUT_S = 60.0
"""Longest a pass waits for another pass to finish delivering before it leaves its alerts to the
next pass."""
_MESSAGE_RE = re.compile(r"^\[(?P<severity>\w+)\] (?P<kind>\w+)(?: \((?P<subject>[^)]*)\))?:")


@dataclass(frozen=True, kw_only=True, slots=True)
class FiredAlert:
    """An alert a pass saw firing."""

    run_id: str
    """The run."""
    rule: str
    """The rule's kind (``no_progress``)."""
    subject: str
    """What it is about (a fault signature), or ""."""
    severity: str
    """``info``, ``warning`` or ``critical``."""
    message: str
    """The one-line alert, as ``hpcrun status`` shows it."""

    @property
    def key(self) -> str:
        return f"{self.run_id}|{self.rule}|{self.subject}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """One incident to send to one sink."""

    key: str
    """The alert's identity."""
    incident: int
    """Its incident number (1 for the first time it fired)."""
    sink: str
    """``webhook`` or ``email``."""
    alert: FiredAlert
    """What to send."""

    def text(self) -> str:
        return f"hpcrun run {self.alert.run_id}: {self.alert.message}"


def parse_alert(run_id: str, message: str) -> FiredAlert | None:
    """A status alert line as a :class:`FiredAlert` (None when it is not one)."""
    m = _MESSAGE_RE.match(message)
    if m is None:
        return None
    return FiredAlert(run_id=run_id, rule=m["kind"], subject=m["subject"] or "",
                      severity=m["severity"], message=message)


def plan_deliveries(state: Mapping[str, Any], fired: Iterable[FiredAlert], *,
                    sinks: Mapping[str, Sequence[str]],
                    runs: Iterable[str]) -> tuple[dict[str, Any], list[Delivery]]:
    """The next delivery state and what to send now (pure).

    Args:
        state: the previous state (``{"alerts": {key: {...}}}``).
        fired: alerts firing now, in the ``runs`` this pass evaluated.
        sinks: the sinks of each run (``{run_id: ["webhook", "email"]}``).
        runs: the runs this pass evaluated; an alert of one of them that no longer fires ends
            its incident; alerts of other runs are left as they are.
    """
    alerts = {k: dict(v) for k, v in dict(state.get("alerts", {})).items()}
    now = {a.key: a for a in fired}
    seen_runs = set(runs)
    for key, entry in alerts.items():
        if entry.get("active") and key not in now and key.split("|", 1)[0] in seen_runs:
            entry["active"] = False
    todo = []
    for key, alert in now.items():
        entry = alerts.get(key) or {"incident": 0, "active": False}
        if not entry["active"]:
            entry = {"incident": int(entry["incident"]) + 1, "active": True, "delivered": []}
        entry["message"] = alert.message
        alerts[key] = entry
        for sink in sinks.get(alert.run_id, ()):
            if sink not in entry["delivered"]:
                todo.append(Delivery(key=key, incident=entry["incident"], sink=sink,
                                     alert=alert))
    return {"schema_version": STATE_SCHEMA_VERSION, "alerts": alerts}, todo


def mark_delivered(state: dict[str, Any], delivery: Delivery) -> None:
    """Record that ``delivery`` reached its sink (in place)."""
    entry = state["alerts"][delivery.key]
    if entry["incident"] == delivery.incident and delivery.sink not in entry["delivered"]:
        entry["delivered"].append(delivery.sink)


Sender = Callable[[Delivery], None]
"""Sends one delivery; raises on failure."""


DELIVERY_DEADLINE_S = 10.0
"""Longest one delivery may take, end to end: a sink that answers slowly (or one byte at a
time) is given up on and retried on the next pass; it never holds the watch command longer."""


def webhook_sender(url: str, *, timeout_s: float = DELIVERY_DEADLINE_S) -> Sender:
    """POST a Slack/Mattermost-compatible JSON body (``text``, plus the alert's fields).

    Credentials in the URL (``https://user:pass@host/...``) go as HTTP basic auth, never in the
    request line and never in a message; the whole request, answer included, is bounded by
    ``timeout_s``."""
    target, auth = _split_credentials(url)

    def send(d: Delivery) -> None:
        body = json.dumps({"text": d.text(), "run_id": d.alert.run_id, "rule": d.alert.rule,
                           "subject": d.alert.subject, "severity": d.alert.severity,
                           "incident": d.incident}).encode()
        headers = {"Content-Type": "application/json", **auth}
        request = urllib.request.Request(target, data=body, method="POST", headers=headers)
        status = _within(timeout_s, lambda: _post(request, timeout_s))
        if status >= 300:
            raise DeliveryError(f"webhook answered HTTP {status}")

    return send


def _split_credentials(url: str) -> tuple[str, dict[str, str]]:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, {}
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    bare = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    return urllib.parse.urlunsplit(bare), {"Authorization": f"Basic {token}"}


def _post(request: urllib.request.Request, timeout_s: float) -> int:
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()
        return int(response.status)


def _within(seconds: float, call: Callable[[], int]) -> int:
    """``call()``'s result, or DeliveryError once ``seconds`` have passed (the call is left to
    its own socket timeouts in a daemon thread)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    worker = threading.Thread(target=run, name="hpcrun-alert", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise DeliveryError(f"no complete answer within {seconds:.0f} s")
    if "error" in box:
        raise DeliveryError(str(box["error"])) from box["error"]
    return int(box["value"])


def email_sender(addresses: Sequence[str], *, runner: CommandRunner) -> Sender:
    """Mail through the local ``sendmail -t``."""
    def send(d: Delivery) -> None:
        mail = (f"To: {', '.join(addresses)}\nSubject: [hpcrun {d.alert.severity}] "
                f"{d.alert.run_id}: {d.alert.rule}\n\n{d.text()}\n")
        result = runner.run(["sendmail", "-t"], input=mail, timeout=30)
        if result.returncode != 0:
            raise DeliveryError(f"sendmail exited {result.returncode}: "
                                f"{result.stderr.strip()[:200]}")

    return send


def deliver_alerts(runs_root: Path, fired: Iterable[FiredAlert], *,
                   senders: Mapping[str, Mapping[str, Sender]], runs: Iterable[str],
                   storage: Storage = LOCAL_STORAGE,
                   deadline_s: float = DELIVERY_DEADLINE_S) -> list[str]:
    """Send every undelivered incident to its sinks; return one line per outcome.

    ``senders`` maps each run to its sinks' senders (``{run_id: {"webhook": send}}``). The
    deliveries run at once, each in its own thread, and all of them together get
    ``deadline_s``; a failing sender, or one still sending at the deadline, is logged and its
    delivery stays pending for the next pass.
    """
    path = Path(runs_root) / STATE_FILE
    lock = FileLock(path.with_name(STATE_FILE + ".lock"), timeout=STATE_LOCK_TIMEOUT_S,
                    mode=0o600)
    try:
        with lock:  # read, send, write: one pass at a time
            return _deliver_under_lock(path, fired, senders=senders, runs=runs, storage=storage,
                                       deadline_s=deadline_s)
    except Timeout:
        return [f"alerts not delivered: another pass has held {lock.lock_file} for over "
                f"{STATE_LOCK_TIMEOUT_S:.0f} s; the next pass delivers them"]


def _deliver_under_lock(path: Path, fired: Iterable[FiredAlert], *,
                        senders: Mapping[str, Mapping[str, Sender]], runs: Iterable[str],
                        storage: Storage, deadline_s: float) -> list[str]:
    state, todo = plan_deliveries(_read_state(path, storage), fired, runs=runs,
                                  sinks={r: list(s) for r, s in senders.items()})
    errors = _send_all([(senders[d.alert.run_id][d.sink], d) for d in todo],
                      deadline_s=deadline_s)
    lines = []
    for d, exc in zip(todo, errors, strict=True):
        if exc is not None:  # any sink failure: logged, retried next pass
            _LOG.warning("alert %s (incident %d) not delivered to %s: %s", d.key, d.incident,
                         d.sink, exc)
            lines.append(f"{d.alert.run_id}: alert {d.alert.rule} NOT delivered to {d.sink} "
                         f"({exc}); retried on the next pass")
            continue
        mark_delivered(state, d)
        lines.append(f"{d.alert.run_id}: alert {d.alert.rule} delivered to {d.sink}")
    storage.write_atomic(path, json.dumps(state, sort_keys=True, indent=1).encode())
    return lines


def _send_all(sends: Sequence[tuple[Sender, Delivery]], *,
             deadline_s: float) -> list[BaseException | None]:
    """Run each send in its own daemon thread; wait ``deadline_s`` in total for all of them.

    Returns, in order, None for a send that completed and its error for one that raised; one
    still running at the deadline gets a :class:`DeliveryError` (its thread is left to its own
    socket timeouts, and never holds the caller or the interpreter's exit).
    """
    done: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()
    for i, (send, delivery) in enumerate(sends):
        threading.Thread(target=_send_one, args=(i, send, delivery, done), daemon=True,
                         name=f"hpcrun-alert-{i}").start()
    late = DeliveryError(f"no complete answer within {deadline_s:.0f} s")
    errors: list[BaseException | None] = [late] * len(sends)
    end = time.monotonic() + deadline_s
    for _ in sends:  # one result per send at most
        try:
            i, error = done.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            break
        errors[i] = error
    return errors


def _send_one(i: int, send: Sender, delivery: Delivery,
              done: queue.SimpleQueue[tuple[int, BaseException | None]]) -> None:
    try:
        send(delivery)
    except Exception as exc:  # handed to the waiting pass
        done.put((i, exc))
        return
    done.put((i, None))


def _read_state(path: Path, storage: Storage) -> dict[str, Any]:
    if not storage.exists(path):
        return {}
    try:
        state = json.loads(storage.read_bytes(path))
    except (OSError, ValueError) as exc:
        _LOG.warning("alert state %s unreadable (%s); starting afresh", path, exc)
        return {}
    return state if isinstance(state, dict) else {}


def run_alerts(run_dir: Path, *, now: float | None = None) -> list[FiredAlert]:
    """The alerts firing for a run now (its status view's alerts)."""
    from hpcrun.observe.collect import collect_status, spec_rpo

    view = collect_status(run_dir, now=now, rpo_s=spec_rpo(run_dir), every_rank=False).view
    parsed = (parse_alert(Path(run_dir).name, m) for m in view.alerts)
    return [a for a in parsed if a is not None]
