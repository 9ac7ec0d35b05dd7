"""The smoke test (`train.py --smoke`): prove the topology before any training.

For a project that runs the user's own script, the launch scripts start
`python -m runtime.smoke --launcher L --device D [--bandwidth ...]` instead of
that script: the same launcher and environment, npu-wizard's own rank set-up.

Each rank contributes rank + 1 to one all_reduce, so the sum must be
world x (world + 1) / 2 on every rank, then all meet at one barrier. A rank
that is unreachable, on a wrong address or port hangs or fails here, in
seconds, instead of in the first training step. Each rank records `started`,
`smoke` (where it ran, the sum it got and expected, the time) and `finished`;
with `bandwidth`, the network check (runtime/bandwidth.py) runs in between.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import device, distributed, events
from .bandwidth import run_bandwidth
from .distributed import RankInfo
from .errors import SetupError
from .events import Event, EventWriter


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
    sharded: bool = False,
) -> Event:
    """One all_reduce and one barrier, recorded and printed; a wrong sum raises.

    With `bandwidth`, then the network check, its messages up to `max_bytes` (with
    `sharded`, the collectives of a project that shards too).
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
        run_bandwidth(rank, target, recorder, max_bytes, sharded)
    recorder.finished(smoke=True)  # so that monitors count the rank as done
    return event


DEFAULT_EXEC_TIMEOUT_S = (
    1836  # HCCL_EXEC_TIMEOUT's default; the launch scripts export the project's
)


def main(argv: list[str] | None = None) -> None:
    """One rank of the smoke test outside train.py: bind the device, join the group, check."""
    parser = argparse.ArgumentParser(
        prog="python -m runtime.smoke", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--launcher", choices=distributed.LAUNCHERS, required=True)
    parser.add_argument("--device", choices=device.REQUESTS, default="auto")
    parser.add_argument(
        "--local-rank", "--local_rank", type=int
    )  # torch.distributed.launch passes it
    parser.add_argument(
        "--smoke", action="store_true", help="accepted: this is the smoke test"
    )
    parser.add_argument(
        "--bandwidth", action="store_true", help="then the network check"
    )
    parser.add_argument(
        "--bandwidth-max-bytes", type=int, help="largest message of --bandwidth"
    )
    args = parser.parse_args(argv)
    if args.launcher == "mp-spawn":
        parser.error("mp-spawn starts its ranks from train.py itself: pick torchrun")
    rank = distributed.rank_info(
        args.launcher,
        local_rank=args.local_rank,
        nnodes=distributed.env_int("NNODES", 1),
        nproc_per_node=distributed.env_int("NPROC_PER_NODE", 1),
    )
    run_dir = events.resolve_run_dir(None, Path(os.getcwd()))
    events.tee_output(run_dir, rank.rank)
    recorder = events.EventWriter(run_dir, rank.rank)
    with recorder.recording():
        choice = device.select_device(device.requested_device(None, args.device))
        target = device.bind_device(choice, rank.local_rank, rank.local_world_size)
        exec_timeout_s = distributed.env_int(
            "HCCL_EXEC_TIMEOUT", DEFAULT_EXEC_TIMEOUT_S
        )
        distributed.init_process_group(
            rank, choice.backend, distributed.process_group_timeout_s(exec_timeout_s)
        )
        print(
            f"rank {rank.rank}/{rank.world_size}: {target} with {choice.backend} ({choice.reason})",
            flush=True,
        )
        try:
            run_smoke(
                rank,
                target,
                recorder,
                bandwidth=args.bandwidth,
                max_bytes=args.bandwidth_max_bytes,
            )
        finally:
            distributed.destroy_process_group()


if __name__ == "__main__":
    main()
