"""The fabric address: a configured interface's, else the interface of Slurm's NodeAddr, else
the node name's, with the reason; a bad interface name is refused when the site is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hpcrun.errors import ConfigError, EnvError
from hpcrun.launch.fabric import (
    FabricSource,
    Interface,
    check_interface_name,
    choose_fabric,
    parse_node_addr,
    read_interfaces,
    resolve_fabric,
)
from hpcrun.launch.site import load_site, site_from_dict
from hpcrun.runner import CommandResult
from hpcrun.testing import FakeRunner
from hpcrun.vocab import Backend

NODE = [Interface(name="lo", address="127.0.0.1"), Interface(name="eno1", address="10.0.0.5"),
        Interface(name="ib0", address="10.1.0.5"), Interface(name="ib1", address=None)]
MINIMAL = {"name": "mini", "node_local_path": "/nvme/$SLURM_JOB_ID", "shared_path": "/lustre/r"}
SCONTROL = ("NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=node1-ib "
            "NodeHostName=node1 Version=22.05.8 OS=Linux 6.1.0 RealMemory=1 State=IDLE\n")


def _choose(configured: str = "", node_addr: str | None = None,
            name_addr: str | None = "10.0.0.5"):
    return choose_fabric(NODE, configured=configured, node="node1", node_addr=node_addr,
                         name_addr=name_addr)


# -- the pure choice ---------------------------------------------------------------------------

def test_a_configured_interface_gives_its_own_address_whatever_the_name_resolves_to() -> None:
    choice = _choose("ib0", node_addr="10.0.0.5")
    assert (choice.address, choice.interface, choice.source) == (
        "10.1.0.5", "ib0", FabricSource.CONFIGURED)
    assert choice.describe() == "10.1.0.5 on ib0 (configured: fabric_interface ib0)"
    assert choice.record() == {"interface": "ib0", "source": "configured",
                               "detail": "fabric_interface ib0"}


def test_a_configured_interface_the_node_lacks_is_refused_naming_it_and_the_nodes() -> None:
    with pytest.raises(ConfigError) as info:
        _choose("hsn0")
    text = str(info.value)
    assert "'hsn0'" in text and "node node1 has no interface hsn0" in text
    assert "lo 127.0.0.1, eno1 10.0.0.5, ib0 10.1.0.5, ib1 (no IPv4)" in text
    assert "set fabric_interface" in text and "\n" not in text


def test_a_configured_interface_without_an_ipv4_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no IPv4 address on interface ib1"):
        _choose("ib1")


def test_by_default_the_interface_holding_the_node_addr() -> None:
    choice = _choose(node_addr="10.1.0.5")
    assert (choice.address, choice.interface, choice.source) == (
        "10.1.0.5", "ib0", FabricSource.NODE_ADDR)
    assert choice.detail == "NodeAddr 10.1.0.5"


def test_without_a_node_addr_the_name_stands_in_for_it() -> None:
    choice = _choose(node_addr=None, name_addr="10.0.0.5")
    assert (choice.address, choice.interface, choice.source) == (
        "10.0.0.5", "eno1", FabricSource.NODE_ADDR)
    assert "Slurm naming no NodeAddr" in choice.detail


def test_a_node_addr_on_no_interface_falls_back_to_the_name_and_says_why() -> None:
    choice = _choose(node_addr="192.168.7.7", name_addr="10.0.0.5")
    assert (choice.address, choice.interface, choice.source) == (
        "10.0.0.5", "eno1", FabricSource.FALLBACK)
    assert "NodeAddr 192.168.7.7 is on none of this node's interfaces" in choice.detail
    assert "ib0 10.1.0.5" in choice.detail and "the name's address 10.0.0.5" in choice.detail


def test_an_address_no_interface_holds_is_still_named_when_nothing_else_is_known() -> None:
    choice = _choose(node_addr=None, name_addr="192.168.7.7")
    assert (choice.address, choice.interface, choice.source) == (
        "192.168.7.7", None, FabricSource.FALLBACK)
    assert choice.describe().startswith("192.168.7.7 on no known interface (fallback: ")


def test_no_address_at_all_is_an_environment_error_not_a_guess() -> None:
    with pytest.raises(EnvError, match="fabric_interface"):
        _choose(node_addr=None, name_addr=None)


@given(st.lists(st.tuples(st.from_regex(r"[a-z]{1,4}[0-9]", fullmatch=True),
                          st.ip_addresses(v=4).map(str)), min_size=1, max_size=6,
                unique_by=lambda t: t[0]),
       st.data())
def test_a_configured_interface_always_wins_over_node_addr(rows, data) -> None:
    table = [Interface(name=n, address=a) for n, a in rows]
    name, address = data.draw(st.sampled_from(rows))
    choice = choose_fabric(table, configured=name, node="n", node_addr=table[0].address,
                           name_addr=None)
    assert (choice.address, choice.interface) == (address, name)


# -- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "lo", "ib0", "hsn0", "enp65s0f0", "ib0.8001", "bond_0",
                                  "br-1a2b3c4d5e6f"])
def test_interface_names_the_kernel_takes_are_accepted(name: str) -> None:
    check_interface_name(name)
    assert site_from_dict({**MINIMAL, "fabric_interface": name}).fabric_interface == name


@pytest.mark.parametrize("name", ["ib 0", "ib0/1", "-ib0", "eth0:1", "ib0;ls", "x" * 16, ".",
                                  "ib0\n"])
def test_invalid_interface_names_are_refused_when_the_site_is_loaded(tmp_path: Path,
                                                                     name: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "fabric_interface": name}))
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    text = str(info.value)
    assert str(path) in text and "'fabric_interface'" in text and repr(name) in text
    assert "e.g. ib0" in text and "leave it empty" in text


def test_an_empty_or_absent_setting_is_the_default() -> None:
    assert site_from_dict(MINIMAL).fabric_interface == ""
    assert site_from_dict({**MINIMAL, "fabric_interface": None}).fabric_interface == ""
    with pytest.raises(ConfigError, match="expected a string"):
        site_from_dict({**MINIMAL, "fabric_interface": 0})


# -- what the node has ------------------------------------------------------------------------

def test_parse_node_addr_reads_the_named_nodes_line() -> None:
    other = SCONTROL.replace("node1", "node2").replace("node2-ib", "10.9.9.9")
    assert parse_node_addr(other + SCONTROL, "node1") == "node1-ib"
    assert parse_node_addr(other, "node1") is None
    assert parse_node_addr("", "node1") is None


def _resolver(names: dict[str, str]):
    def resolve(name: str) -> str:
        if name in names:
            return names[name]
        raise OSError(f"unknown host {name}")
    return resolve


def test_resolve_asks_slurm_for_the_step_nodes_node_addr_and_resolves_it() -> None:
    runner = FakeRunner({"scontrol --oneliner show node node1": SCONTROL})
    choice = resolve_fabric("node1.cluster", backend=Backend.SLURM, configured="",
                            environ={"SLURMD_NODENAME": "node1"}, runner=runner,
                            interfaces=lambda: NODE,
                            resolve=_resolver({"node1-ib": "10.1.0.5",
                                               "node1.cluster": "10.0.0.5"}))
    assert runner.calls == [("scontrol", "--oneliner", "show", "node", "node1")]
    assert (choice.address, choice.interface, choice.source) == (
        "10.1.0.5", "ib0", FabricSource.NODE_ADDR)


def test_resolve_without_an_answer_from_slurm_uses_the_name() -> None:
    runner = FakeRunner({"scontrol": CommandResult(argv=("scontrol",), returncode=1, stdout="",
                                                   stderr="Unable to contact slurm controller")})
    choice = resolve_fabric("node1", backend=Backend.SLURM, configured="", environ={},
                            runner=runner, interfaces=lambda: NODE,
                            resolve=_resolver({"node1": "10.0.0.5"}))
    assert (choice.address, choice.interface) == ("10.0.0.5", "eno1")
    assert runner.calls == [("scontrol", "--oneliner", "show", "node", "node1")]


def test_resolve_a_configured_interface_asks_nobody() -> None:
    runner = FakeRunner()
    choice = resolve_fabric("node1", backend=Backend.SLURM, configured="ib0", environ={},
                            runner=runner, interfaces=lambda: NODE, resolve=_resolver({}))
    assert choice.address == "10.1.0.5" and runner.calls == []


def test_resolve_on_the_local_backend_is_loopback_unless_configured() -> None:
    runner = FakeRunner()
    default = resolve_fabric("node0", backend=Backend.LOCAL, configured="", environ={},
                             runner=runner, interfaces=lambda: NODE, resolve=_resolver({}))
    assert (default.address, default.interface) == ("127.0.0.1", "lo") and runner.calls == []
    configured = resolve_fabric("node0", backend=Backend.LOCAL, configured="eno1", environ={},
                                runner=runner, interfaces=lambda: NODE, resolve=_resolver({}))
    assert configured.address == "10.0.0.5"


def test_read_interfaces_finds_this_machines_loopback() -> None:
    table = read_interfaces()
    assert Interface(name="lo", address="127.0.0.1") in table
    assert len({i.name for i in table}) == len(table)
