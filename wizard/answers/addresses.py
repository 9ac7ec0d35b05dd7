"""What an IP address answer is: the one check every address (a node, a hostfile line, a master) goes through."""

from __future__ import annotations

import ipaddress
import re

ZONE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")  # an IPv6 zone id: an interface name


def is_ip(text: str) -> bool:
    """Whether the text is an IPv4 or IPv6 address (a zone id only as an interface name)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    scope = getattr(address, "scope_id", None)
    return scope is None or bool(ZONE.fullmatch(scope))


def is_loopback(text: str) -> bool:
    """Whether the text is a loopback address (a node simulated on this host)."""
    return is_ip(text) and ipaddress.ip_address(text).is_loopback
