"""Host lists for large clusters: hostfiles (one address per line) and address ranges.

A hostfile follows the MPI / DeepSpeed convention: one host per line,
optionally `slots=N` (its device count), `#` starts a comment. npu-wizard
needs addresses (they become HCCL_IF_IP), so every host must be an IP. A
range `10.0.0.11-10.0.0.74` stands for every address from the first to the
last, in order.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

MAX_HOSTS = 4096
_SLOTS = re.compile(r"^slots=(\d{1,3})$")


class HostListError(ValueError):
    """A hostfile or address list that cannot be read; the message says where and why."""


@dataclass(frozen=True)
class Host:
    """One line of a hostfile: the address, its slots (None when not given) and the line number."""

    address: str
    slots: int | None
    line: int


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_range(item: str) -> bool:
    """Whether `item` is written as a range FIRST-LAST of two addresses."""
    ends = item.split("-", 1)
    return len(ends) == 2 and all(_is_ip(end.strip()) for end in ends)


def expand(item: str) -> list[str]:
    """One address, or every address of a range `FIRST-LAST`, as normalised text."""
    if "-" not in item:
        return [str(ipaddress.ip_address(item))]
    first_text, _, last_text = item.partition("-")
    first, last = ipaddress.ip_address(first_text.strip()), ipaddress.ip_address(last_text.strip())
    if first.version != last.version or int(last) < int(first):
        raise ValueError(f"{item}: a range runs from a lower to a higher address of the same kind")
    if int(last) - int(first) >= MAX_HOSTS:
        raise ValueError(f"{item}: more than {MAX_HOSTS} addresses")
    return [str(ipaddress.ip_address(value)) for value in range(int(first), int(last) + 1)]


def parse(text: str) -> list[Host]:
    """The hosts of a hostfile's text; HostListError naming every bad line."""
    hosts: list[Host] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        slots = None
        for extra in fields[1:]:
            match = _SLOTS.match(extra)
            if match is None:
                problems.append(f"line {number}: {extra!r}: only slots=N may follow the address")
            else:
                slots = int(match.group(1))
        if not is_range(fields[0]) and not _is_ip(fields[0]):
            problems.append(f"line {number}: {fields[0]!r}: not an IP")
            continue
        try:
            addresses = expand(fields[0])
        except ValueError as error:
            problems.append(f"line {number}: {error}")
            continue
        hosts.extend(Host(address, slots, number) for address in addresses)
    if problems:
        raise HostListError("; ".join(problems[:10]) + ("; ..." if len(problems) > 10 else ""))
    if not hosts:
        raise HostListError("no host addresses in it (one per line, # for comments)")
    return hosts


def read(path: str) -> list[Host]:
    """The hosts of the hostfile at `path`; HostListError when it cannot be read or parsed."""
    file = Path(path)
    try:
        stat = file.stat()
    except OSError as error:
        raise HostListError(f"cannot read it: {error.strerror}") from None
    return list(_read_cached(str(file), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> tuple[Host, ...]:
    # one read per version of the file, however many questions and rules ask
    if size > 1 << 20:
        raise HostListError("over 1 MiB: not a hostfile")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise HostListError(f"cannot read it: {error}") from None
    return tuple(parse(text))
