"""Where a partner server binds and what it publishes: the fabric address, its interface and
why it was chosen."""

from __future__ import annotations

import json
from pathlib import Path

from hpcrun.checkpoint.peer.server import (
    PartnerServer,
    addr_path,
    peer_address,
)
from hpcrun.control.log import RunLog
from hpcrun.launch.fabric import FabricChoice, FabricSource

LO = FabricChoice(address="127.0.0.1", interface="lo", source=FabricSource.CONFIGURED,
                  detail="fabric_interface lo")


def test_the_published_record_names_the_address_its_interface_and_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "log").mkdir(parents=True)
    with PartnerServer(run_dir, node="node1", host=LO.address, node_local_root=tmp_path / "nvme",
                       log=RunLog(run_dir), fabric=LO.record()) as server:
        body = json.loads(addr_path(run_dir, "node1").read_text())
        assert peer_address(run_dir, "node1") == server.address
    assert body == {"schema_version": 1, "node": "node1", "host": "127.0.0.1",
                    "port": server.address[1], "interface": "lo", "source": "configured",
                    "detail": "fabric_interface lo"}
