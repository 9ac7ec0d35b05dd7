"""Which ports HCCL listens on: the variable in force and its ports (standard library only).

On the host HCCL listens on HCCL_IF_BASE_PORT and the ports after it; on the
Atlas A2 and A3 series HCCL_HOST_SOCKET_PORT_RANGE, where set, overrides it
(CANN envref: "60000-60050", "60000,60050-60100" or "auto", which lets the
kernel pick). On the NPUs' own NICs HCCL listens on device port 16666, which
HCCL_NPU_SOCKET_PORT_RANGE (A2/A3, same syntax) moves; every card of a
communicator must set it alike. The preflight, doctor and the launch script's
own lines take the ports from here, so they follow whichever variable a node has.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

HOST_RANGE = "HCCL_HOST_SOCKET_PORT_RANGE"
NPU_RANGE = "HCCL_NPU_SOCKET_PORT_RANGE"
BASE_PORT = "HCCL_IF_BASE_PORT"
DEFAULT_BASE_PORT = 60000
DEFAULT_DEVICE_PORT = 16666
AUTO = "auto"
DEFAULT = "default"
SYNTAX = "ports and ranges with commas (60000-60031,60100) or auto"
# ASCII digits only: str.isdigit() and int() also take other scripts' digits, which HCCL does not read.
_NUMBER = re.compile(r"[0-9]+")
_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")


@dataclass(frozen=True)
class PortsInForce:
    """The ports HCCL listens on and the variable that decides them (None: the kernel picks, 'auto')."""

    variable: str
    value: str
    ranges: tuple[tuple[int, int], ...] | None

    @property
    def ports(self) -> list[int]:
        """Every port, ascending (none for auto)."""
        return sorted(
            {
                port
                for first, last in self.ranges or ()
                for port in range(first, last + 1)
            }
        )

    @property
    def text(self) -> str:
        """The ports as the kernel's reserved list writes them, or 'auto'."""
        if self.ranges is None:
            return AUTO
        return ",".join(_span(a, b) for a, b in self.ranges)

    @property
    def source(self) -> str:
        """What decides them: 'HCCL_IF_BASE_PORT=60000, 32 ports', 'HCCL_HOST_SOCKET_PORT_RANGE=...'."""
        if self.variable == BASE_PORT:
            return f"{BASE_PORT}={self.value}, {len(self.ports)} ports"
        if self.variable == DEFAULT:
            return f"the default: {NPU_RANGE} is not set"
        return f"{self.variable}={self.value}"

    def describe(self) -> str:
        """The ports and where they come from, for a person: '60000-60031 (HCCL_IF_BASE_PORT=60000, 32 ports)'."""
        if self.ranges is None:
            return f"chosen by the kernel ({self.source})"
        return f"{self.text} ({self.source})"


def parse_ports(variable: str, value: str) -> tuple[tuple[int, int], ...] | None:
    """A port-range variable's value as inclusive ranges, None for auto; ValueError naming it when bad."""
    text = value.strip()
    if text == AUTO:
        return None
    ranges = []
    for item in text.split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{variable}={value!r} is not a port list: give {SYNTAX}")
        low, high = int(match[1]), int(match[2] or match[1])
        if not 1 <= low <= high <= 65535:
            raise ValueError(
                f"{variable}={value!r}: {item.strip()} is not a range of ports 1-65535"
            )
        ranges.append((low, high))
    ranges.sort()
    for (first, last), (low, high) in itertools.pairwise(ranges):
        if low <= last:  # CANN: the ports and ranges between commas may not overlap
            raise ValueError(
                f"{variable}={value!r}: {_span(first, last)} and {_span(low, high)} overlap, which CANN "
                "does not allow: name each port once"
            )
    return tuple(ranges)


def _span(first: int, last: int) -> str:
    """A range as the kernel's reserved list writes it: 60000 or 60000-60031."""
    return str(first) if first == last else f"{first}-{last}"


def host_ports(
    env: Mapping[str, str], count: int, *, reads_range: bool
) -> PortsInForce:
    """HCCL's host ports on a node with `env`; `reads_range`: the series reads HCCL_HOST_SOCKET_PORT_RANGE."""
    if reads_range and env.get(HOST_RANGE, "").strip():
        return PortsInForce(
            HOST_RANGE, env[HOST_RANGE], parse_ports(HOST_RANGE, env[HOST_RANGE])
        )
    value = env.get(BASE_PORT, "").strip() or str(DEFAULT_BASE_PORT)
    if not _NUMBER.fullmatch(value) or not 1024 <= int(value) <= 65520:
        raise ValueError(f"{BASE_PORT}={value!r} is not a port of 1024-65520")
    base = int(value)
    return PortsInForce(BASE_PORT, value, ((base, min(base + count - 1, 65535)),))


def device_ports(env: Mapping[str, str], *, reads_range: bool) -> PortsInForce:
    """HCCL's port on the NPUs' own NICs: 16666, or HCCL_NPU_SOCKET_PORT_RANGE's where the series reads it."""
    if reads_range and env.get(NPU_RANGE, "").strip():
        return PortsInForce(
            NPU_RANGE, env[NPU_RANGE], parse_ports(NPU_RANGE, env[NPU_RANGE])
        )
    return PortsInForce(
        DEFAULT, str(DEFAULT_DEVICE_PORT), ((DEFAULT_DEVICE_PORT, DEFAULT_DEVICE_PORT),)
    )
