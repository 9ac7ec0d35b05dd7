"""The network check (`train.py --smoke --bandwidth`): measure with the job's own backend.

After the smoke test every rank runs all_reduce and all_gather over message
sizes from 4 KiB up (to 256 MiB on a device, 16 MiB on the CPU unless asked
for more; never beyond a quarter of the free memory per rank), each size
warmed up, then repeated for about TARGET_S; then local rank 0 of each node
sends to the next node's and back, one pair at a time, each way for about
P2P_TARGET_S, in P2P_ROUNDS rounds of which each direction's faster counts. Rank 0 records the
result as one `bandwidth` event and prints the table (runtime/bandwidth_report.py
has the definitions). Every repeat count is agreed by all ranks first, so no
rank waits on a collective the others never start.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from runtime import device
from runtime.bandwidth_report import (
    collective_row,
    link_row,
    named_link,
    ring_pairs,
    table_lines,
)
from runtime.distributed import RankInfo
from runtime.events import Event, EventWriter, heartbeat_interval

MIN_BYTES = 4 * 1024
MAX_BYTES = 256 * 1024 * 1024
CPU_MAX_BYTES = 16 * 1024 * 1024  # keeps a CPU simulation's check to seconds
P2P_MAX_BYTES = 64 * 1024 * 1024
SIZES = tuple(MIN_BYTES * 2**k for k in range(17))  # 4 KiB .. 256 MiB
WARMUP = 2
TARGET_S = 0.2  # timed per size and op
P2P_TARGET_S = 0.5  # timed per direction
MIN_REPEATS, MAX_REPEATS = 3, 50
P2P_MAX_REPEATS = 1000  # a fast link moves a small message in a millisecond: time it for P2P_TARGET_S still
P2P_ROUNDS = 2  # each direction's faster round counts: a busy host slows one round, a slow link both
MEMORY_SHARE = 4  # the largest message may take a quarter of a rank's free memory

Op = Callable[[], None]


def run_bandwidth(
    rank: RankInfo, target: torch.device, recorder: EventWriter, max_bytes: int | None
) -> Event | None:
    """Measure the collectives and the links between nodes; rank 0 records and prints the result."""
    # the check takes a while: heartbeats keep the monitor from calling it hung
    recorder.start_heartbeat(heartbeat_interval())
    backend = dist.get_backend()
    limit = max_bytes or (CPU_MAX_BYTES if target.type == "cpu" else MAX_BYTES)
    sizes = _agreed_sizes(
        target, min(limit, _memory_cap(target, rank.local_world_size))
    )
    collectives = []
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            run, nbytes = _collective(op, size, rank.world_size, target, backend)
            seconds = _timed(run, target)
            collectives.append(collective_row(op, nbytes, seconds, rank.world_size))
            del run
    leaders = _node_leaders(rank, target)
    links = _link_round(rank, target, leaders, min(sizes[-1], P2P_MAX_BYTES))
    if not rank.is_main:
        return None
    latency = next(row["time_s"] for row in collectives if row["op"] == "all_reduce")
    result = {
        "backend": backend,
        "world_size": rank.world_size,
        "nodes": len(leaders),
        "collectives": collectives,
        "latency_us": latency * 1e6,
        "links": links,
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
    op: str, size: int, world: int, target: torch.device, backend: str
) -> tuple[Op, int]:
    """The operation on float32 buffers of about `size` bytes, and the bytes it really moves."""
    if op == "all_reduce":
        buffer = torch.ones(size // 4, dtype=torch.float32, device=target)
        return (lambda: dist.all_reduce(buffer)), buffer.numel() * 4
    part = max(1, size // 4 // world)
    given = torch.ones(part, dtype=torch.float32, device=target)
    gathered = torch.empty(part * world, dtype=torch.float32, device=target)
    # gloo has no all_gather_into_tensor on older torch: views of one buffer
    if backend == "gloo":
        views = list(gathered.chunk(world))
        return (lambda: dist.all_gather(views, given)), gathered.numel() * 4
    return (lambda: dist.all_gather_into_tensor(gathered, given)), gathered.numel() * 4


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


def _node_leaders(rank: RankInfo, target: torch.device) -> list[int]:
    """The global rank of local rank 0 of each node, in node order (whatever order the launcher gave ranks)."""
    mine = torch.tensor(
        [rank.node_rank, rank.local_rank], dtype=torch.int32, device=target
    )
    everyone = [torch.zeros_like(mine) for _ in range(rank.world_size)]
    dist.all_gather(everyone, mine)
    found = {
        int(node): index
        for index, (node, local) in enumerate(t.tolist() for t in everyone)
        if local == 0
    }
    return [found[node] for node in sorted(found)]


def _link_round(
    rank: RankInfo, target: torch.device, leaders: list[int], nbytes: int
) -> list[dict]:
    """Node k to node k+1 and back, one transfer at a time, P2P_ROUNDS times; every rank gets every result."""
    directions = [way for a, b in ring_pairs(len(leaders)) for way in ((a, b), (b, a))]
    if not directions:  # one node: no link between nodes to measure
        return []
    message = torch.ones(nbytes // 4, dtype=torch.float32, device=target)
    seconds = torch.zeros(len(directions), dtype=torch.float32, device=target)
    for _ in range(P2P_ROUNDS):
        for index, (sender, receiver) in enumerate(directions):
            taken = _one_way(
                rank.rank, leaders[sender], leaders[receiver], message, target
            )
            if taken is not None:
                seconds[index] = (
                    min(taken, float(seconds[index])) if seconds[index] > 0 else taken
                )
    dist.all_reduce(seconds)  # only the sender of each direction filled its entry
    measured = seconds.tolist()
    return [
        link_row(sender, receiver, message.numel() * 4, measured[index])
        for index, (sender, receiver) in enumerate(directions)
    ]


def _one_way(
    me: int, sender: int, receiver: int, message: torch.Tensor, target: torch.device
) -> float | None:
    """The sender's mean seconds per message, sending a stream until the receiver's ack; None elsewhere."""
    ack = torch.zeros(1, dtype=torch.int32, device=target)

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

    warm = _slowest(stream(WARMUP) if me in (sender, receiver) else 0.0, target)
    repeats = _repeats(warm, P2P_TARGET_S, P2P_MAX_REPEATS)
    dist.barrier()
    taken = stream(repeats) if me in (sender, receiver) else 0.0
    return taken if me == sender else None
