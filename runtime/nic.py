"""This host's network interfaces: which holds an address, which a HCCL_SOCKET_IFNAME names.

Standard library only (the launch-time preflight imports it before torch).
HCCL_SOCKET_IFNAME (CANN envref_07_0075) names HCCL's NIC: `eth,enp` takes
interfaces whose names start with a listed prefix, `=eth0` the exact names,
`^docker` every interface except those (and except loopback).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

SIOCGIFADDR = 0x8915
IF_INET6 = Path("/proc/net/if_inet6")


def interface_names() -> list[str]:
    """This host's interface names, in the kernel's order."""
    return [name for _index, name in socket.if_nameindex()]


def ipv4_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", name.encode()[:15])
        try:
            reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
        except OSError:  # no such interface, or no IPv4 address on it
            return None
    return socket.inet_ntoa(reply[20:24])


def ipv6_addresses(table: Path | None = None) -> list[tuple[str, str]]:
    """(address, interface) for every IPv6 address in /proc/net/if_inet6."""
    try:
        lines = (table or IF_INET6).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6:
            found.append((str(ipaddress.IPv6Address(int(fields[0], 16))), fields[5]))
    return found


def interface_for_address(address: str, table: Path | None = None) -> str | None:
    """The name of the local network interface holding `address`, or None."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return "lo"
    if ip.version == 6:
        return next(
            (name for found, name in ipv6_addresses(table) if found == str(ip)), None
        )
    return next(
        (name for name in interface_names() if ipv4_address(name) == str(ip)), None
    )


def matches_socket_ifname(spec: str, name: str) -> bool:
    """Whether interface `name` is one that HCCL_SOCKET_IFNAME=`spec` allows."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    patterns = [p for p in (body[1:] if exact else body).split(",") if p]
    hit = any(name == p if exact else name.startswith(p) for p in patterns)
    if exclude:
        return not hit and name != "lo"
    return hit


def socket_ifname_interfaces(
    spec: str, names: Sequence[str] | None = None
) -> list[str]:
    """The interfaces of this host that HCCL_SOCKET_IFNAME=`spec` names, in the kernel's order."""
    return [
        name
        for name in (interface_names() if names is None else names)
        if matches_socket_ifname(spec, name)
    ]


def socket_ifname_address(
    spec: str, table: Path | None = None
) -> tuple[str, str] | None:
    """(interface, address) HCCL would use for HCCL_SOCKET_IFNAME=`spec` (IPv4 first), or None."""
    named = socket_ifname_interfaces(spec)
    for name in named:
        address = ipv4_address(name)
        if address is not None:
            return name, address
    for address, name in ipv6_addresses(table):
        if name in named and not ipaddress.IPv6Address(address).is_link_local:
            return name, address
    return None


def hccl_interface(env: Mapping[str, str]) -> str | None:
    """The interface HCCL uses on this node: HCCL_IF_IP's, else the one HCCL_SOCKET_IFNAME names; None if neither."""
    address, spec = env.get("HCCL_IF_IP"), env.get("HCCL_SOCKET_IFNAME")
    if address:  # HCCL_IF_IP wins over HCCL_SOCKET_IFNAME in HCCL too
        return interface_for_address(address)
    found = socket_ifname_address(spec) if spec else None
    return found[0] if found else None


if __name__ == "__main__":
    # `python -m runtime.nic`: HCCL's interface on this node, for GLOO_SOCKET_IFNAME (launch/run-node.sh)
    print(hccl_interface(os.environ) or "")
