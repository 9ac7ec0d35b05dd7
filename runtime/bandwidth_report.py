"""The network check's figures (`--smoke --bandwidth`): bus bandwidth, the slow link, the table.

No torch here: the ranks measure (runtime/bandwidth.py) and the runner on
node 0 reads the result from rank 0's `bandwidth` event.

Definitions (nccl-tests' doc/PERFORMANCE.md):
- size: the bytes of the whole message: all_reduce's buffer, all_gather's
  output (each of the n ranks gives size / n), reduce_scatter's input (each
  rank keeps size / n of the sum);
- time: the mean time of one operation, the slowest rank's;
- algbw = size / time;
- busbw = algbw x 2(n-1)/n for all_reduce and algbw x (n-1)/n for all_gather
  and reduce_scatter:
  the bytes each rank's link carries per second, which can be held against
  the hardware's link speed whatever n is.

The links: each local rank of node k sends to the same local rank of node
k+1 and back (the ring closes for 3 nodes or more): every NPU has its own NIC.
Each transfer is timed in several rounds: its figure is its median round. On a
busy host one round of a transfer runs up to 30x slower or faster than the
next (small messages on loopback, seen here), so no single round decides.
Each node's link speed is the median of the figures of the transfers it took
part in, and the median of those over the nodes is the speed a healthy link
reaches: a slow node drags down its own figure and half of its two
neighbours', so from 3 nodes on the median stays a healthy one (with 2 nodes
it is the median of all transfers). A transfer is slow when even its best
round is more than SLOW_LINK_BELOW below that median: a link that is really
wrong (a port at a lower negotiated rate, a shaped or broken link) is slow in
every round, while on a quiet but busy loopback the slowest transfer's best
round stayed above the median in every run measured here
(benchmarks/bandwidth_quiet_runs.py). The transfer with the slowest best round
is the one named, with the devices (node, local rank, device id) for which the
median of their transfers' best rounds is that far below; with 2 nodes both
ends of a link take part in the same transfers only, so a slow link names
both.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

GB = 1e9
OPS = ("all_reduce", "all_gather", "reduce_scatter")
# a project that shards (training.parallelism zero1 or fsdp2) gathers parameters and scatters
# gradients: its check measures those two as the training loop runs them (into one tensor)
SHARDED_OPS = ("all_reduce", "all_gather", "reduce_scatter")
PLAIN_OPS = ("all_reduce", "all_gather")
SLOW_LINK_BELOW = 0.5  # named when below the median by more than this fraction of it

Result = dict[str, Any]


def bus_factor(op: str, world_size: int) -> float:
    """busbw / algbw for `op` over `world_size` ranks (nccl-tests' definitions)."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
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


def link_row(
    from_node: int,
    to_node: int,
    nbytes: int,
    rounds_s: Sequence[float],
    local_rank: int = 0,
    devices: tuple[int | None, int | None] = (None, None),
) -> Result:
    """One point-to-point transfer from a local rank of one node to the same local rank of another, in GB/s.

    `rounds_s` holds the seconds per message of each round; GBps is the median round's, best_GBps the fastest's.
    """
    time_s = statistics.median(rounds_s)
    return {
        "from_node": from_node,
        "to_node": to_node,
        "local_rank": local_rank,
        "from_device": devices[0],
        "to_device": devices[1],
        "bytes": nbytes,
        "time_s": time_s,
        "GBps": _rate(nbytes, time_s),
        "rounds_GBps": [_rate(nbytes, seconds) for seconds in rounds_s],
        "best_GBps": _rate(nbytes, min(rounds_s)),
    }


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else 0.0


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """The node pairs of the point-to-point round: k and k+1, the ring closed for 3 nodes or more."""
    pairs = [(k, k + 1) for k in range(nodes - 1)]
    return pairs + [(nodes - 1, 0)] if nodes > 2 else pairs


def slowest_link(links: Sequence[Mapping[str, Any]]) -> Result | None:
    """The transfer with the slowest best round, how far below the median node link, whether to name it, the slow devices."""
    if not links:
        return None
    best = {id(link): best_round(link) for link in links}
    by_node: dict[int, list[float]] = {}
    by_device: dict[tuple[int, int], list[float]] = {}
    devices: dict[tuple[int, int], Any] = {}
    for link in links:
        for end in ("from", "to"):
            key = (link[f"{end}_node"], link.get("local_rank", 0))
            by_node.setdefault(key[0], []).append(link["GBps"])
            by_device.setdefault(key, []).append(best[id(link)])
            devices[key] = link.get(f"{end}_device")
    median = statistics.median(statistics.median(speeds) for speeds in by_node.values())
    per_device = {key: statistics.median(speeds) for key, speeds in by_device.items()}
    slowest = min(links, key=lambda link: best[id(link)])
    below = 1 - best[id(slowest)] / median if median > 0 else 0.0
    slow = sorted(
        key
        for key, speed in per_device.items()
        if speed < median * (1 - SLOW_LINK_BELOW)
    )
    local = slowest.get("local_rank", 0)
    ends = [
        key
        for key in ((slowest["from_node"], local), (slowest["to_node"], local))
        if key in slow
    ]

    def place(key: tuple[int, int]) -> Result:
        return {"node": key[0], "local_rank": key[1], "device": devices[key]}

    return {
        "from_node": slowest["from_node"],
        "to_node": slowest["to_node"],
        "local_rank": local,
        "from_device": slowest.get("from_device"),
        "to_device": slowest.get("to_device"),
        "GBps": slowest["GBps"],
        "best_GBps": best[id(slowest)],
        "median_GBps": median,
        "below_median_pct": round(100 * below, 1),
        "named": below > SLOW_LINK_BELOW,
        "node": ends[0][0] if len(ends) == 1 else None,
        "device": place(ends[0]) if len(ends) == 1 else None,
        "slow_devices": [place(key) for key in slow],
    }


def best_round(link: Mapping[str, Any]) -> float:
    """The link's fastest round in GB/s (its only figure when it has no rounds)."""
    return max(link.get("rounds_GBps") or [link["GBps"]])


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
        "busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather, reduce_scatter), as nccl-tests"
    )
    width = max([11, *(len(str(row["op"])) for row in result["collectives"])])
    lines = [
        head,
        f"  {'op':<{width}} {'size':>8} {'time':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}",
    ]
    for row in result["collectives"]:
        lines.append(
            f"  {row['op']:<{width}} {size_text(row['bytes']):>8} {time_text(row['time_s']):>10} "
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
    lines += link_lines(result["links"], nodes, result.get("link_mode", ""))
    return lines


def link_lines(
    links: Sequence[Mapping[str, Any]], nodes: int, mode: str = ""
) -> list[str]:
    """The point-to-point round, one line per node pair and direction, and the verdict on its slowest link."""
    if not links:
        return [f"  links: none measured ({nodes} node: no link between nodes)"]
    size = size_text(links[0]["bytes"])
    how = f"; {mode}" if mode else ""
    lines = [
        f"  links (each local rank to the same local rank of the next node, {size} messages{how}):"
    ]
    ways: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for link in links:
        ways.setdefault((link["from_node"], link["to_node"]), []).append(link)
    for (sender, receiver), found in ways.items():
        speeds = ", ".join(rate_text(link["GBps"]) for link in found)
        ranks = ", ".join(str(link.get("local_rank", 0)) for link in found)
        plural = "s" if len(found) > 1 else ""
        lines.append(
            f"    node {sender} -> node {receiver}: {speeds} GB/s (local rank{plural} {ranks})"
        )
    slow = slowest_link(links)
    assert slow is not None  # links is not empty
    where = f"{link_text(slow)} at {rate_text(slow['GBps'])} GB/s (best round {rate_text(slow['best_GBps'])})"
    against = f"{slow['below_median_pct']:.0f}% below the median node link ({rate_text(slow['median_GBps'])} GB/s)"
    if not slow["named"]:
        return lines + [
            (
                f"  no slow link: the slowest, {where}, is {against}; "
                f"a link is named when more than {SLOW_LINK_BELOW:.0%} below"
            )
        ]
    if slow["device"] is not None:
        lines.append(f"  SLOW LINK: {place_text(slow['device'])}'s: {where}, {against}")
    else:
        lines.append(f"  SLOW LINK: {where}, {against}")
    if slow["slow_devices"]:
        devices = ", ".join(place_text(place) for place in slow["slow_devices"])
        lines.append(
            f"  slow devices (their links' median more than {SLOW_LINK_BELOW:.0%} below): {devices}"
        )
    return lines


def link_text(link: Mapping[str, Any]) -> str:
    """node 0 -> node 1 (local rank 2), with the device ids where the ranks ran on devices."""
    ends = (link.get("from_device"), link.get("to_device"))
    devices = f", device {ends[0]} -> {ends[1]}" if None not in ends else ""
    return f"node {link['from_node']} -> node {link['to_node']} (local rank {link.get('local_rank', 0)}{devices})"


def place_text(place: Mapping[str, Any]) -> str:
    """node 1 local rank 2, with its device id where it ran on a device."""
    device = f" (device {place['device']})" if place.get("device") is not None else ""
    return f"node {place['node']} local rank {place['local_rank']}{device}"


def time_text(seconds: float) -> str:
    """A duration in us, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _size(row: Mapping[str, Any]) -> int:
    return int(row["bytes"])
