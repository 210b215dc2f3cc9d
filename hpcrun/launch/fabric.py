"""Which address a node's agent talks on to the other agents: the site's fast fabric.

The partner server (:mod:`hpcrun.checkpoint.peer.server`) and the liveness beats
(:mod:`hpcrun.runtime.node.netbeat`) bind to one address per node. A node's hostname often
resolves to its management Ethernet, and a peer restore sent through a 1 GbE link instead of
InfiniBand or Slingshot runs tens of times slower, so the address comes from the site config's
``fabric_interface``:

1. **Configured** (``fabric_interface: ib0``): that interface's IPv4 address. A node without the
   interface (or without an IPv4 address on it) refuses to start the run's peer tier
   (:class:`~hpcrun.errors.ConfigError`, naming the interface and listing the node's): a site that
   names its fabric wants to know when a node is not on it.
2. **NodeAddr** (empty, the default): the interface holding the node's Slurm ``NodeAddr``
   (``scontrol --oneliner show node $SLURMD_NODENAME``, a name resolved; the node name's own
   resolution when Slurm does not say), the address Slurm itself reaches the node on. On the
   local backend every emulated node is this host: loopback.
3. **Fallback**: that address is on none of the node's interfaces (an alias, a NAT): the node
   name's resolution, as before the setting existed, and the reason is published with it.

:func:`choose_fabric` is the pure choice (an interface table and the addresses in, a
:class:`FabricChoice` out); :func:`read_interfaces` reads the table (``socket.if_nameindex`` and
the ``SIOCGIFADDR`` ioctl) and :func:`resolve_fabric` runs ``scontrol`` through the injected
:class:`~hpcrun.runner.CommandRunner`.
"""

from __future__ import annotations

import fcntl
import re
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hpcrun.errors import ConfigError, EnvError, HpcrunError
from hpcrun.runner import CommandRunner
from hpcrun.vocab import Backend

__all__ = ["SCONTROL_NODE", "FabricChoice", "FabricSource", "Interface", "check_interface_name",
           "choose_fabric", "describe_interfaces", "parse_node_addr", "read_interfaces",
           "resolve_fabric"]

SCONTROL_NODE = ("scontrol", "--oneliner", "show", "node")
SCONTROL_TIMEOUT_S = 10.0
"""A controller that does not answer within this leaves the node name's resolution."""
LOOPBACK = "127.0.0.1"
_SIOCGIFADDR = 0x8915  # linux/sockios.h
_IFNAMSIZ = 16  # the kernel's limit, its terminating NUL included
_IFACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class FabricSource(StrEnum):
    """Why a node's agents talk on the address they do."""

    CONFIGURED = "configured"  # the site's fabric_interface
    NODE_ADDR = "node_addr"    # the interface holding the node's Slurm NodeAddr
    FALLBACK = "fallback"      # NodeAddr on no interface: the node name's resolution


@dataclass(frozen=True, kw_only=True, slots=True)
class Interface:
    """One network interface of a node, as the kernel names it."""

    name: str
    """The kernel's name (``ib0``, ``hsn0``, ``lo``)."""
    address: str | None
    """Its IPv4 address; None when it has none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricChoice:
    """The address this node's partner server and beat socket bind to, and why."""

    address: str
    """IPv4 address to bind to and publish."""
    interface: str | None
    """The interface holding ``address``; None when no interface of the node holds it."""
    source: FabricSource
    """Configured, NodeAddr's interface, or the fallback."""
    detail: str
    """One line a person reads: what was asked for and what was found."""

    def describe(self) -> str:
        """``127.0.0.1 on lo (configured: fabric_interface lo)``."""
        where = f"on {self.interface}" if self.interface else "on no known interface"
        return f"{self.address} {where} ({self.source.value}: {self.detail})"

    def record(self) -> dict[str, str]:
        """What a published address record says of the choice (interface, source, detail)."""
        return {"interface": self.interface or "", "source": self.source.value,
                "detail": self.detail}


# -- the pure choice ---------------------------------------------------------------------------

def check_interface_name(name: str) -> None:
    """Refuse a string that cannot name a network interface (pure; empty is the default).

    Raises:
        ConfigError: what was found, what an interface name looks like, and how to fix it.
    """
    if name and (len(name) >= _IFNAMSIZ or not _IFACE_RE.fullmatch(name)):
        raise ConfigError(f"site config key 'fabric_interface': expected a network interface "
                          f"name (letters, digits, '_', '.', '-'; at most {_IFNAMSIZ - 1} "
                          f"characters, e.g. ib0 or hsn0), found {name!r}; write the name "
                          "`ip -brief address` shows on a compute node, or leave it empty for "
                          "the interface of the node's Slurm NodeAddr")


def describe_interfaces(interfaces: Sequence[Interface]) -> str:
    """``lo 127.0.0.1, eth0 10.0.0.5, ib0 (no IPv4)`` (pure)."""
    return ", ".join(f"{i.name} {i.address or '(no IPv4)'}" for i in interfaces) or "none found"


def _holder(interfaces: Sequence[Interface], address: str) -> Interface | None:
    return next((i for i in interfaces if i.address == address), None)


def choose_fabric(interfaces: Sequence[Interface], *, configured: str, node: str,
                  node_addr: str | None, name_addr: str | None) -> FabricChoice:
    """The address ``node``'s agents bind to (pure).

    Args:
        interfaces: the node's interfaces (:func:`read_interfaces`).
        configured: the site's ``fabric_interface``; empty for NodeAddr's interface.
        node: the node's name (for messages).
        node_addr: the node's Slurm ``NodeAddr`` as an IPv4 address, or None when Slurm did
            not say (then ``name_addr`` stands in for it).
        name_addr: the node name's resolution, None when it does not resolve.

    Raises:
        ConfigError: ``configured`` is not an interface of the node, or has no IPv4 address.
        EnvError: nothing is configured and neither address is known.
    """
    if configured:
        return _configured(interfaces, configured, node)
    wanted = node_addr or name_addr
    if wanted is None:
        raise EnvError(f"node {node}: neither Slurm's NodeAddr nor the name's resolution gives "
                       "an address to talk to the other agents on; set the site's "
                       "fabric_interface (e.g. ib0) or make the node name resolve")
    said = (f"NodeAddr {wanted}" if node_addr is not None
            else f"the name's address {wanted}, Slurm naming no NodeAddr")
    holder = _holder(interfaces, wanted)
    if holder is not None:
        return FabricChoice(address=wanted, interface=holder.name, source=FabricSource.NODE_ADDR,
                            detail=said)
    fallback = name_addr or wanted
    held = _holder(interfaces, fallback)
    instead = (f"the name's address {fallback}" if fallback != wanted
               else f"{fallback} all the same")
    return FabricChoice(
        address=fallback, interface=held.name if held is not None else None,
        source=FabricSource.FALLBACK,
        detail=f"{said} is on none of this node's interfaces ({describe_interfaces(interfaces)});"
               f" {instead}; set fabric_interface to pick one")


def _configured(interfaces: Sequence[Interface], name: str, node: str) -> FabricChoice:
    found = next((i for i in interfaces if i.name == name), None)
    if found is None or found.address is None:
        what = "has no IPv4 address on" if found is not None else "has no"
        raise ConfigError(f"site config key 'fabric_interface' is {name!r}, but node {node} "
                          f"{what} interface {name} (its interfaces: "
                          f"{describe_interfaces(interfaces)}); set fabric_interface to the "
                          "node's fast-fabric interface, or leave it empty for the interface "
                          "of the node's Slurm NodeAddr")
    return FabricChoice(address=found.address, interface=name, source=FabricSource.CONFIGURED,
                        detail=f"fabric_interface {name}")


def parse_node_addr(text: str, node: str) -> str | None:
    """``node``'s ``NodeAddr`` from ``scontrol --oneliner show node`` output (pure)."""
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if fields.get("NodeName") == node and fields.get("NodeAddr"):
            return fields["NodeAddr"]
    return None


# -- what the node has (effects) ---------------------------------------------------------------

def _ipv4_of(sock: socket.socket, name: str) -> str | None:
    request = struct.pack("256s", name.encode()[:_IFNAMSIZ - 1])
    try:
        answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
    except OSError:  # EADDRNOTAVAIL: the interface has no IPv4 address
        return None
    return socket.inet_ntoa(answer[20:24])  # struct ifreq: the name, then a sockaddr_in


def read_interfaces() -> tuple[Interface, ...]:
    """This node's interfaces and their IPv4 addresses (the kernel's, one ioctl each)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return tuple(Interface(name=name, address=_ipv4_of(sock, name))
                     for _, name in socket.if_nameindex())


def _ipv4(name: str | None, resolve: Callable[[str], str]) -> str | None:
    if not name:
        return None
    try:
        return resolve(name)
    except OSError:
        return None


def slurm_node_addr(node: str, runner: CommandRunner) -> str | None:
    """The ``NodeAddr`` Slurm has for ``node`` (a name or an address); None when it does not
    answer."""
    try:
        done = runner.run([*SCONTROL_NODE, node], timeout=SCONTROL_TIMEOUT_S)
    except HpcrunError:  # scontrol missing, or the controller too slow
        return None
    return parse_node_addr(done.stdout, node) if done.returncode == 0 else None


def resolve_fabric(node: str, *, backend: Backend, configured: str,
                   environ: Mapping[str, str], runner: CommandRunner,
                   interfaces: Callable[[], Sequence[Interface]] = read_interfaces,
                   resolve: Callable[[str], str] = socket.gethostbyname) -> FabricChoice:
    """The address this node's agents bind to (:func:`choose_fabric` on what the node has).

    On the local backend every emulated node is this host (loopback is its NodeAddr); on Slurm
    the node's ``NodeAddr`` (``$SLURMD_NODENAME``'s, else ``node``'s), resolved.

    Raises:
        ConfigError: the configured interface is not on this node (named, with the node's).
        EnvError: nothing configured and no address known.
    """
    table = interfaces()
    if backend == Backend.LOCAL:
        return choose_fabric(table, configured=configured, node=node, node_addr=LOOPBACK,
                             name_addr=LOOPBACK)
    if configured:  # the name alone decides: no scontrol call
        return choose_fabric(table, configured=configured, node=node, node_addr=None,
                             name_addr=None)
    slurm_name = environ.get("SLURMD_NODENAME") or node
    node_addr = _ipv4(slurm_node_addr(slurm_name, runner), resolve)
    name_addr = _ipv4(node, resolve) or _ipv4(socket.gethostname(), resolve)
    return choose_fabric(table, configured="", node=node, node_addr=node_addr,
                         name_addr=name_addr)
