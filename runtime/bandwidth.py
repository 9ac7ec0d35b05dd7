"""The network check (`train.py --smoke --bandwidth`): measure with the job's own backend.

After the smoke test every rank runs all_reduce and all_gather over message
sizes from 4 KiB up (to 256 MiB on a device, 16 MiB on the CPU unless asked
for more; never beyond a quarter of the free memory per rank), each size
warmed up, then repeated for about TARGET_S. Then the links (messages of the
largest size, but at least P2P_MIN_BYTES where memory allows): every NPU has its
own NIC, so each local rank of node k sends to the same local rank of node
k+1 and back (the ring closes from 3 nodes). One node pair and direction at a
time; on a device every local rank's transfer runs at once (its own NIC),
on the CPU (gloo) one transfer at a time (the local ranks share the host's
NIC). Each transfer streams for about P2P_TARGET_S (less when there are many,
so the round stays within about LINK_BUDGET_S) in each of P2P_ROUNDS rounds;
bandwidth_report.py judges the rounds. On NPUs each rank opens a
point-to-point communicator with each of its one or two peers (2 x
HCCL_BUFFSIZE of device memory each). Rank 0 records the result as one
`bandwidth` event and prints the table (runtime/bandwidth_report.py has the
definitions and the slow-link rule). Every repeat count is agreed by all ranks
first, so no rank waits on a collective the others never start. Every buffer
starts as zeros: ones reduced again and again overflow float32 (43 all_reduces
of 8 ranks), which on the Atlas training series sets the overflow flag.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import device
from .bandwidth_report import (
    PLAIN_OPS,
    SHARDED_OPS,
    collective_row,
    link_row,
    named_link,
    ring_pairs,
    table_lines,
)
from .distributed import RankInfo
from .events import Event, EventWriter, heartbeat_interval

MIN_BYTES = 4 * 1024
MAX_BYTES = 256 * 1024 * 1024
CPU_MAX_BYTES = 16 * 1024 * 1024  # keeps a CPU simulation's check to seconds
P2P_MAX_BYTES = 64 * 1024 * 1024
# the links' messages, whatever --bandwidth-max-bytes: a round of 64 KiB messages on a
# busy host times the scheduler (rounds 30x apart on loopback here), not the link
P2P_MIN_BYTES = 4 * 1024 * 1024
SIZES = tuple(MIN_BYTES * 2**k for k in range(17))  # 4 KiB .. 256 MiB
WARMUP = 2
TARGET_S = 0.2  # timed per size and op
MIN_REPEATS, MAX_REPEATS = 3, 50
P2P_TARGET_S = 0.2  # timed per transfer and round
P2P_MIN_S = 0.05  # the shortest a transfer is timed, however many there are
P2P_MAX_REPEATS = 1000  # a fast link moves a small message in a millisecond: time it for P2P_TARGET_S still
# a transfer's figure: its median round; a link slow in every round is slow
P2P_ROUNDS = 5
LINK_BUDGET_S = 60.0  # the link round's timed seconds, about, before each transfer is timed for less
MEMORY_SHARE = 4  # the largest message may take a quarter of a rank's free memory

Op = Callable[[], None]


@dataclass(frozen=True)
class Collective:
    """One collective ready to repeat: the call, the buffer it reduces or fills, the bytes it moves."""

    run: Op
    buffer: torch.Tensor
    nbytes: int


@dataclass(frozen=True)
class Place:
    """Where a rank runs: its global rank, node, local rank and device id (None on the CPU)."""

    rank: int
    node: int
    local_rank: int
    device: int | None


@dataclass(frozen=True)
class Transfer:
    """One direction of one link: a rank sends to the same local rank of a neighbouring node."""

    sender: Place
    receiver: Place


def run_bandwidth(
    rank: RankInfo,
    target: torch.device,
    recorder: EventWriter,
    max_bytes: int | None,
    sharded: bool = False,
) -> Event | None:
    """Measure the collectives and the links between nodes; rank 0 records and prints the result.

    `sharded` (training.parallelism zero1 or fsdp2): also reduce_scatter, and all_gather into one
    tensor (all_gather_into_tensor, reduce_scatter_tensor: what fully_shard and ZeRO run).
    """
    # the check takes a while: heartbeats keep the monitor from calling it hung
    recorder.start_heartbeat(heartbeat_interval())
    backend = dist.get_backend()
    limit = max_bytes or (CPU_MAX_BYTES if target.type == "cpu" else MAX_BYTES)
    cap = _memory_cap(target, rank.local_world_size)
    sizes = _agreed_sizes(target, min(limit, cap))
    collectives = []
    for op in SHARDED_OPS if sharded else PLAIN_OPS:
        for size in sizes:
            collective = _collective(
                op, size, rank.world_size, target, backend, sharded
            )
            seconds = _timed(collective.run, target)
            collectives.append(
                collective_row(op, collective.nbytes, seconds, rank.world_size)
            )
            del collective
    places = _places(rank, target)
    # an NPU has a NIC of its own; the CPU ranks of a node share the host's
    at_once = backend != "gloo"
    transfers = link_transfers(places)
    steps = link_steps(transfers, at_once)
    link_bytes = _agreed_sizes(
        target, min(max(limit, P2P_MIN_BYTES), P2P_MAX_BYTES, cap)
    )[-1]
    links = _link_round(rank, target, transfers, steps, link_bytes)
    if not rank.is_main:
        return None
    latency = next(row["time_s"] for row in collectives if row["op"] == "all_reduce")
    result = {
        "backend": backend,
        "world_size": rank.world_size,
        "nodes": len({place.node for place in places}),
        "collectives": collectives,
        "latency_us": latency * 1e6,
        "links": links,
        "link_mode": "local ranks at once" if at_once else "one at a time",
        "slowest_link": named_link(links),
    }
    print("\n".join(table_lines(result)), flush=True)
    return recorder.emit("bandwidth", **result)


def _agreed_sizes(target: torch.device, limit: int) -> tuple[int, ...]:
    """The sizes every rank can hold: up to the smallest rank's limit, at least the smallest size."""
    count = torch.tensor(
        [sum(1 for size in SIZES if size <= limit) or 1],
        dtype=torch.int32,
        device=target,
    )
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    return SIZES[: int(count.item())]


def _memory_cap(target: torch.device, local_ranks: int) -> int:
    """The largest message this rank should allocate: a share of the free memory it may use."""
    if target.type == "cpu":
        free = _available_host_memory() // max(1, local_ranks)
    else:
        module = device.npu_module() if target.type == "npu" else torch.cuda
        free, _total = module.mem_get_info(target)
    return free // MEMORY_SHARE


def _available_host_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return MAX_BYTES * MEMORY_SHARE  # no /proc/meminfo: the default sizes


def _collective(
    op: str,
    size: int,
    world: int,
    target: torch.device,
    backend: str,
    into_one_tensor: bool = False,
) -> Collective:
    """The operation on float32 zeros of about `size` bytes, and the bytes it really moves.

    Zeros: the check repeats an all_reduce in place up to WARMUP + MAX_REPEATS
    times, and ones would grow as world ** repeats, past float32's range.
    """
    if op == "all_reduce":
        buffer = torch.zeros(size // 4, dtype=torch.float32, device=target)
        return Collective(lambda: dist.all_reduce(buffer), buffer, buffer.numel() * 4)
    part = max(1, size // 4 // world)
    given = torch.zeros(part, dtype=torch.float32, device=target)
    gathered = torch.zeros(part * world, dtype=torch.float32, device=target)
    views = list(gathered.chunk(world))
    if op == "reduce_scatter":
        # the whole input reduced, each rank keeping its part: a sharded gradient step
        return Collective(
            lambda: dist.reduce_scatter_tensor(given, gathered),
            gathered,
            gathered.numel() * 4,
        )

    def run() -> None:
        # gloo has no all_gather_into_tensor on older torch: views of one buffer,
        # unless the project shards (then its torch runs the into-one-tensor form)
        if backend == "gloo" and not into_one_tensor:
            dist.all_gather(views, given)
        else:
            dist.all_gather_into_tensor(gathered, given)

    return Collective(run, gathered, gathered.numel() * 4)


def _timed(run: Op, target: torch.device) -> float:
    """The mean seconds of one `run`, the slowest rank's, after WARMUP runs."""
    start = time.perf_counter()
    for _ in range(WARMUP):
        run()
    _synchronize(target)
    warm = _slowest(time.perf_counter() - start, target) / WARMUP
    repeats = _repeats(warm, TARGET_S)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    _synchronize(target)
    return _slowest(time.perf_counter() - start, target) / repeats


def _repeats(seconds_each: float, target_s: float, most: int = MAX_REPEATS) -> int:
    """How many repeats fill about `target_s`, within MIN_REPEATS..`most`."""
    wanted = math.ceil(target_s / seconds_each) if seconds_each > 0 else most
    return max(MIN_REPEATS, min(most, wanted))


def _slowest(seconds: float, target: torch.device) -> float:
    """The largest of every rank's `seconds` (an all_reduce MAX: it also lines the ranks up)."""
    value = torch.tensor([seconds], dtype=torch.float32, device=target)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _synchronize(target: torch.device) -> None:
    """Wait for the device's queued work: a host timer alone would time only the launches."""
    if target.type == "npu":
        device.npu_module().synchronize()
    elif target.type != "cpu":
        torch.cuda.synchronize()


def _places(rank: RankInfo, target: torch.device) -> list[Place]:
    """Every rank's node, local rank and device, by global rank (whatever order the launcher gave ranks)."""
    mine = torch.tensor(
        [rank.node_rank, rank.local_rank, device_id(target)],
        dtype=torch.int32,
        device=target,
    )
    everyone = [torch.zeros_like(mine) for _ in range(rank.world_size)]
    dist.all_gather(everyone, mine)
    return [
        Place(index, node, local, None if found < 0 else found)
        for index, (node, local, found) in enumerate(t.tolist() for t in everyone)
    ]


def device_id(target: torch.device) -> int:
    """The node's id of the rank's device (as ASCEND_RT_VISIBLE_DEVICES numbers them), -1 on the CPU."""
    if target.index is None:
        return -1
    names = (
        "ASCEND_RT_VISIBLE_DEVICES" if target.type == "npu" else "CUDA_VISIBLE_DEVICES"
    )
    visible = [part.strip() for part in os.environ.get(names, "").split(",")]
    if target.index < len(visible) and visible[target.index].isdigit():
        return int(visible[target.index])
    return target.index


def link_transfers(places: list[Place]) -> list[Transfer]:
    """Each node pair of the ring, each way, each local rank the two nodes share: node order, then local rank."""
    where = {(place.node, place.local_rank): place for place in places}
    nodes = sorted({place.node for place in places})
    transfers = []
    for a, b in ring_pairs(len(nodes)):
        for sender, receiver in ((nodes[a], nodes[b]), (nodes[b], nodes[a])):
            shared = sorted(
                local
                for node, local in where
                if node == sender and (receiver, local) in where
            )
            transfers += [
                Transfer(where[sender, local], where[receiver, local])
                for local in shared
            ]
    return transfers


def link_steps(transfers: list[Transfer], at_once: bool) -> list[list[int]]:
    """The transfers (by index) timed together: a node pair's direction at once, or each alone."""
    if not at_once:
        return [[index] for index in range(len(transfers))]
    steps: dict[tuple[int, int], list[int]] = {}
    for index, transfer in enumerate(transfers):
        key = (transfer.sender.node, transfer.receiver.node)
        steps.setdefault(key, []).append(index)
    return list(steps.values())


def link_target_s(steps: int) -> float:
    """Seconds to time each step of each round: P2P_TARGET_S, less when the round would pass LINK_BUDGET_S."""
    if steps == 0:
        return P2P_TARGET_S
    return max(P2P_MIN_S, min(P2P_TARGET_S, LINK_BUDGET_S / (steps * P2P_ROUNDS)))


def _link_round(
    rank: RankInfo,
    target: torch.device,
    transfers: list[Transfer],
    steps: list[list[int]],
    nbytes: int,
) -> list[dict]:
    """Every transfer, step by step, P2P_ROUNDS times (every other round backwards); every rank gets every result."""
    if not transfers:  # one node: no link between nodes to measure
        return []
    message = torch.zeros(nbytes // 4, dtype=torch.float32, device=target)
    # float32: the Atlas training series' HCCL reduces no float64
    seconds = torch.zeros(
        len(transfers), P2P_ROUNDS, dtype=torch.float32, device=target
    )
    target_s = link_target_s(len(steps))
    for round_ in range(P2P_ROUNDS):
        for step in steps if round_ % 2 == 0 else steps[::-1]:
            mine = next(
                (
                    index
                    for index in step
                    if rank.rank
                    in (transfers[index].sender.rank, transfers[index].receiver.rank)
                ),
                None,
            )
            transfer = None if mine is None else transfers[mine]
            taken = _one_way(rank.rank, transfer, message, target, target_s)
            if mine is not None and taken is not None:
                seconds[mine, round_] = taken
    dist.all_reduce(seconds)  # only the sender of each transfer filled its row
    measured = seconds.tolist()
    return [
        link_row(
            transfer.sender.node,
            transfer.receiver.node,
            message.numel() * 4,
            measured[index],
            local_rank=transfer.sender.local_rank,
            devices=(transfer.sender.device, transfer.receiver.device),
        )
        for index, transfer in enumerate(transfers)
    ]


def _one_way(
    me: int,
    transfer: Transfer | None,
    message: torch.Tensor,
    target: torch.device,
    target_s: float,
) -> float | None:
    """The sender's mean seconds per message, sending a stream until the receiver's ack; None elsewhere.

    Every rank takes part in the agreed repeat count and the barrier, whether
    or not `transfer` (its own in this step) is None.
    """
    ack = torch.zeros(1, dtype=torch.int32, device=target)
    sender = transfer.sender.rank if transfer else -1
    receiver = transfer.receiver.rank if transfer else -1

    def stream(count: int) -> float:
        start = time.perf_counter()
        if me == sender:
            for _ in range(count):
                dist.send(message, receiver)
            dist.recv(ack, receiver)
        elif me == receiver:
            for _ in range(count):
                dist.recv(message, sender)
            dist.send(ack, sender)
        _synchronize(target)
        return (time.perf_counter() - start) / count

    warm = _slowest(stream(WARMUP) if transfer else 0.0, target)
    repeats = _repeats(warm, target_s, P2P_MAX_REPEATS)
    dist.barrier()
    taken = stream(repeats) if transfer else 0.0
    return taken if me == sender else None
