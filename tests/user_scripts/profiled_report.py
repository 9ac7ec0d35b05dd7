"""A user's DDP script that reports its steps (runtime.report): `npu-wizard run --profile` profiles it as it is.

`--steps N` steps (0: until stopped) of a small MLP on random data, each
reported with its loss and its forward time. NPU_WIZARD_TEST_SLOW_OP_RANK
(test-only) names a rank whose forward also runs `test_slow_op`, a sleep of
NPU_WIZARD_TEST_SLOW_OP_S seconds (default 0.05) inside a record_function
of that name: slower in a way both the monitor (forward_s) and a profiler
(an operator of its own) can see.
"""

import argparse
import itertools
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from runtime import report

SLOW_RANK = int(os.environ.get("NPU_WIZARD_TEST_SLOW_OP_RANK", "-1"))  # test-only
SLOW_S = float(os.environ.get("NPU_WIZARD_TEST_SLOW_OP_S", "0.05"))  # test-only


def forward(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, rank: int) -> torch.Tensor:
    if rank == SLOW_RANK:
        with torch.profiler.record_function("test_slow_op"):
            time.sleep(SLOW_S)
    return F.cross_entropy(model(inputs), targets)


def main() -> None:
    parser = argparse.ArgumentParser(description="a user's DDP script with report calls")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = itertools.count(1) if args.steps == 0 else range(1, args.steps + 1)
    for step in steps:
        inputs, targets = torch.randn(16, 32), torch.randint(0, 4, (16,))
        optimizer.zero_grad()
        started = time.perf_counter()
        loss = forward(model, inputs, targets, rank)
        forward_s = time.perf_counter() - started
        loss.backward()
        optimizer.step()
        report.step(step, loss=loss, samples=16, forward_s=forward_s, total_steps=args.steps or None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
