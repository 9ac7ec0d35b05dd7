"""What the stop-signal check costs the generated train.py: one all_reduce of one integer per logged window.

Every rank of a gloo CPU job (torch.multiprocessing, --ranks processes on this
host) trains the demo's MLP with DDP (batch 16, 64 features) in windows of
--log-every steps; each window ends with `runtime.preemption.agree` (the
check train.py makes) or, in the other half of the windows, without it. The
medians of both window times and of the check alone are printed, and the check's
share of a window.

Measured here (2 cores shared with other test suites, load 12-18, 4 ranks on 2
cores, --log-every 10, --windows 20): the check alone 10.1 ms median (gloo's
latency when 4 processes share 2 busy cores), a window 273 ms without it and 356 ms
with it: the 83 ms between them is mostly the noise of the loaded machine (the check
itself is 3.7% of a window here). There is no collective of its own in the loop to
fold the flag into (DDP's gradient all_reduce is per step and internal), so the check
is this one added all_reduce of 4 bytes per logged window, none per step; on an NPU
HCCL moves 4 bytes in microseconds, against windows of LOG_EVERY whole steps.

    python benchmarks/preemption_flag.py [--ranks 4] [--log-every 10] [--windows 60]
    python benchmarks/preemption_flag.py --smoke   # 2 ranks, 1 window of each kind (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rank(rank: int, world: int, port: int, log_every: int, windows: int, queue: object) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runtime import preemption

    torch.set_num_threads(1)  # as many ranks as cores, or more: no rank fights itself for them
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(16, 64), torch.randint(0, 10, (16,))
    with_check, without, check_alone = [], [], []
    for window in range(2 * windows + 2):
        start = time.perf_counter()
        for _ in range(log_every):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        checked = window % 2 == 0
        if checked:
            before = time.perf_counter()
            preemption.agree(torch.device("cpu"))
            check_alone.append(time.perf_counter() - before)
        if window >= 2:  # the first two warm up
            (with_check if checked else without).append(time.perf_counter() - start)
    if rank == 0:
        queue.put((statistics.median(with_check), statistics.median(without), statistics.median(check_alone)))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the job, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="2 ranks, 1 window of each kind after the warm-up")
    args = parser.parse_args(argv)
    if args.smoke:
        args.ranks, args.windows = 2, 1
    import torch.multiprocessing as mp

    from tests.runs import free_port

    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(_rank, args=(args.ranks, free_port(), args.log_every, args.windows, queue), nprocs=args.ranks)
    with_check, without, check = queue.get()
    print(f"{args.ranks} gloo ranks, windows of {args.log_every} DDP steps (median of {args.windows} each):")
    print(f"  window with the stop check    {with_check * 1e3:8.2f} ms")
    print(f"  window without it             {without * 1e3:8.2f} ms")
    print(f"  the check alone (all_reduce)  {check * 1e3:8.3f} ms = {100 * check / without:.2f}% of a window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
