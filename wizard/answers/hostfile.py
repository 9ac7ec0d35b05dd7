"""Host lists for large clusters: hostfiles (one address per line) and address ranges.

A hostfile follows the MPI / DeepSpeed convention: one host per line,
optionally `slots=N` (its device count), `#` starts a comment. The word
`spare` after an address marks a spare host (network.spare_hosts): no node
runs there until `npu-wizard run --restarts` gives it a failed node's rank;
the other lines are the nodes, in order. npu-wizard
needs addresses (they become HCCL_IF_IP), so every host must be an IP. A
range `10.0.0.11-10.0.0.74` stands for every address from the first to the
last, in order.

A hostfile may be any path a received project names: only a plain file of at
most 1 MiB is read (a FIFO would block for ever, /dev/zero never ends), ranges
are counted before they are expanded, and a bad line is named by its number,
never quoted (the file may hold anything, /proc/self/environ for one).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import stat
from dataclasses import dataclass

from wizard.answers.addresses import is_ip  # the same check, IPv6 zone ids included, as every address answer

MAX_HOSTS = 4096  # the most nodes the answers allow
MAX_BYTES = 1 << 20
_SLOTS = re.compile(r"slots=([0-9]{1,3})")
SPARE_WORD = "spare"  # after an address: a spare host, not a node


class HostListError(ValueError):
    """A hostfile or address list that cannot be read; the message says where and why."""


@dataclass(frozen=True)
class Host:
    """One line of a hostfile: the address, its slots (None when not given), the line number, whether a spare."""

    address: str
    slots: int | None
    line: int
    spare: bool = False


def is_range(item: str) -> bool:
    """Whether `item` is written as a range FIRST-LAST of two addresses."""
    ends = item.split("-", 1)
    return len(ends) == 2 and all(is_ip(end.strip()) for end in ends)


def size(item: str) -> int:
    """How many addresses an address or a range `FIRST-LAST` stands for, counted without expanding it."""
    if not is_range(item):
        return 1
    first_text, _, last_text = item.partition("-")
    if "%" in item:  # the addresses counted up from FIRST would carry no zone
        raise ValueError("a range cannot carry an IPv6 zone id (%NIC); write each such address on its own line")
    first, last = ipaddress.ip_address(first_text.strip()), ipaddress.ip_address(last_text.strip())
    if first.version != last.version or int(last) < int(first):
        raise ValueError(f"{item}: a range runs from a lower to a higher address of the same kind")
    return int(last) - int(first) + 1


def expand(item: str) -> list[str]:
    """One address, or every address of a range `FIRST-LAST` (at most MAX_HOSTS), as normalised text."""
    if not is_range(item):
        return [str(ipaddress.ip_address(item))]
    count = size(item)
    if count > MAX_HOSTS:
        raise ValueError(f"{item}: more than {MAX_HOSTS} addresses")
    first = ipaddress.ip_address(item.partition("-")[0].strip())
    return [str(ipaddress.ip_address(int(first) + offset)) for offset in range(count)]


def parse(text: str) -> list[Host]:
    """The hosts of a hostfile's text; HostListError naming every bad line."""
    hosts: list[Host] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        slots, spare = None, False
        for extra in fields[1:]:
            match = _SLOTS.fullmatch(extra)
            if extra == SPARE_WORD:
                spare = True
            elif match is None:
                problems.append(f"line {number}: only slots=N and the word {SPARE_WORD} may follow the address")
            else:
                slots = int(match.group(1))
        if not is_range(fields[0]) and not is_ip(fields[0]):
            problems.append(f"line {number}: not an IP address")
            continue
        try:
            count = size(fields[0])  # counted before expanding: a few lines of ranges may name millions
        except ValueError as error:
            problems.append(f"line {number}: {error}")
            continue
        if len(hosts) + count > MAX_HOSTS:
            raise HostListError(f"line {number}: more than {MAX_HOSTS} addresses in all, the most nodes a job has")
        hosts.extend(Host(address, slots, number, spare) for address in expand(fields[0]))
    if problems:
        raise HostListError("; ".join(problems[:10]) + ("; ..." if len(problems) > 10 else ""))
    if not any(not host.spare for host in hosts):
        raise HostListError("no host addresses in it (one per line, # for comments)")
    return hosts


def nodes(hosts: list[Host]) -> tuple[str, ...]:
    """The nodes' addresses of a hostfile, in order (every line not marked spare)."""
    return tuple(host.address for host in hosts if not host.spare)


def spares(hosts: list[Host]) -> tuple[str, ...]:
    """The spare hosts' addresses of a hostfile, in order (the lines marked spare)."""
    return tuple(host.address for host in hosts if host.spare)


def read(path: str) -> list[Host]:
    """The hosts of the hostfile at `path`; HostListError when it cannot be read or parsed."""
    try:
        found = os.stat(path)
    except OSError as error:
        raise HostListError(f"cannot read it: {error.strerror}") from None
    _check_regular(found.st_mode, found.st_size)
    return list(_read_cached(path, found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size))


def _check_regular(mode: int, length: int) -> None:
    """Refuse anything but a plain file of at most MAX_BYTES: a FIFO blocks a read forever, /dev/zero never ends."""
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise HostListError(f"{kind}, not a hostfile: give a plain file with one address per line")
    if length > MAX_BYTES:
        raise HostListError(f"over {MAX_BYTES // (1 << 20)} MiB: not a hostfile")


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, device: int, inode: int, mtime_ns: int, length: int) -> tuple[Host, ...]:
    # one read per version of the file, however many questions and rules ask
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat opens at once instead of waiting for a writer
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise HostListError(f"cannot read it: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as file:
        opened = os.fstat(descriptor)
        _check_regular(opened.st_mode, opened.st_size)
        data = file.read(MAX_BYTES + 1)  # a file in /proc says size 0 and may hold more
    if len(data) > MAX_BYTES:
        raise HostListError(f"over {MAX_BYTES // (1 << 20)} MiB: not a hostfile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise HostListError(f"line {line}: not UTF-8 text (byte {data[error.start]:#04x})") from None
    return tuple(parse(text))
