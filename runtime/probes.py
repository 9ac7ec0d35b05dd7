"""Read-only probes of this host (standard library only): is an address ours, is a port free, can the master be
reached, and the parsers of the kernel's and CANN's number lists. The preflight and doctor build their checks on them."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Sequence
from pathlib import Path

NONLOCAL_BIND = Path("/proc/sys/net/ipv4/ip_nonlocal_bind")


def address_is_local(address: str, nonlocal_bind: Path = NONLOCAL_BIND) -> bool | None:
    """Whether `address` is assigned to this host (a bind test); None: cannot tell."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return True
    if ip.version == 4 and _read(nonlocal_bind).strip() == "1":
        # ip_nonlocal_bind lets any address bind: the test would prove nothing
        return None
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(ip), 0))
        except OSError as error:
            if error.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def port_error(host: str, port: int) -> OSError | None:
    """Why a server cannot listen on host:port now ('' = every address, IPv4 and IPv6), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as servers do: a port left in TIME_WAIT by an earlier run is no obstacle
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error
    if host:
        return None
    # A port held on ::1 or :: alone is free to IPv4 but not to a dual-stack server (torch's store)
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return None  # no IPv6 on this host
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            probe.bind(("::", port))
        except OSError as error:
            absent = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)  # IPv6 switched off
            return None if error.errno in absent else error
    return None


def connect_error(host: str, port: int, timeout_s: float) -> OSError | None:
    """Why a TCP connection to host:port failed, or None (it is closed at once)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as error:
        return error


def parse_port_list(text: str) -> list[tuple[int, int]]:
    """ip_local_reserved_ports ('60000-60015,61000') as inclusive ranges."""
    ranges = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        first, _, last = item.partition("-")
        ranges.append((int(first), int(last or first)))
    return ranges


def parse_port_range(text: str) -> tuple[int, int]:
    """ip_local_port_range ('32768\\t60999') as (first, last)."""
    first, last = text.split()
    return int(first), int(last)


def parse_visible_devices(value: str) -> tuple[int, ...]:
    """ASCEND_RT_VISIBLE_DEVICES as the runtime reads it: ascending ids, with commas."""
    items = [item.strip() for item in value.split(",")]
    if not all(item.isdigit() for item in items):
        hint = "give comma-separated device ids, e.g. 0,1,2,3"
        raise ValueError(f"ASCEND_RT_VISIBLE_DEVICES={value!r}: {hint}")
    ids = tuple(int(item) for item in items)
    if list(ids) != sorted(set(ids)):
        hint = "the ids must be ascending, each once"
        raise ValueError(f"ASCEND_RT_VISIBLE_DEVICES={value!r}: {hint}")
    return ids


def compress_numbers(numbers: Sequence[int]) -> str:
    """Numbers (ports, ranks) as short text: 60000-60002, 60007."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def is_loopback(address: str) -> bool:
    """Whether `address` is a loopback IP (nodes simulated on one host)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
