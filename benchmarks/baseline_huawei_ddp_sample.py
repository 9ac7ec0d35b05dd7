"""Baseline: the single-node DDP sample of Ascend's PyTorch migration guide, run on the CPU.

Written for benchmarks/training_throughput.py in the style of that sample, not
copied from it: `mp.spawn` starts one worker per device; each worker joins the
process group with its local rank as the rank, moves an MLP to its device,
wraps it in DDP, and trains from a Dataset through DistributedSampler and a
DataLoader (the sample's batch split, worker count and pin_memory), printing
`loss.item()` every 100 steps.

Adapted only where it must be to run here:
- backend `gloo` and device `cpu` instead of `hccl` and `npu:<rank>`, so no
  `torch_npu.npu.set_device` and no `device_ids` for DDP;
- in-memory MNIST-shaped data (random 1x28x28 images and labels in a
  TensorDataset, cheaper per sample than torchvision's MNIST, which makes a
  PIL image and then a tensor of each) instead of a download; `--input-shape`
  and `--hidden` let the benchmark give it the generated project's sizes;
- the labels stay int64: the sample casts them to int32 for the NPU, which
  CPU cross-entropy refuses;
- `--timings` (benchmark only): rank 0 notes (step, epoch, time) at each print
  it already makes (after `loss.item()`, so it adds no synchronisation) and
  writes them to a JSON file at the end; `--print-every` (benchmark only)
  prints more often than every 100 steps, for the benchmark's tiny smoke runs.

    python benchmarks/baseline_huawei_ddp_sample.py --nprocs 2 --batch_size 64
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class NeuralNetwork(nn.Module):
    """The sample's network: flatten, then a stack of linear layers with ReLU."""

    def __init__(self, in_features: int, hidden: int, classes: int = 10) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores for a batch of images."""
        x = self.flatten(x)
        return self.linear_relu_stack(x)


def make_training_data(samples: int, shape: tuple[int, ...]) -> TensorDataset:
    """MNIST-shaped data held in memory: random images in [0, 1) and labels 0-9."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(samples, *shape, generator=generator)
    labels = torch.randint(10, (samples,), generator=generator)
    return TensorDataset(images, labels)


def ddp_setup(rank: int, world_size: int, port: str) -> None:
    """Join the process group; the sample passes the local rank as the rank."""
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)  # hccl on NPU


def train(
    train_loader: DataLoader,
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    loc: str,
    timings: list[tuple[int, int, float]],
    print_every: int = 100,
) -> None:
    """One epoch of the sample's loop: forward, loss, backward, step; print every 100 steps."""
    size = len(train_loader.dataset)
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images, target = images.to(loc, non_blocking=False), target.to(loc, non_blocking=False)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_every == 0:
            loss, current = loss.item(), i * len(target)
            timings.append((epoch * len(train_loader) + i + 1, epoch, time.perf_counter()))
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]", flush=True)


def main_worker(gpu: int, ngpus_per_node: int, args: argparse.Namespace) -> None:
    """One spawned worker: set up DDP, the data and the model, then train."""
    ddp_setup(gpu, args.world_size, args.port)
    batch_size = int(args.batch_size / ngpus_per_node)
    workers = int((ngpus_per_node + ngpus_per_node - 1) / ngpus_per_node)
    shape = tuple(int(part) for part in args.input_shape.split(","))
    training_data = make_training_data(args.samples, shape)
    train_sampler = DistributedSampler(training_data)
    train_loader = DataLoader(
        training_data,
        batch_size=batch_size,
        shuffle=(train_sampler is None),
        num_workers=workers,
        pin_memory=False,
        sampler=train_sampler,
        drop_last=True,
    )
    loc = "cpu"  # 'npu:{}'.format(gpu) on NPU
    model = NeuralNetwork(torch.Size(shape).numel(), args.hidden).to(loc)
    criterion = nn.CrossEntropyLoss().to(loc)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model = DDP(model)  # device_ids=[gpu] on NPU
    timings: list[tuple[int, int, float]] = []
    for epoch in range(args.epochs):
        print("curr epoch: ", epoch, flush=True)
        train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, loc, timings, args.print_every)
    if gpu == 0 and args.timings:
        with open(args.timings, "w", encoding="utf-8") as file:
            json.dump({"batch_size": batch_size, "world_size": args.world_size, "points": timings}, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--batch_size", default=64, type=int, help="global batch, split over the processes")
    parser.add_argument("--epochs", default=5, type=int)
    parser.add_argument("--nprocs", default=2, type=int, help="torch.npu.device_count() on NPU")
    parser.add_argument("--samples", default=60000, type=int)
    parser.add_argument("--input-shape", default="1,28,28", help="comma-separated sample shape")
    parser.add_argument("--hidden", default=512, type=int)
    parser.add_argument("--port", default="29500")
    parser.add_argument("--timings", help="benchmark only: rank 0 writes its print times here")
    parser.add_argument("--print-every", default=100, type=int, help="benchmark only: steps between prints (tiny runs)")
    args = parser.parse_args()
    args.world_size = args.nprocs
    mp.spawn(main_worker, args=(args.nprocs, args), nprocs=args.nprocs)
