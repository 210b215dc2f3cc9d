"""The HTML report: parses, and every plot is an embedded PNG of real content."""

from __future__ import annotations

import base64
import struct
from html.parser import HTMLParser
from pathlib import Path

from hpcrun.observe.report import build_report, write_report
from hpcrun.observe.status import RecordFacts
from tests.unit.observe.builders import ev, span, step, two_generation_log

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.srcs.append(dict(attrs)["src"] or "")


def _rich_log() -> list:  # type: ignore[type-arg]
    events = two_generation_log()
    for rank in (1, 2, 3):  # more ranks so the heatmap has rows; rank 3 is slow
        events += [step(s, 10.0 * s, 10.0 * s + (9 if rank == 3 else 5), rank=rank,
                        node=f"n{rank // 2}", gen=1) for s in range(1, 6)]
    events += [span("drain", 45.0, 60.0, 3, gen=1, lag_s=15.0), ev("straggler", 50.0, 4)]
    return events


def test_report_has_six_embedded_pngs_that_decode(tmp_path: Path) -> None:
    facts = RecordFacts(run_id="demo-1", state="SUCCEEDED", generation=2, step=6, rpo_s=600.0)
    page = build_report(_rich_log(), facts=facts, node_hour_price=2.0)
    out = write_report(tmp_path / "report.html", page)
    parser = _Images()
    parser.feed(out.read_text())
    assert parser.tags[:1] == ["html"] and "h1" in parser.tags
    assert len(parser.srcs) == 6
    for src in parser.srcs:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        png = base64.b64decode(src[len(prefix):], validate=True)
        assert png[:8] == PNG_MAGIC
        width, height = struct.unpack(">II", png[16:24])  # IHDR
        assert width > 300 and height > 100
        assert len(png) > 5000  # a real plot, not a blank placeholder
    assert "demo-1" in page and "ETTR" in page
    # Self-contained and inert: the only script element is the JSON data block.
    assert page.count("<script") == 1 and '<script type="application/json"' in page


def test_report_of_an_empty_run_still_renders(tmp_path: Path) -> None:
    page = build_report([])
    parser = _Images()
    parser.feed(page)
    assert len(parser.srcs) == 6
