"""The site's ``fabric_interface`` on the local backend: a two-node run with partner copies
whose site names ``lo`` binds its partner servers there and says so; a site naming an
interface the node lacks ends the run FAILED at its start, naming the interface and the node's."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hpcrun.checkpoint.peer.ledger import fold_partner_copies
from hpcrun.checkpoint.peer.server import addr_path
from hpcrun.control.log import RunLog
from hpcrun.control.record import read_record
from hpcrun.launch.fabric import read_interfaces
from tests.integration.local_helpers import REPO_ROOT, local_spec, outcome, submit


def _site(tmp_path: Path, interface: str) -> Path:
    """A copy of the shipped local site naming ``interface``, in its own directory."""
    base = yaml.safe_load((REPO_ROOT / "site_configs" / "local.yaml").read_text())
    sites = tmp_path / "sites"
    sites.mkdir()
    body = {**base, "name": "local-fabric", "fabric_interface": interface,
            "node_local_path": str(tmp_path / "node-local")}
    (sites / "local-fabric.yaml").write_text(yaml.safe_dump(body))
    return sites


def _submit(tmp_path: Path, interface: str, steps: int) -> Path:
    spec = {**local_spec(steps=steps, every_steps=5), "site": "local-fabric"}
    return submit(tmp_path / "runs", spec,
                  env={"HPCRUN_SITE_CONFIGS": str(_site(tmp_path, interface))})


def _agent_lines(run_dir: Path, node: str) -> list[str]:
    return (run_dir / "logs" / node / "agent.out").read_text().splitlines()


def test_partner_copies_go_through_the_configured_interface(tmp_path: Path) -> None:
    run_dir = _submit(tmp_path, "lo", steps=20)
    rec = read_record(run_dir)
    assert rec.state == "SUCCEEDED" and rec.step == 20, outcome(run_dir)
    for node in rec.membership:
        published = json.loads(addr_path(run_dir, node).read_text())
        assert (published["host"], published["interface"], published["source"]) == (
            "127.0.0.1", "lo", "configured"), published
        assert (f"hpcrun agent {node}: talks to the other agents on 127.0.0.1 on lo "
                "(configured: fabric_interface lo)") in _agent_lines(run_dir, node)
    copies = fold_partner_copies(RunLog(run_dir).read()).values()
    assert {(c.owner, c.held_by) for c in copies if c.complete} == {
        (rec.membership[0], rec.membership[1]), (rec.membership[1], rec.membership[0])}, (
        "each node's shards reached its partner through the server on lo")


def test_a_configured_interface_the_node_lacks_fails_the_run_at_its_start(
        tmp_path: Path) -> None:
    absent = next(f"fab{i}" for i in range(100)
                  if f"fab{i}" not in {i.name for i in read_interfaces()})
    run_dir = _submit(tmp_path, absent, steps=20)
    rec = read_record(run_dir)
    assert rec.state == "FAILED", outcome(run_dir)
    reason = str((rec.result or {}).get("reason", ""))
    assert f"'fabric_interface' is '{absent}'" in reason and "lo 127.0.0.1" in reason, reason
    assert rec.step == 0 and not rec.checkpoints, "no rank started"
    assert not (run_dir / "partner").exists(), "no partner secret, no published address"
    for node in ("local0", "local1"):
        errors = [ln for ln in _agent_lines(run_dir, node) if ": error: " in ln]
        assert len(errors) == 1 and f"has no interface {absent}" in errors[0], errors
