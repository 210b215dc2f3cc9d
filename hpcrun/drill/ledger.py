"""The sample ledger: which samples each global step consumed, and the data contracts over it.

A training main that sets ``config.ledger: true`` (the tiny example does) has rank 0 append one
JSON line per optimizer step to ``<run_dir>/ledger.jsonl``: ``{"step", "batch", "generation",
"samples": [[row, sample_id, source, epoch, offset, length], ...]}``. A step replayed after a
restore appears again, under a newer generation. Everything here is pure except
:func:`read_ledger`; the file is untrusted (a rank killed mid-write leaves a torn last line).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrun.errors import ArgumentError, FormatError

LEDGER_FILE = "ledger.jsonl"

Segment = tuple[int, ...]
"""One ledger row: (row, sample_id, source, epoch, offset, length)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerLine:
    """One step's consumption, as rank 0 recorded it."""

    step: int
    """Global step index (0 for the first optimizer step)."""
    batch: int
    """Global batch index the step consumed."""
    generation: int
    """Generation of the incarnation that ran the step."""
    samples: tuple[Segment, ...]
    """The segments of the global batch."""
    skipped: bool = False
    """The step's update was dropped (``sdc.policy: skip_batch``): its samples were consumed,
    not learned from (written again, after the step's first line, with this flag)."""

    def __post_init__(self) -> None:
        if self.step < 0 or self.batch < 0:
            raise ArgumentError(f"ledger step and batch must be >= 0, found step {self.step}, "
                                f"batch {self.batch}")


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerReport:
    """What the ledger says about the data contracts of a run (pure result)."""

    steps: int
    """Distinct steps recorded."""
    lines: int
    """Lines recorded (steps plus replays)."""
    malformed: int
    """Lines that could not be parsed (a torn last line after a crash)."""
    missing_steps: tuple[int, ...] = ()
    """Steps in ``[0, total)`` never recorded: skipped data."""
    replayed_steps: tuple[int, ...] = ()
    """Steps consumed more than once (replay after a restore)."""
    replay_mismatches: tuple[int, ...] = ()
    """Replayed steps that consumed different samples than the first time."""
    cursor_breaks: tuple[int, ...] = ()
    """Steps whose batch is not the previous step's batch + 1 (cursor discontinuity)."""
    duplicated_samples: int = 0
    """Sample segments consumed twice by the run's effective trajectory."""
    reference_mismatches: tuple[int, ...] = ()
    """Steps whose samples differ from the reference ledger's."""
    skipped_steps: tuple[int, ...] = ()
    """Steps whose update was dropped by the ``skip_batch`` policy (declared, not a fault)."""

    @property
    def ok(self) -> bool:
        return not (self.missing_steps or self.replay_mismatches or self.cursor_breaks
                    or self.duplicated_samples or self.reference_mismatches)

    def summary(self) -> str:
        """One line for tables."""
        parts = [f"{self.steps} steps", f"{len(self.replayed_steps)} replayed"]
        for name, value in (("missing", len(self.missing_steps)),
                            ("replay≠", len(self.replay_mismatches)),
                            ("cursor breaks", len(self.cursor_breaks)),
                            ("duplicated", self.duplicated_samples),
                            ("≠reference", len(self.reference_mismatches)),
                            ("skipped", len(self.skipped_steps))):
            if value:
                parts.append(f"{value} {name}")
        return ", ".join(parts)


def parse_line(raw: Any) -> LedgerLine:
    """Validate one decoded ledger line; a ValueError (:class:`FormatError`), TypeError or
    KeyError when malformed."""
    samples = tuple(tuple(int(x) for x in row) for row in raw["samples"])
    if not all(len(row) == 6 for row in samples):
        raise FormatError("ledger rows have 6 fields (row, sample_id, source, epoch, offset, "
                          f"length), found rows of {sorted({len(r) for r in samples})} fields")
    return LedgerLine(step=int(raw["step"]), batch=int(raw["batch"]),
                      generation=int(raw["generation"]), samples=samples,
                      skipped=raw.get("skipped", False) is True)


def parse_ledger(text: str) -> tuple[list[LedgerLine], int]:
    """Parse ledger text; return the valid lines (file order) and the malformed count."""
    lines, bad = [], 0
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            lines.append(parse_line(json.loads(raw)))
        except (ValueError, TypeError, KeyError):
            bad += 1
    return lines, bad


def read_ledger(run_dir: Path) -> tuple[list[LedgerLine], int] | None:
    """The run's ledger, or None when the run kept none."""
    path = Path(run_dir) / LEDGER_FILE
    try:
        return parse_ledger(path.read_text(errors="replace"))
    except FileNotFoundError:
        return None


def effective(lines: Iterable[LedgerLine]) -> dict[int, LedgerLine]:
    """Step → the line that counts: the last one written (the incarnation that went on)."""
    out: dict[int, LedgerLine] = {}
    for line in lines:
        out[line.step] = line
    return dict(sorted(out.items()))


def check_ledger(lines: Sequence[LedgerLine], *, total_steps: int, malformed: int = 0,
                 reference: Mapping[int, LedgerLine] | None = None) -> LedgerReport:
    """Check the data contracts over a run's ledger (pure).

    Args:
        lines: the ledger in file order.
        total_steps: steps the run was to complete (steps ``0 .. total_steps - 1``).
        malformed: count of unparseable lines, reported as is.
        reference: step → line of an uninterrupted run, to compare sample by sample.
    """
    eff = effective(lines)
    by_step: dict[int, list[LedgerLine]] = {}
    for line in lines:
        by_step.setdefault(line.step, []).append(line)
    replayed = tuple(s for s, ls in sorted(by_step.items()) if len(ls) > 1)
    mismatched = tuple(s for s in replayed
                       if len({(ln.batch, ln.samples) for ln in by_step[s]}) > 1)
    return LedgerReport(
        steps=len(eff), lines=len(lines), malformed=malformed,
        missing_steps=tuple(s for s in range(total_steps) if s not in eff),
        replayed_steps=replayed, replay_mismatches=mismatched,
        cursor_breaks=_cursor_breaks(eff), duplicated_samples=_duplicates(eff.values()),
        reference_mismatches=_against(eff, reference) if reference is not None else (),
        skipped_steps=tuple(s for s, line in eff.items() if line.skipped),
    )


def _cursor_breaks(eff: Mapping[int, LedgerLine]) -> tuple[int, ...]:
    breaks = []
    prev: LedgerLine | None = None
    for step, line in eff.items():
        if prev is not None and step == prev.step + 1 and line.batch != prev.batch + 1:
            breaks.append(step)
        prev = line
    return tuple(breaks)


def _duplicates(lines: Iterable[LedgerLine]) -> int:
    # A segment is (sample_id, epoch, offset): a document split across rows has distinct offsets.
    counts = Counter((seg[1], seg[3], seg[4]) for line in lines for seg in line.samples)
    return sum(n - 1 for n in counts.values() if n > 1)


def _against(eff: Mapping[int, LedgerLine], ref: Mapping[int, LedgerLine]) -> tuple[int, ...]:
    steps = sorted(set(eff) | set(ref))
    return tuple(s for s in steps if s not in eff or s not in ref
                 or (eff[s].batch, eff[s].samples) != (ref[s].batch, ref[s].samples))
