"""The network check's figures (`--smoke --bandwidth`): bus bandwidth, the slow link, the table.

No torch here: the ranks measure (runtime/bandwidth.py) and the runner on
node 0 reads the result from rank 0's `bandwidth` event.

Definitions (nccl-tests' doc/PERFORMANCE.md):
- size: the bytes of the whole message: all_reduce's buffer, all_gather's
  output (each of the n ranks gives size / n);
- time: the mean time of one operation, the slowest rank's;
- algbw = size / time;
- busbw = algbw x 2(n-1)/n for all_reduce and algbw x (n-1)/n for all_gather:
  the bytes each rank's link carries per second, which can be held against
  the hardware's link speed whatever n is.

The slow link: local rank 0 of node k sends to local rank 0 of node k+1 and
back (the ring closes for 3 nodes or more), one pair at a time. Each node's
link speed is the median of the transfers it took part in, and the median of
those over the nodes is the speed a healthy link reaches: a slow node drags
down its own figure and half of its two neighbours', so from 3 nodes on the
median stays a healthy one (with 3 nodes it lies halfway). The slowest
transfer is named when it is more than 50% below that median: on a busy host
a transfer varies by tens of percent, up to 2x seen here under load, while a
link that is really wrong (a port at a lower negotiated rate, a flapping or
shaped link) costs a factor of 2 or more. The node whose own figure is that
far below is named with it; with 2 nodes both take part in every transfer,
so only the pair is.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

GB = 1e9
OPS = ("all_reduce", "all_gather")
SLOW_LINK_BELOW = 0.5  # named when below the median by more than this fraction of it

Result = dict[str, Any]


def bus_factor(op: str, world_size: int) -> float:
    """busbw / algbw for `op` over `world_size` ranks (nccl-tests' definitions)."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}: use {', '.join(OPS)}")


def collective_row(op: str, nbytes: int, time_s: float, world_size: int) -> Result:
    """One measured size of one collective: its algorithm and bus bandwidth in GB/s (1e9 bytes)."""
    algbw = nbytes / time_s / GB if time_s > 0 else 0.0
    return {
        "op": op,
        "bytes": nbytes,
        "time_s": time_s,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(op, world_size),
    }


def link_row(from_node: int, to_node: int, nbytes: int, time_s: float) -> Result:
    """One point-to-point transfer between two nodes' local rank 0, in GB/s."""
    return {
        "from_node": from_node,
        "to_node": to_node,
        "bytes": nbytes,
        "time_s": time_s,
        "GBps": nbytes / time_s / GB if time_s > 0 else 0.0,
    }


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """The node pairs of the point-to-point round: k and k+1, the ring closed for 3 nodes or more."""
    pairs = [(k, k + 1) for k in range(nodes - 1)]
    return pairs + [(nodes - 1, 0)] if nodes > 2 else pairs


def slowest_link(links: Sequence[Mapping[str, Any]]) -> Result | None:
    """The slowest transfer, how far below the median healthy link it is, and whether to name it."""
    if not links:
        return None
    taken: dict[int, list[float]] = {}
    for link in links:
        for node in (link["from_node"], link["to_node"]):
            taken.setdefault(node, []).append(link["GBps"])
    per_node = {node: statistics.median(speeds) for node, speeds in taken.items()}
    median = statistics.median(per_node.values())
    slowest = min(links, key=lambda link: link["GBps"])
    below = 1 - slowest["GBps"] / median if median > 0 else 0.0
    slow_nodes = [
        node
        for node, speed in per_node.items()
        if speed < median * (1 - SLOW_LINK_BELOW)
    ]
    ends = [
        node
        for node in (slowest["from_node"], slowest["to_node"])
        if node in slow_nodes
    ]
    return {
        "from_node": slowest["from_node"],
        "to_node": slowest["to_node"],
        "GBps": slowest["GBps"],
        "median_GBps": median,
        "below_median_pct": round(100 * below, 1),
        "named": below > SLOW_LINK_BELOW,
        "node": ends[0] if len(ends) == 1 else None,
    }


def named_link(links: Sequence[Mapping[str, Any]]) -> Result | None:
    """The slowest link when it is slow enough to name, else None."""
    found = slowest_link(links)
    return found if found is not None and found["named"] else None


def size_text(nbytes: int) -> str:
    """4096 -> '4 KiB', 1048576 -> '1 MiB' (nearest unit, no decimals for whole numbers)."""
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"


def rate_text(gbps: float) -> str:
    """A bandwidth in GB/s with three significant digits (0.0238, 1.23, 45.6)."""
    return f"{gbps:.3g}"


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """The printed report: one row per op and size, the latency, the links and the slowest one."""
    world, nodes = result["world_size"], result["nodes"]
    head = (
        f"bandwidth: {result['backend']}, {world} ranks on {nodes} node(s); GB/s = 1e9 bytes/s; "
        "busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather), as nccl-tests"
    )
    lines = [
        head,
        f"  {'op':<11} {'size':>8} {'time':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}",
    ]
    for row in result["collectives"]:
        lines.append(
            f"  {row['op']:<11} {size_text(row['bytes']):>8} {time_text(row['time_s']):>10} "
            f"{rate_text(row['algbw_GBps']):>11} {rate_text(row['busbw_GBps']):>11}"
        )
    smallest = min(
        (row for row in result["collectives"] if row["op"] == "all_reduce"),
        key=_size,
        default=None,
    )
    if smallest is not None:
        lines.append(
            f"  latency: {result['latency_us']:.1f} us (all_reduce of {size_text(smallest['bytes'])})"
        )
    lines += link_lines(result["links"], nodes)
    return lines


def link_lines(links: Sequence[Mapping[str, Any]], nodes: int) -> list[str]:
    """The point-to-point round, and the verdict on its slowest link."""
    if not links:
        return [f"  links: none measured ({nodes} node: no link between nodes)"]
    size = size_text(links[0]["bytes"])
    lines = [
        f"  links (local rank 0 of each node, {size} messages, one pair at a time):"
    ]
    lines += [
        f"    node {link['from_node']} -> node {link['to_node']}: {rate_text(link['GBps'])} GB/s"
        for link in links
    ]
    slow = slowest_link(links)
    assert slow is not None  # links is not empty
    where = f"node {slow['from_node']} -> node {slow['to_node']} at {rate_text(slow['GBps'])} GB/s"
    against = f"{slow['below_median_pct']:.0f}% below the median node link ({rate_text(slow['median_GBps'])} GB/s)"
    if not slow["named"]:
        lines.append(
            f"  no slow link: the slowest, {where}, is {against}; "
            f"a link is named when more than {SLOW_LINK_BELOW:.0%} below"
        )
    elif slow["node"] is not None:
        lines.append(f"  SLOW LINK: node {slow['node']}'s: {where}, {against}")
    else:
        lines.append(f"  SLOW LINK: {where}, {against}")
    return lines


def time_text(seconds: float) -> str:
    """A duration in us, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _size(row: Mapping[str, Any]) -> int:
    return int(row["bytes"])
