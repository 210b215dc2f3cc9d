"""The run log and event writer an SDC guard under test writes to: both keep what they get."""

from __future__ import annotations

from typing import Any


class RecordingLog:
    def __init__(self) -> None:
        self.entries: list[Any] = []

    def append_entry(self, payload: Any, **kw: Any) -> None:
        self.entries.append(payload)

    publish_entry = append_entry


class RecordingEvents:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, dict[str, Any]]] = []

    def emit(self, kind: str, step: int, **data: Any) -> None:
        self.seen.append((kind, step, data))
