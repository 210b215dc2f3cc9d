"""Collect what a run left behind into :class:`~hpcrun.drill.contracts.Evidence` (effectful)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcrun.drill.contracts import Evidence
from hpcrun.drill.ledger import read_ledger
from hpcrun.errors import HpcrunError


def newest_verifies(run_dir: Path) -> tuple[bool | None, str]:
    """Whether the newest checkpoint committed on the shared tier restores (manifest,
    checksums, coverage); tier-0-only commits die with their nodes and are not judged here."""
    from hpcrun.drill.states import committed, load_state

    found = [c for c in committed(run_dir) if "shared" in c.tiers]
    if not found:
        return None, ""
    try:
        load_state(run_dir, found[-1])
    except (HpcrunError, OSError) as exc:
        return False, f"{found[-1].ckpt_id}: {exc}"
    return True, ""


def collect(run_dir: Path, *, victim_rank: int | None = None) -> Evidence:
    """Read the record, log, events, ledger and newest checkpoint of ``run_dir``."""
    from hpcrun.control.log import RunLog
    from hpcrun.control.record import load_run_spec, read_record
    from hpcrun.observe.events import read_events

    record = read_record(run_dir)
    spec = load_run_spec(run_dir)
    ledger = read_ledger(run_dir)
    ok, why = newest_verifies(run_dir)
    info: Any = record.state_info or {}
    return Evidence(
        run_id=record.run_id, state=str(record.state), reason=str(info.get("reason", "")),
        entries=tuple(RunLog(run_dir).read()), events=tuple(read_events(run_dir)),
        ledger=None if ledger is None else tuple(ledger[0]),
        ledger_malformed=0 if ledger is None else ledger[1],
        total_steps=_total_steps(spec, record), newest_verifies=ok, newest_detail=why,
        victim_rank=victim_rank, anomalies=tuple(record.anomalies))


def _total_steps(spec: Any, record: Any) -> int:
    configured = spec.config.get("steps") if hasattr(spec.config, "get") else None
    if str(record.state) == "SUCCEEDED" and isinstance(configured, int):
        return configured
    return int(record.step)
