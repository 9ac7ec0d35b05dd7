"""The smoke test (`train.py --smoke`): prove the topology before any training.

Each rank contributes rank + 1 to one all_reduce, so the sum must be
world x (world + 1) / 2 on every rank, then all meet at one barrier. A rank
that is unreachable, on a wrong address or port hangs or fails here, in
seconds, instead of in the first training step. Each rank records `started`,
`smoke` (where it ran, the sum it got and expected, the time) and `finished`;
with `bandwidth`, the network check (runtime/bandwidth.py) runs in between.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from runtime.bandwidth import run_bandwidth
from runtime.distributed import RankInfo
from runtime.errors import SetupError
from runtime.events import Event, EventWriter


class SmokeError(SetupError):
    """The all_reduce gave a wrong sum: the ranks disagree about the job."""


def expected_sum(world_size: int) -> int:
    """The all_reduce sum of rank + 1 over every rank."""
    return world_size * (world_size + 1) // 2


def run_smoke(
    rank: RankInfo,
    target: torch.device,
    recorder: EventWriter,
    *,
    bandwidth: bool = False,
    max_bytes: int | None = None,
) -> Event:
    """One all_reduce and one barrier, recorded and printed; a wrong sum raises.

    With `bandwidth`, then the network check, its messages up to `max_bytes`.
    """
    expected = expected_sum(rank.world_size)
    recorder.started(
        local_rank=rank.local_rank,
        node=rank.node_rank,
        device=str(target),
        world_size=rank.world_size,
        launcher=rank.launcher,
        smoke=True,
    )
    start = time.perf_counter()
    # int32: exact, and every HCCL series reduces it
    value = torch.tensor([rank.rank + 1], dtype=torch.int32, device=target)
    dist.all_reduce(value)
    got = int(value.item())
    dist.barrier()
    seconds = time.perf_counter() - start
    ok = got == expected
    event = recorder.emit(
        "smoke",
        node=rank.node_rank,
        local_rank=rank.local_rank,
        world_size=rank.world_size,
        host=socket.gethostname(),
        device=str(target),
        expected=expected,
        got=got,
        ok=ok,
        seconds=round(seconds, 4),
    )
    verdict = "ok" if ok else "WRONG"
    where = f"node {rank.node_rank}, {socket.gethostname()}, {target}"
    print(
        f"smoke rank {rank.rank}/{rank.world_size} ({where}): all_reduce {got} "
        f"(expected {expected}) {verdict}, barrier passed, {seconds:.3f}s",
        flush=True,
    )
    if not ok:
        raise SmokeError(
            f"rank {rank.rank}: all_reduce of rank+1 over {rank.world_size} ranks "
            f"gave {got}, expected {expected}: the ranks disagree about the job "
            "(world size, ranks per node); check every node's launch script"
        )
    if bandwidth:
        run_bandwidth(rank, target, recorder, max_bytes)
    recorder.finished(smoke=True)  # so that monitors count the rank as done
    return event
