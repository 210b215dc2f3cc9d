"""Where a site's alerts go (``alerts:`` in a site config): a webhook and/or email.

``webhook`` receives a JSON POST whose ``text`` is the alert (Slack and Mattermost incoming
webhooks read that field); ``email`` addresses get a short mail through the local ``sendmail``
when the login node has one. Delivery itself is :mod:`hpcrun.observe.notify`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from hpcrun.errors import ConfigError

__all__ = ["AlertSinks", "alert_sinks_from_dict", "check_webhook", "redacted"]

_KEYS = ("webhook", "email")


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertSinks:
    """Destinations of a site's alerts."""

    webhook: str | None = None
    """``http(s)://`` URL receiving a JSON POST per new alert (Slack/Mattermost-compatible)."""
    email: tuple[str, ...] = ()
    """Addresses mailed through ``sendmail`` (skipped, with a note, where it is missing)."""

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_webhook(self.webhook)
        for address in self.email:
            if "@" not in address or any(c.isspace() for c in address):
                raise ConfigError(f"alerts.email: expected mail addresses, found {address!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as :func:`alert_sinks_from_dict` reads it."""
        return {"webhook": self.webhook, "email": list(self.email)}


def redacted(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``: what messages may print."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def check_webhook(url: str) -> None:
    """A webhook URL must be ``http(s)://host[:port]/...`` (credentials allowed: sent as HTTP
    basic auth, never printed).

    Raises:
        ConfigError: another scheme, no host, a bad port, or whitespace/control characters.
    """
    shown = redacted(url)
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigError(f"alerts.webhook: {shown!r} holds whitespace or a control character; "
                          "expected one URL")
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigError(f"alerts.webhook: expected an http:// or https:// URL with a host "
                          f"(and a port 1-65535, if any), found {shown!r}")


def alert_sinks_from_dict(raw: object, *, source: str) -> AlertSinks | None:
    """Validate a site config's ``alerts:`` mapping (None: alerts are only shown by status).

    Raises:
        ConfigError: naming ``source`` and the key.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not set(raw) <= set(_KEYS):
        raise ConfigError(f"{source}: key 'alerts': expected a mapping with keys among "
                          f"{', '.join(_KEYS)}, found {raw!r}")
    webhook, email = raw.get("webhook"), raw.get("email") or []
    if isinstance(email, str):
        email = [email]
    if (webhook is not None and not isinstance(webhook, str)) or not isinstance(email, list) \
            or not all(isinstance(e, str) for e in email):
        raise ConfigError(f"{source}: key 'alerts': webhook is a URL string and email a list "
                          f"of addresses, found {raw!r}")
    try:
        return AlertSinks(webhook=webhook, email=tuple(email))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
